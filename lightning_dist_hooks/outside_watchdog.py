"""A watchdog in a process of its own, for waits in C calls that hold the interpreter lock.

A rank's own threads report progress and end a stuck rendezvous (``process_group.progress``,
``process_group.rendezvous_deadline``), but only while they can run. ``MPI_Init`` of Open MPI (which mpi4py calls when
``mpi4py.MPI`` is first imported) waits for every rank of the job to start, holding Python's interpreter lock: a rank
that starts two minutes late (a slow shared filesystem at import is common) silences every other rank for two
minutes, and one that never starts silences them until the launcher gives up. This watchdog runs beside the rank,
in a small Python process (``python -I -S``: the standard library only, about 10 ms to start), and needs nothing of
the rank's interpreter:

* at each report time it writes a progress line to the rank's stderr (rank 0 only, as the rank's own reports),
  naming the phase the rank waits in, and what the launcher said of this rank (MPI cannot tell which ranks are
  missing before they arrive);
* at the deadline it writes why it ends the rank, then ends it: ``SIGTERM``, and ``SIGKILL`` 2 s later for a rank
  whose C call keeps it from acting on the first. The launcher then ends the job as for any failed rank.

The rank tells it each new phase, and that the wait is over, through a pipe; a rank that exits closes the pipe, and
the watchdog exits too.

    with watched_from_outside(WatchedWait(rank=0, world_size=2, place="mpi://", timeout_s=1800,
                                          report_at=(10, 30), deadline_s=1860, launcher="..."),
                              "MPI's start-up") as watchdog:
        initialise_mpi()
        watchdog.phase("the creation of the mpi:// store")
        create_store()
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

_PREFIX = "[lightning_dist_hooks]"
# How long the watchdog waits, after SIGTERM, before SIGKILL: a rank in a C call acts on SIGTERM only if Python
# installed no handler for it (Lightning does under SLURM), and Python's handlers run only between bytecodes.
_KILL_AFTER_S = 2.0


@dataclass(frozen=True)
class WatchedWait:
    """What the watchdog says, and when: the wait of rank ``rank`` of ``world_size`` through ``place``.

    ``report_at`` and ``deadline_s``: seconds since the wait began; ``launcher``: what the launcher said of this
    rank (its variables), for the lines that cannot name the missing ranks."""

    rank: int | None
    world_size: int | None
    place: str
    timeout_s: float
    report_at: tuple[float, ...]
    deadline_s: float
    launcher: str


class OutsideWatchdog:
    """The rank's end of a running watchdog (see the module's description)."""

    def __init__(self, wait: WatchedWait, first_phase: str) -> None:
        settings = {**asdict(wait), "parent": os.getpid(), "started": time.monotonic(), "phase": first_phase}
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )

    def phase(self, text: str) -> None:
        """The rank waits in ``text`` from now on (named in the lines to come)."""
        self._send({"phase": text})

    def stop(self) -> None:
        """The wait is over: the watchdog exits without a word."""
        self._send({"done": True})
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait()

    def _send(self, message: dict[str, object]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message).encode() + b"\n")
        self._process.stdin.flush()


@contextmanager
def watched_from_outside(wait: WatchedWait, first_phase: str) -> Iterator[OutsideWatchdog | None]:
    """A watchdog for the body's wait, starting in ``first_phase``; stopped when the body ends, however it ends.

    Yields None, after a warning, where no process can be started (a process limit reached, no ``sys.executable``):
    the wait is then watched as before, by the rank's own threads, rather than failing the job for it."""
    try:
        watchdog = OutsideWatchdog(wait, first_phase)
    except OSError as error:
        warnings.warn(
            f"{_PREFIX} could not start the watchdog outside this rank ({error}): while MPI starts, this rank "
            "cannot report nor end itself at the timeout",
            RuntimeWarning,
            stacklevel=3,
        )
        yield None
        return
    try:
        yield watchdog
    finally:
        watchdog.stop()


# --- the watchdog's own process ------------------------------------------------------------------------------------


def progress_line(settings: dict, phase: str, elapsed_s: float) -> str:
    """>>> settings = {"rank": 0, "world_size": 2, "place": "mpi://", "timeout_s": 20.0, "launcher": "mpirun"}
    >>> print(progress_line(settings, "MPI's start-up", 10.02))
    [lightning_dist_hooks] rank 0: waiting for the other ranks of 2 through mpi://, in MPI's start-up, 10 s of 20 s. MPI cannot tell which ranks are missing before they arrive; this rank: mpirun.
    """  # noqa: E501 - one line of output
    return (
        f"{_PREFIX} rank {_shown(settings['rank'])}: waiting for the other ranks of {_shown(settings['world_size'])} "
        f"through {settings['place']}, in {phase}, {elapsed_s:.0f} s of {settings['timeout_s']:.0f} s. MPI cannot "
        f"tell which ranks are missing before they arrive; this rank: {settings['launcher']}."
    )


def stuck_line(settings: dict, phase: str) -> str:
    grace_s = settings["deadline_s"] - settings["timeout_s"]
    return (
        f"{_PREFIX} rank {_shown(settings['rank'])} of {_shown(settings['world_size'])}: the rendezvous through "
        f"{settings['place']} has not returned {grace_s:g} s after its {settings['timeout_s']:g} s timeout; it waits "
        f"in {phase}. MPI cannot tell which ranks are missing before they arrive; this rank: {settings['launcher']}. "
        "Ending this process, so that the launcher ends the job instead of waiting for the rank that never comes. "
        "Check that every rank of the job was started and reaches init_process_group (a rank that waits long in a "
        "slow import is late by as much)."
    )


def _shown(value: int | None) -> str:
    return "?" if value is None else str(value)


def _watch(settings: dict) -> int:
    parent, started, phase = settings["parent"], settings["started"], settings["phase"]
    reports = [at for at in settings["report_at"] if settings["rank"] == 0]
    received = b""
    while True:
        now = time.monotonic() - started
        next_event = min([*reports, settings["deadline_s"]])
        ready, _, _ = select.select([0], [], [], max(0.0, next_event - now))
        if ready:
            chunk = os.read(0, 4096)  # unbuffered: a buffered reader could hold a line select no longer sees
            if not chunk:
                return 0  # the rank exited: nothing left to watch
            *lines, received = (received + chunk).split(b"\n")
            for line in lines:
                message = json.loads(line)
                if message.get("done"):
                    return 0
                phase = message["phase"]
            continue
        if next_event >= settings["deadline_s"]:
            _write(stuck_line(settings, phase))
            _end(parent)
            return 1
        reports.remove(next_event)
        _write(progress_line(settings, phase, time.monotonic() - started))


def _write(line: str) -> None:
    os.write(2, (line + "\n").encode())


def _end(parent: int) -> None:
    """SIGTERM to the rank, then SIGKILL once ``_KILL_AFTER_S`` has passed with the rank still there."""
    os.kill(parent, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_AFTER_S
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.05)
    if os.getppid() == parent:  # still our parent: it did not end on SIGTERM
        os.kill(parent, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(_watch(json.loads(sys.argv[1])))
