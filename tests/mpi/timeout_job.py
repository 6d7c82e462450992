"""Rank 0 runs an allreduce that rank 1 skips; the backend's watchdog must end the job after the timeout.

Usage (under mpirun -n 2): python timeout_job.py {blocking,future,queued} TIMEOUT_S

``blocking`` is ``dist.all_reduce`` of 4 values (the blocking MPI call on the caller's thread); ``future`` waits
on the future of the same issued with ``async_op=True`` (DDP's route; so small that it runs on the caller's thread
too); ``queued`` does that with 1 MiB, which the group's queue thread runs. Rank 0 prints ``waiting since <epoch
s>`` just before the allreduce, so the test can time the abort independently of start-up time.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _setup import init_from_mpi_launch

SKIPPING_RANK_SLEEP_S = 120.0


def main() -> None:
    mode, timeout_s = sys.argv[1], float(sys.argv[2])
    rank, _ = init_from_mpi_launch("mpi4py", timeout_s=timeout_s)
    dist.barrier()
    if rank == 1:
        time.sleep(SKIPPING_RANK_SLEEP_S)  # skips the collective; only MPI_Abort from rank 0 ends it early
        return
    print(f"waiting since {time.time()}", flush=True)
    tensor = torch.ones((1 << 20) // 4 if mode == "queued" else 4)
    if mode == "blocking":
        dist.all_reduce(tensor)
    else:
        dist.all_reduce(tensor, async_op=True).get_future().wait()
    print("the allreduce completed although rank 1 skipped it", flush=True)


if __name__ == "__main__":
    main()
