"""The transport's name, and how the watchdog's messages name an operation: ``allreduce(SUM) of float32[1024]``,
``barrier``.

An operation is described only when it timed out or failed, so the process group passes these functions (and their
arguments) along instead of the text: formatting costs more than a small collective.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed import ReduceOp

# The name the transport registers with torch, reports as its backend and prefixes its profiler events with.
BACKEND_NAME = "mpi4py"


def describe_tensors(tensors: Sequence[torch.Tensor]) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)


def describe_barrier() -> str:
    return "barrier"


def red_op_type(op: ReduceOp) -> ReduceOp.RedOpType:
    """Which reduction the ``ReduceOp`` object ``op`` is (``ReduceOp.SUM``, ...)."""
    return op.op  # type: ignore[attr-defined]  # torch's stub omits ReduceOp.op (its RedOpType)


def reduce_op_name(op: ReduceOp) -> str:
    return red_op_type(op).name


def describe_allreduce(op: ReduceOp, tensors: Sequence[torch.Tensor]) -> str:
    return f"allreduce({reduce_op_name(op)}) of {describe_tensors(tensors)}"
