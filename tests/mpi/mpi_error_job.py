"""An MPI call that returns an error (here a broadcast from a root outside the group) must end the job at once.

Usage (under mpirun -n 2): python mpi_error_job.py {blocking,queued}. Torch's ``dist.broadcast`` checks the root
first, so the backend is called directly, as a C++ caller could; every rank passes the same invalid root.
``blocking`` broadcasts 4 values on the caller's thread; ``queued`` broadcasts 1 MiB asynchronously, which the
group's queue thread runs, and waits on its future.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _setup import init_from_mpi_launch


def main() -> None:
    init_from_mpi_launch("mpi4py", timeout_s=600)
    options = dist.BroadcastOptions()
    options.rootRank = 7
    queued = sys.argv[1] == "queued"
    options.asyncOp = queued
    tensor = torch.ones((1 << 20) // 4 if queued else 4)
    print(f"broadcasting since {time.time()}", flush=True)
    work = dist.distributed_c10d._get_default_group().broadcast([tensor], options)
    if queued:
        work.get_future().wait()
    print("the broadcast from an invalid root returned", flush=True)


if __name__ == "__main__":
    main()
