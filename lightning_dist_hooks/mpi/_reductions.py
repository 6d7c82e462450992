"""How a torch ``ReduceOp`` on a given dtype maps onto an MPI reduction, with results equal to gloo's.

MPI (Open MPI 4.1) has no float16/bfloat16 datatype and defines only logical operations on booleans, so:

* float16/bfloat16 are reduced in float32 and rounded back once. gloo also computes each pairwise step in
  float32 and rounds, so two ranks agree bitwise; with more ranks ours rounds once where gloo rounds per step.
* bool maps SUM/MAX/BOR to logical or, PRODUCT/MIN/BAND to logical and, BXOR to logical xor (what gloo's
  arithmetic on bytes followed by a cast to bool gives).
* 8- and 16-bit integers are summed and multiplied in int32 and truncated back, which is exactly the
  wrap-around arithmetic of gloo (and torch): Open MPI 4.1's AVX reduction kernels saturate 8/16-bit sums.
* AVG is a SUM followed by a division by the group size. Floating tensors divide in place, in their own dtype,
  like gloo. Integer and bool tensors, which gloo rejects, get ``t.copy_(t / size)`` (truncating), the exact
  expression Lightning applies after its SUM fallback for gloo, so ``sync_dist`` results match gloo's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
from torch.distributed import ReduceOp

_MPI_TYPE_NAMES = {
    torch.float32: "FLOAT",
    torch.float64: "DOUBLE",
    torch.complex64: "C_FLOAT_COMPLEX",
    torch.complex128: "C_DOUBLE_COMPLEX",
    torch.int8: "INT8_T",
    torch.int16: "INT16_T",
    torch.int32: "INT32_T",
    torch.int64: "INT64_T",
    torch.uint8: "UINT8_T",
    torch.uint16: "UINT16_T",
    torch.uint32: "UINT32_T",
    torch.uint64: "UINT64_T",
    torch.bool: "C_BOOL",
}
_REDUCED_IN_FLOAT32 = (torch.float16, torch.bfloat16)
_WRAPPED_IN_INT32 = (torch.int8, torch.uint8, torch.int16, torch.uint16)
_WRAPPING_OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT)

_NUMERIC_OPS = {
    ReduceOp.SUM: "SUM",
    ReduceOp.AVG: "SUM",
    ReduceOp.PRODUCT: "PROD",
    ReduceOp.MIN: "MIN",
    ReduceOp.MAX: "MAX",
    ReduceOp.BAND: "BAND",
    ReduceOp.BOR: "BOR",
    ReduceOp.BXOR: "BXOR",
}
_BOOL_OPS = {
    ReduceOp.SUM: "LOR",
    ReduceOp.AVG: "LOR",
    ReduceOp.MAX: "LOR",
    ReduceOp.BOR: "LOR",
    ReduceOp.PRODUCT: "LAND",
    ReduceOp.MIN: "LAND",
    ReduceOp.BAND: "LAND",
    ReduceOp.BXOR: "LXOR",
}
_BITWISE_OPS = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


@dataclass(frozen=True)
class Reduction:
    """An MPI reduction standing in for a torch one.

    ``compute_dtype`` is the dtype of the buffer MPI reduces; ``finish``, if any, runs on the user's tensor once
    the reduced values are back in it.
    """

    mpi_op: object
    mpi_type: object
    compute_dtype: torch.dtype
    finish: Callable[[torch.Tensor], object] | None


def _averaging(dtype: torch.dtype, group_size: int) -> Callable[[torch.Tensor], object]:
    if dtype.is_floating_point or dtype.is_complex:
        return lambda tensor: tensor.div_(group_size)
    return lambda tensor: tensor.copy_(tensor / group_size)


def reduction_for(mpi: ModuleType, op: ReduceOp | ReduceOp.RedOpType, dtype: torch.dtype, group_size: int) -> Reduction:
    """Return the MPI reduction for ``op`` on ``dtype``; raise ``ValueError`` for what gloo rejects too."""
    return _reduction(mpi, getattr(op, "op", op), dtype, group_size)  # a ReduceOp wraps a hashable RedOpType


@functools.cache  # on every collective's path; few distinct keys per job
def _reduction(mpi: ModuleType, op: ReduceOp.RedOpType, dtype: torch.dtype, group_size: int) -> Reduction:
    if op not in _NUMERIC_OPS:
        raise ValueError(f"The mpi4py backend does not support {op} (gloo does not either).")
    if op in _BITWISE_OPS and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"Cannot use {op} with non-integral dtype {dtype}.")
    if dtype in _REDUCED_IN_FLOAT32:
        compute_dtype = torch.float32
    elif dtype in _WRAPPED_IN_INT32 and op in _WRAPPING_OPS:
        compute_dtype = torch.int32
    else:
        compute_dtype = dtype
    if compute_dtype not in _MPI_TYPE_NAMES:
        raise TypeError(f"The mpi4py backend cannot reduce tensors of dtype {dtype}.")
    op_name = (_BOOL_OPS if dtype == torch.bool else _NUMERIC_OPS)[op]
    return Reduction(
        mpi_op=getattr(mpi, op_name),
        mpi_type=getattr(mpi, _MPI_TYPE_NAMES[compute_dtype]),
        compute_dtype=compute_dtype,
        finish=_averaging(dtype, group_size) if op == ReduceOp.AVG else None,
    )
