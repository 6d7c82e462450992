"""Ranks 0 and 1 wait in the ``mpi://`` store for rank 2, which never comes: the wait ends with the store's timeout
and an error naming the keys and rank 2.

Usage (under mpirun -n 3): python store_missing_rank.py REPORT_DIR GROUP_TIMEOUT_S

gloo's default group meets through ``mpi://`` (an ``MpiStore``). Then ranks 0 and 1 wait 2 s on a store key that
nobody sets (``store.wait``), and create a gloo group of all three ranks with a GROUP_TIMEOUT_S timeout while rank
2 sleeps: gloo's rendezvous waits for rank 2's address in the store, the store times out, and the unhandled error
ends the job (``MPI_Abort``). Each rank reports (``_setup.RankReport``) ``rank R: store wait failed after S s:
TYPE: MESSAGE``, ``rank R: new_group since EPOCH_S``, ``rank R: new_group failed after S s: TYPE: MESSAGE``; rank 2
``rank 2: sleeping``. A line ``... completed`` means something that had to fail did not.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _setup import RankReport, mpi

STORE_WAIT_S = 2.0
ABSENT_RANK_SLEEP_S = 120.0  # only MPI_Abort from ranks 0 and 1 ends it early


def main() -> None:
    report_dir, group_timeout_s = sys.argv[1], float(sys.argv[2])
    dist.init_process_group("gloo", init_method=mpi.mpi_init_method(), timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    report = RankReport(report_dir, rank)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)  # the default group works: every rank is here
    report.line(f"rank {rank}: default group all-reduce {total.item():g}")
    if rank == 2:
        report.line("rank 2: sleeping")
        time.sleep(ABSENT_RANK_SLEEP_S)  # its store service thread still answers for the keys it keeps
        return

    store = dist.distributed_c10d._get_default_store()
    started = time.monotonic()
    try:
        store.wait(["never-set"], timedelta(seconds=STORE_WAIT_S))
        report.line(f"rank {rank}: store wait completed")
    except Exception as error:
        report.line(
            f"rank {rank}: store wait failed after {time.monotonic() - started:.3f} s: {type(error).__name__}: {error}"
        )

    report.line(f"rank {rank}: new_group since {time.time()}")
    started = time.monotonic()
    try:
        dist.new_group([0, 1, 2], backend="gloo", timeout=timedelta(seconds=group_timeout_s))
    except Exception as error:
        report.line(
            f"rank {rank}: new_group failed after {time.monotonic() - started:.3f} s: {type(error).__name__}: {error}"
        )
        raise  # unhandled: ends the job with MPI_Abort
    report.line(f"rank {rank}: new_group completed")


if __name__ == "__main__":
    main()
