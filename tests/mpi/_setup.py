"""Shared by the job scripts in this folder, which run under ``mpirun -n N`` (one process per rank).

Importing this module makes ``lightning_dist_hooks.mpi`` importable without running the package root, which
imports Lightning: that costs seconds per rank on a small machine, and these jobs exercise the backend alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import types
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

if "lightning_dist_hooks" not in sys.modules:
    # Wherever the package is found (this checkout, or an installed copy under .ci/compat), without running it.
    _package_root = types.ModuleType("lightning_dist_hooks")
    _spec = importlib.util.find_spec("lightning_dist_hooks")
    assert _spec is not None and _spec.submodule_search_locations is not None, "lightning_dist_hooks is not importable"
    _package_root.__path__ = list(_spec.submodule_search_locations)
    sys.modules["lightning_dist_hooks"] = _package_root

from lightning_dist_hooks import mpi  # needs the package root above
from lightning_dist_hooks.process_group.exit_grace import hand_the_gil_to_backend_threads_at_exit

__all__ = ["RankReport", "barrier", "init_from_mpi_launch", "mpi", "pause_for_inspection"]

RESUME_TIMEOUT_S = 60.0


class RankReport:
    """The lines one rank reports to its test, in a file of the rank's own: ``DIRECTORY/rank-R.txt``.

    mpirun forwards each rank's output in chunks, not in lines, so two ranks' lines on one stream can cut into each
    other (CI once read ``...bitwise equalrank 1: ...``). A test reads each rank's file; each line is printed too,
    for a person reading the job's output.
    """

    def __init__(self, directory: str, rank: int) -> None:
        self.rank = rank
        self.path = Path(directory) / f"rank-{rank}.txt"

    def line(self, text: str) -> None:
        with self.path.open("a") as file:
            file.write(f"{text}\n")
        print(text, flush=True)


def init_from_mpi_launch(backend: str, timeout_s: float = 60.0) -> tuple[int, int]:
    """Initialise the default process group for ``backend`` with rank/size from the MPI launcher; return them.

    gloo needs a real store: it uses ``tcp://127.0.0.1:$MPI_TEST_PORT``. mpi4py uses the socket-free ``mpi://``.
    """
    launch = mpi.detect_mpi_launch()
    assert launch is not None, "run this script under mpirun"
    # As every rank of our Trainer does: without it a gloo job's rank can abort at exit after a run that completed
    # (torch issue 190489; seen here in ddp_train.py with gloo, 1 run in 3 on the 2-core machine).
    hand_the_gil_to_backend_threads_at_exit()
    timeout = timedelta(seconds=timeout_s)
    if backend == mpi.BACKEND_NAME:
        dist.init_process_group(backend, init_method=mpi.mpi_init_method(), timeout=timeout)
    else:
        init_method = f"tcp://127.0.0.1:{os.environ['MPI_TEST_PORT']}"
        dist.init_process_group(
            backend, init_method=init_method, rank=launch.rank, world_size=launch.world_size, timeout=timeout
        )
    return dist.get_rank(), dist.get_world_size()


def barrier() -> None:
    """Every rank here, through MPI itself (not through a process group or a store under test); sleeps while it
    waits, so that a rank's own threads (a store's service thread) keep the core."""
    done = mpi.init_mpi().COMM_WORLD.Ibarrier()
    while not done.Test():
        time.sleep(0.001)


def pause_for_inspection(pause_dir: Path, rank: int) -> None:
    """Write ``PAUSE_DIR/rank<R>.pid`` (complete when it appears), then wait until ``PAUSE_DIR/resume`` exists (at
    most ``RESUME_TIMEOUT_S``): the test inspects this rank meanwhile (``helpers.run_mpi_job(pause_dir=...)``)."""
    pid_file = pause_dir / f"rank{rank}.pid"
    pid_file.with_suffix(".tmp").write_text(str(os.getpid()))
    pid_file.with_suffix(".tmp").replace(pid_file)
    deadline = time.monotonic() + RESUME_TIMEOUT_S
    while not (pause_dir / "resume").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pause_dir / 'resume'} did not appear within {RESUME_TIMEOUT_S} s")
        time.sleep(0.05)
