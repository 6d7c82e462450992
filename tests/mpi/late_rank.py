"""gloo through ``mpi://`` with one rank late, or never there, to see what the waiting ranks say and when.

Usage (under mpirun -n N): python late_rank.py LATE_RANK DELAY_S TIMEOUT_S WAITING_FILE

Rank 0 creates WAITING_FILE as it begins to wait. Rank LATE_RANK arrives DELAY_S seconds after that (as a rank whose
imports wait on a slow shared filesystem): counted from rank 0's wait, not from the ranks' start, so that rank 0 waits
that long however long each rank's imports take on a busy machine. A negative DELAY_S: it never arrives (sleeps until
the launcher ends it). Every rank initialises gloo through ``mpi://`` with a TIMEOUT_S process-group timeout (the
first thing to start MPI in the process),
all-reduces its rank and prints ``rank R: sum S after T s`` (T: seconds since the rank started, on this machine's
monotonic clock).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

STARTED = time.monotonic()


def main() -> None:
    late_rank, delay_s, timeout_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    waiting_file = Path(sys.argv[4])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    import torch
    import torch.distributed as dist
    from _setup import mpi  # imports no mpi4py.MPI: MPI starts in the rendezvous

    mpi.register_rendezvous()
    if rank == 0:
        waiting_file.touch()
    if rank == late_rank:
        if delay_s < 0:
            time.sleep(3600)
        while not waiting_file.exists():
            time.sleep(0.05)
        time.sleep(delay_s)
    dist.init_process_group("gloo", init_method=mpi.INIT_METHOD, timeout=timedelta(seconds=timeout_s))
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()}: sum {total.item():g} after {time.monotonic() - STARTED:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
