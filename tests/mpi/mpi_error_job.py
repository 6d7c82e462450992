"""An MPI call that returns an error (here a broadcast from a root outside the group) must end the job at once.

Usage (under mpirun -n 2): python mpi_error_job.py. Torch's ``dist.broadcast`` checks the root first, so the
backend is called directly, as a C++ caller could; every rank passes the same invalid root.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from _setup import init_from_mpi_launch


def main() -> None:
    init_from_mpi_launch("mpi4py", timeout_s=600)
    options = dist.BroadcastOptions()
    options.rootRank = 7
    options.asyncOp = False
    print(f"broadcasting since {time.time()}", flush=True)
    dist.distributed_c10d._get_default_group().broadcast([torch.ones(4)], options)
    print("the broadcast from an invalid root returned", flush=True)


if __name__ == "__main__":
    main()
