"""Where the per-call time of a blocking ``dist.all_reduce`` on the mpi4py backend goes, layer by layer.

Run like ``mpi_allreduce.py`` (``mpirun ... -n 2 python benchmarks/mpi_call_layers.py``). In alternating rounds,
on the same sizes: ``dist.all_reduce`` on the backend; the same on a group forced onto the general path (staging
objects, reduction lookup, the path every call took before the direct one); the backend's ``allreduce`` called
without torch's Python wrapper; raw ``comm.Allreduce`` on the same memory. Medians with interquartile ranges.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # mypy checks benchmarks/ as the package; run as a script, its folder is on sys.path instead
    from benchmarks import mpi_allreduce as bench
else:
    try:
        from benchmarks import mpi_allreduce as bench
    except ImportError:  # run as a script
        import mpi_allreduce as bench

GENERAL = "general path"
NO_WRAPPER = "backend without torch's wrapper"
RAW = "raw, same memory"
SIZES = (4 << 10, 64 << 10, 1 << 20)


class _NoDirectTargets(dict):
    """A group's cache of direct allreduce targets that has none: every (op, dtype) takes the general path."""

    def __missing__(self, op_code: int) -> collections.defaultdict:
        return collections.defaultdict(lambda: None)


def layer_runs(
    nbytes: int, comm, ours: dist.ProcessGroup, general: dist.ProcessGroup, options: dist.AllreduceOptions
) -> dict[str, Callable[[], None]]:
    """One blocking all-reduce of ``nbytes`` through each layer; each layer has its own tensor."""
    tensors = [torch.ones(nbytes // 4) for _ in range(4)]
    raw = tensors[3].numpy()
    return {
        bench.OURS: lambda: dist.all_reduce(tensors[0], group=ours),
        GENERAL: lambda: dist.all_reduce(tensors[1], group=general),
        NO_WRAPPER: lambda: ours.allreduce([tensors[2]], options),
        RAW: lambda: comm.Allreduce(bench.MPI.IN_PLACE, raw),
    }


def main() -> None:
    comm = bench.MPI.COMM_WORLD
    torch.set_num_threads(1)
    ours = bench.init_groups(comm)
    general = dist.new_group(backend=bench.mpi.BACKEND_NAME)
    general._direct_targets = _NoDirectTargets()
    options = dist.AllreduceOptions()
    options.asyncOp = False
    load_before = os.getloadavg()
    rows = []
    for nbytes in SIZES:
        runs = layer_runs(nbytes, comm, ours, general, options)
        calls = max(2, min(100, bench.BYTES_PER_ROUND // nbytes))
        rows.append((nbytes, bench.summarize(bench.timed_rounds(comm, runs, calls, 21))))
    if comm.Get_rank() == 0:
        print(f"load average {bench._loads(load_before)} before, {bench._loads(os.getloadavg())} after")
        print(f"| size | {bench.OURS} | {GENERAL} | {NO_WRAPPER} | {RAW} | ours/general | ours/raw |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for nbytes, row in rows:
            times = [
                bench._time_with_iqr(row["median_seconds"][name], row["iqr_seconds"][name])
                for name in (bench.OURS, GENERAL, NO_WRAPPER, RAW)
            ]
            ratios = [bench._ratio_with_iqr(row, name) for name in (GENERAL, RAW)]
            print(f"| {bench.format_size(nbytes)} | {' | '.join(times)} | {' | '.join(ratios)} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
