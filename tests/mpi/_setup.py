"""Shared by the job scripts in this folder, which run under ``mpirun -n N`` (one process per rank).

Importing this module makes ``lightning_dist_hooks.mpi`` importable without running the package root, which
imports Lightning: that costs seconds per rank on a small machine, and these jobs exercise the backend alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from datetime import timedelta

import torch.distributed as dist

if "lightning_dist_hooks" not in sys.modules:
    # Wherever the package is found (this checkout, or an installed copy under .ci/compat), without running it.
    _package_root = types.ModuleType("lightning_dist_hooks")
    _package_root.__path__ = list(importlib.util.find_spec("lightning_dist_hooks").submodule_search_locations)
    sys.modules["lightning_dist_hooks"] = _package_root

from lightning_dist_hooks import mpi  # needs the package root above
from lightning_dist_hooks.process_group.exit_grace import hand_the_gil_to_backend_threads_at_exit

__all__ = ["init_from_mpi_launch", "mpi"]


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
