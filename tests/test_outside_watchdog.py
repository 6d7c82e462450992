"""The watchdog outside a rank (``lightning_dist_hooks.outside_watchdog``): it speaks and ends the rank while a C call
holds the rank's interpreter lock, names the phase the rank last entered, and says nothing when the wait ends in
time. The rank here is a Python process that calls libc's ``sleep`` through ``ctypes.PyDLL``, which keeps the lock
for the whole call, as Open MPI's ``MPI_Init`` does under mpi4py.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from helpers import job_environment

RANK = """
import ctypes, sys, time
from lightning_dist_hooks.outside_watchdog import WatchedWait, watched_from_outside
wait = WatchedWait(rank=0, world_size=2, place="test://", timeout_s=2.0, report_at=(1.0,), deadline_s=3.0,
                   launcher="TEST_RANK=0")
with watched_from_outside(wait, "the first phase") as watchdog:
    watchdog.phase("a C call that holds the lock")
    ctypes.PyDLL(None).sleep(int(sys.argv[1]))   # the interpreter lock is held throughout
print("the wait ended", flush=True)
time.sleep(3.5)   # past the deadline: a watchdog left running would end this process now
print("still here", flush=True)
"""


def run_rank(sleep_s: int) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    finished = subprocess.run([sys.executable, "-c", RANK, str(sleep_s)], env=job_environment(), capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    return finished, time.monotonic() - began


@pytest.mark.slow
def test_a_rank_held_in_a_c_call_is_reported_then_ended_at_the_deadline_naming_its_phase() -> None:
    finished, _ = run_rank(sleep_s=30)
    assert finished.returncode == -15, finished  # SIGTERM: Python installed no handler, so it ended at once
    lines = finished.stderr.splitlines()
    assert lines[0].startswith(
        "[lightning_dist_hooks] rank 0: waiting for the other ranks of 2 through test://, in a C call that holds the "
        "lock, 1 s of 2 s. MPI cannot tell which ranks are missing before they arrive; this rank: TEST_RANK=0."
    ), finished.stderr
    assert lines[1].startswith(
        "[lightning_dist_hooks] rank 0 of 2: the rendezvous through test:// has not returned 1 s after its 2 s "
        "timeout; it waits in a C call that holds the lock."
    ), finished.stderr
    assert "the wait ended" not in finished.stdout


@pytest.mark.slow
def test_a_wait_that_ends_in_time_hears_nothing_from_the_watchdog_which_is_gone() -> None:
    finished, elapsed_s = run_rank(sleep_s=0)
    assert finished.returncode == 0, finished
    assert finished.stdout.splitlines() == ["the wait ended", "still here"]
    assert "lightning_dist_hooks" not in finished.stderr
    assert elapsed_s < 30


@pytest.mark.unit
def test_a_watchdog_that_cannot_start_warns_and_leaves_the_wait_to_the_ranks_own_threads(monkeypatch):
    from lightning_dist_hooks import outside_watchdog

    def no_process(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(outside_watchdog.subprocess, "Popen", no_process)
    wait = outside_watchdog.WatchedWait(
        rank=0, world_size=2, place="test://", timeout_s=1.0, report_at=(), deadline_s=2.0, launcher="TEST_RANK=0"
    )
    with (
        pytest.warns(RuntimeWarning, match=r"could not start the watchdog outside this rank \(\[Errno 11\]"),
        outside_watchdog.watched_from_outside(wait, "a phase") as watchdog,
    ):
        assert watchdog is None
