"""What the transport's profiler events cost a job that runs no profiler: its blocking calls, with and without the
check that decides whether to record an event.

Run like ``mpi_allreduce.py`` (``mpirun ... -n 2 python benchmarks/mpi_profiler_cost.py``). In alternating rounds,
on two groups of the transport: ``as shipped``, and ``without the check``, a group whose routing is the same but
never asks whether a profiler runs (the code before the events existed). A blocking ``dist.all_reduce`` of one
float32 and of 4 KiB (the calls Lightning's ``sync_dist`` makes, where a fixed cost shows most) and a
``dist.barrier()``. Medians with interquartile ranges; the ratio is per round.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from lightning_dist_hooks.mpi._process_group import MpiProcessGroup
from lightning_dist_hooks.mpi._routed_group import EAGER_COLLECTIVE_BYTES

if TYPE_CHECKING:  # mypy checks benchmarks/ as the package; run as a script, its folder is on sys.path instead
    from benchmarks import mpi_allreduce as bench
else:
    try:
        from benchmarks import mpi_allreduce as bench
    except ImportError:  # run as a script
        import mpi_allreduce as bench

SHIPPED = bench.OURS
UNCHECKED = "without the check"


class WithoutProfilerCheck(MpiProcessGroup):
    """The transport's group routing as before it recorded profiler events: ``_runs_here`` without the check."""

    def _runs_here(self, opts, payload_bytes: int) -> bool:
        wanted_here = (opts is not None and not opts.asyncOp) or payload_bytes <= EAGER_COLLECTIVE_BYTES
        return wanted_here and self._collectives.is_idle()


def calls_on(group: dist.ProcessGroup) -> dict[str, Callable[[], object]]:
    one, four_kib = torch.ones(1), torch.ones(1024)
    return {
        "all_reduce 4 B": lambda: dist.all_reduce(one, group=group),
        "all_reduce 4 KiB": lambda: dist.all_reduce(four_kib, group=group),
        "barrier": lambda: dist.barrier(group=group),
    }


def main() -> None:
    comm = bench.MPI.COMM_WORLD
    torch.set_num_threads(1)
    shipped = bench.init_groups(comm)
    unchecked = dist.new_group(backend=bench.mpi.BACKEND_NAME)
    unchecked.__class__ = WithoutProfilerCheck  # same state, the routing method of before
    load_before = os.getloadavg()
    rows = []
    shipped_calls, unchecked_calls = calls_on(shipped), calls_on(unchecked)
    for call in shipped_calls:
        runs = {SHIPPED: shipped_calls[call], UNCHECKED: unchecked_calls[call]}
        rows.append((call, bench.summarize(bench.timed_rounds(comm, runs, 2000, 21))))
    if comm.Get_rank() == 0:
        print(f"load average {bench._loads(load_before)} before, {bench._loads(os.getloadavg())} after")
        print(f"| call | {SHIPPED} | {UNCHECKED} | {UNCHECKED} / {SHIPPED} |")
        print("|---|---:|---:|---:|")
        for call, row in rows:
            times = [bench._time_with_iqr(row["median_seconds"][name], row["iqr_seconds"][name])
                     for name in (SHIPPED, UNCHECKED)]  # fmt: skip
            print(f"| {call} | {' | '.join(times)} | {bench._ratio_with_iqr(row, UNCHECKED)} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
