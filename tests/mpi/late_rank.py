"""gloo through ``mpi://`` with one rank late, or never there, to see what the waiting ranks say and when.

Usage (under mpirun -n N): python late_rank.py LATE_RANK DELAY_S TIMEOUT_S

Rank LATE_RANK sleeps DELAY_S seconds before anything else (as a rank whose imports wait on a slow shared
filesystem); a negative DELAY_S: it never arrives (sleeps until the launcher ends it). Every rank then initialises
gloo through ``mpi://`` with a TIMEOUT_S process-group timeout (the first thing to start MPI in the process),
all-reduces its rank and prints ``rank R: sum S after T s`` (T: seconds since the rank started, on this machine's
monotonic clock).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

STARTED = time.monotonic()


def main() -> None:
    late_rank, delay_s, timeout_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    if rank == late_rank:
        time.sleep(delay_s if delay_s >= 0 else 3600)
    import torch
    import torch.distributed as dist
    from _setup import mpi  # imports no mpi4py.MPI: MPI starts in the rendezvous

    mpi.register_rendezvous()
    dist.init_process_group("gloo", init_method=mpi.INIT_METHOD, timeout=timedelta(seconds=timeout_s))
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()}: sum {total.item():g} after {time.monotonic() - STARTED:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
