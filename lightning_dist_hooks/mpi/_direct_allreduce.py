"""Which blocking all-reduces skip staging: those MPI reduces in place, in the tensor's own memory and dtype.

``dist.all_reduce(t)`` of metrics, ``sync_dist`` and DDP's buckets is the transport's most frequent call. For a
contiguous CPU tensor whose (op, dtype) MPI reduces as is, the process group hands MPI the tensor's memory with the
:class:`DirectTarget` found here, once per (op, dtype) and group, and skips the staging objects of the general
path. float16, bfloat16 and 8/16-bit sums, reduced in a wider type, and what the general path rejects have none.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import torch
from torch.distributed import ReduceOp

from lightning_dist_hooks.mpi._reductions import reduction_for


class DirectTarget(NamedTuple):
    """How a blocking allreduce reduces a tensor of one (op, dtype) in place: MPI's type and op, then ``finish``."""

    mpi_type: object
    mpi_op: object
    finish: Callable[[torch.Tensor], object] | None  # AVG's division


def direct_target(mpi: ModuleType, op: ReduceOp, dtype: torch.dtype, size: int) -> DirectTarget | None:
    try:
        reduction = reduction_for(mpi, op, dtype, size)
    except (TypeError, ValueError):  # the general path raises them with the operation's name
        return None
    if reduction.compute_dtype != dtype:  # float16, bfloat16, 8/16-bit sums: staged in a wider type
        return None
    return DirectTarget(reduction.mpi_type, reduction.mpi_op, reduction.finish)
