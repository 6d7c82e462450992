"""The all-reduce of sparse COO tensors, as gloo does it: every rank gathers every rank's entries and sums them.

DDP sends the gradient of ``nn.Embedding(sparse=True)`` this way. MPI reduces dense buffers only, and ranks hold
different numbers of entries, so it takes two steps, each one collective on the group's usual route:

1. :func:`sparse_sizes_part`: every rank's number of entries (one integer each, ``Allgather``);
2. :func:`sparse_sum_parts`: every rank's indices and values (``Allgatherv`` with those counts), then the sum of all
   of them, coalesced, replaces the caller's tensor, as gloo's result replaces it.

Only ``SUM`` is defined for sparse tensors here, as in gloo.
"""

from __future__ import annotations

import math
from functools import partial
from types import ModuleType

import torch
from torch.distributed import ReduceOp

from lightning_dist_hooks.mpi._buffers import bytes_in_pieces, bytes_of
from lightning_dist_hooks.mpi._operation_names import red_op_type, reduce_op_name
from lightning_dist_hooks.mpi._operation_parts import Part
from lightning_dist_hooks.mpi._operation_records import MpiCall


def check_sparse_allreduce(tensors: list[torch.Tensor], op: ReduceOp) -> None:
    """Reject what gloo rejects too: a reduction other than SUM, a mix of layouts, a tensor off the CPU."""
    if any(tensor.layout is not torch.sparse_coo for tensor in tensors):
        layouts = sorted({str(tensor.layout) for tensor in tensors})
        raise RuntimeError(
            f"allreduce: the mpi4py backend reduces a list of tensors of one layout, got {', '.join(layouts)}. "
            "Reduce the sparse and the dense tensors in separate calls."
        )
    if red_op_type(op) != ReduceOp.SUM:
        raise RuntimeError(
            f"allreduce of a sparse tensor: the mpi4py backend (as gloo) sums sparse tensors only, got "
            f"{reduce_op_name(op)}. Use ReduceOp.SUM, or reduce tensor.to_dense()."
        )
    for tensor in tensors:
        if not tensor.is_cpu:
            raise RuntimeError(
                f"allreduce: the mpi4py backend handles CPU tensors only, got a sparse tensor on {tensor.device}. "
                "Use the nccl or gloo backend for it, or copy it to CPU first."
            )


def sparse_sizes_part(mpi: ModuleType, group_size: int, tensor: torch.Tensor) -> tuple[torch.Tensor, Part]:
    """Step 1 for one tensor: each rank's number of entries (after coalescing) lands in the returned tensor."""
    entries = torch.tensor([tensor.coalesce()._nnz()], dtype=torch.int64)
    counts = torch.empty(group_size, dtype=torch.int64)
    call = MpiCall("Allgather", (bytes_of(mpi, entries), bytes_of(mpi, counts, parts=group_size)), (entries, counts))
    return counts, Part(call)


def sparse_sum_parts(mpi: ModuleType, tensor: torch.Tensor, counts: torch.Tensor) -> list[Part]:
    """Step 2 for one tensor, once ``counts`` holds every rank's number of entries: gather them all; the finishing
    step writes their sum into ``tensor``."""
    own = tensor.coalesce()
    indices = own.indices().t().contiguous()  # one row per entry: each rank's rows follow the previous rank's
    values = own.values().contiguous()
    total = int(counts.sum())
    all_indices = torch.empty((total, own.sparse_dim()), dtype=indices.dtype)
    all_values = torch.empty((total, *values.shape[1:]), dtype=values.dtype)
    index_bytes = own.sparse_dim() * indices.element_size()
    value_bytes = math.prod(values.shape[1:]) * values.element_size()
    per_rank = counts.tolist()
    gather_indices = MpiCall(
        "Allgatherv",
        (bytes_of(mpi, indices), bytes_in_pieces(mpi, all_indices, [count * index_bytes for count in per_rank])),
        (indices, all_indices),
    )
    gather_values = MpiCall(
        "Allgatherv",
        (bytes_of(mpi, values), bytes_in_pieces(mpi, all_values, [count * value_bytes for count in per_rank])),
        (values, all_values),
    )
    return [Part(gather_indices), Part(gather_values, partial(_replace_with_sum, tensor, all_indices, all_values))]


def _replace_with_sum(tensor: torch.Tensor, all_indices: torch.Tensor, all_values: torch.Tensor) -> None:
    summed = torch.sparse_coo_tensor(all_indices.t(), all_values, tensor.shape).coalesce()
    tensor.copy_(summed)
