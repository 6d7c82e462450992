"""A rank late to ``mpi://``, or never there (issue 35): the waiting rank reports while MPI's start-up holds Python's
interpreter lock, and the job ends at the timeout plus its grace, naming the phase (tests/mpi/late_rank.py).

Open MPI's ``MPI_Init`` waits for every rank of the job with the lock held, so only the watchdog outside the process
(``lightning_dist_hooks.outside_watchdog``) can speak meanwhile. Both jobs only wait: they run side by side.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import MpiJob, run_mpi_job
from test_mpi_store import needs_mpi_store

from lightning_dist_hooks.mpi._rendezvous import MPI_START_UP

TIMEOUT_S = 20  # the process group's; the rendezvous may take 10 s more (wait_schedule.grace_s), then ends
LATE_S = 12  # after rank 0 begins to wait: past its first report (10 s), within the timeout


def timed_job(*args: str) -> tuple[float, MpiJob]:
    began = time.monotonic()
    job = run_mpi_job("late_rank.py", *args, timeout_s=120)
    return time.monotonic() - began, job


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
def test_a_late_rank_is_reported_while_mpi_starts_and_a_missing_one_ends_the_job_naming_the_phase(tmp_path) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        late = pool.submit(timed_job, "1", str(LATE_S), str(TIMEOUT_S), str(tmp_path / "late-waits"))
        never = pool.submit(timed_job, "1", "-1", str(TIMEOUT_S), str(tmp_path / "never-waits"))
        (_, late_job), (never_s, never_job) = late.result(), never.result()

    # Late: rank 0 said at 10 s that it waits in MPI's start-up, with what the launcher told it; then both trained.
    progress = f"rank 0: waiting for the other ranks of 2 through mpi://, in {MPI_START_UP}, 10 s of {TIMEOUT_S} s"
    assert late_job.returncode == 0, late_job.output[-4000:]
    assert progress in late_job.output
    assert "MPI cannot tell which ranks are missing before they arrive; this rank: OMPI_COMM_WORLD_RANK=0" in (
        late_job.output
    )
    assert all(f"rank {rank}: sum 1 after" in late_job.output for rank in (0, 1)), late_job.output[-4000:]
    assert "has not returned" not in late_job.output

    # Never: the same report, then at the timeout plus 10 s the rank ends itself naming the phase, and the job ends.
    assert never_job.returncode != 0
    assert progress in never_job.output
    stuck = f"rank 0 of 2: the rendezvous through mpi:// has not returned 10 s after its {TIMEOUT_S} s timeout; it waits in {MPI_START_UP}"  # noqa: E501
    assert stuck in never_job.output, never_job.output[-4000:]
    assert "OMPI_COMM_WORLD_SIZE=2" in never_job.output and ": sum " not in never_job.output
    # 30 s of waiting, plus the ranks' start (torch's import) and mpirun's end of the job, on 2 busy cores.
    assert TIMEOUT_S + 10 <= never_s < TIMEOUT_S + 10 + 30, never_s
