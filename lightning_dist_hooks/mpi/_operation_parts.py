"""How each operation's tensors become MPI calls: its parts, each one MPI call and the step that finishes it.

A torch operation becomes one :class:`Part` per MPI call. The call reads and writes contiguous buffers of the dtype
MPI works in (the user's tensors themselves where they fit, else staging copies, see ``_buffers``); its ``finish``
copies results back into the user's tensors, splits a gathered buffer into the output list, or divides an average.
The builders here check the tensors and translate them; the process group reads torch's options, names the
operation and runs its parts' calls, then their finishing steps, on one of its routes (``_routed_group``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch.distributed import ReduceOp

from lightning_dist_hooks.mpi._argument_checks import check_multiple, check_same_size, check_tag
from lightning_dist_hooks.mpi._buffers import (
    bytes_in_pieces,
    bytes_of,
    copy_back,
    require_cpu_tensor,
    staged_copy,
    staged_output,
    values_of,
)
from lightning_dist_hooks.mpi._operation_names import describe_tensors
from lightning_dist_hooks.mpi._operation_records import MpiCall
from lightning_dist_hooks.mpi._reductions import Reduction, reduction_for

if TYPE_CHECKING:
    from mpi4py import MPI


class Part(NamedTuple):
    """One MPI call of an operation and what to do with its result (copy back, average) once it completes."""

    call: MpiCall
    finish: Callable[[], object] | None = None


def finish_all(parts: Sequence[Part]) -> Callable[[], None] | None:
    finishes = [part.finish for part in parts if part.finish is not None]
    if not finishes:
        return None

    def finish() -> None:
        for step in finishes:
            step()

    return finish


def broadcast_parts(mpi: ModuleType, rank: int, tensors: list[torch.Tensor], root: int) -> list[Part]:
    parts = []
    for tensor in tensors:
        require_cpu_tensor(tensor, "broadcast")
        staged = staged_copy(tensor) if root == rank else staged_output(tensor)
        call = MpiCall("Bcast", (bytes_of(mpi, staged), root), (staged,))
        parts.append(Part(call, _copy_back_finish(staged, tensor)))
    return parts


def allreduce_part(mpi: ModuleType, group_size: int, tensor: torch.Tensor, op: ReduceOp) -> Part:
    require_cpu_tensor(tensor, "allreduce")
    reduction = reduction_for(mpi, op, tensor.dtype, group_size)
    staged = staged_copy(tensor, reduction.compute_dtype)
    args = (mpi.IN_PLACE, values_of(mpi, staged, reduction.mpi_type), reduction.mpi_op)
    return Part(MpiCall("Allreduce", args, (staged,)), _reduction_finish(staged, tensor, reduction))


def allgather_parts(
    mpi: ModuleType, group_size: int, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor]
) -> list[Part]:
    parts = []
    for outputs, tensor in zip(output_lists, inputs, strict=True):
        check_same_size(outputs, tensor, group_size, "allgather")
        send = staged_copy(tensor)
        gathered = torch.empty((group_size, *tensor.shape), dtype=tensor.dtype)
        args = (bytes_of(mpi, send), bytes_of(mpi, gathered, parts=group_size))
        parts.append(Part(MpiCall("Allgather", args, (send, gathered)), partial(_copy_pieces, gathered, outputs)))
    return parts


def all_gather_single_part(mpi: ModuleType, group_size: int, output: torch.Tensor, tensor: torch.Tensor) -> Part:
    check_multiple(output, tensor, group_size, "all_gather_into_tensor")
    send, received = staged_copy(tensor), staged_output(output)
    args = (bytes_of(mpi, send), bytes_of(mpi, received, parts=group_size))
    return Part(MpiCall("Allgather", args, (send, received)), _copy_back_finish(received, output))


def gather_part(
    mpi: ModuleType,
    rank: int,
    group_size: int,
    output_lists: list[list[torch.Tensor]],
    tensor: torch.Tensor,
    root: int,
) -> tuple[list[torch.Tensor], Part]:
    """The outputs (the root's list, none on the other ranks) and the one part of a gather."""
    require_cpu_tensor(tensor, "gather")
    send = staged_copy(tensor)
    if rank != root:
        return [], Part(MpiCall("Gather", (bytes_of(mpi, send), None, root), (send,)))
    (outputs,) = output_lists
    check_same_size(outputs, tensor, group_size, "gather")
    gathered = torch.empty((group_size, *tensor.shape), dtype=tensor.dtype)
    args = (bytes_of(mpi, send), bytes_of(mpi, gathered, parts=group_size), root)
    return outputs, Part(MpiCall("Gather", args, (send, gathered)), partial(_copy_pieces, gathered, outputs))


def scatter_part(
    mpi: ModuleType,
    rank: int,
    group_size: int,
    output: torch.Tensor,
    input_lists: list[list[torch.Tensor]],
    root: int,
) -> Part:
    require_cpu_tensor(output, "scatter")
    received = staged_output(output)
    send_spec: list | None = None
    keep: tuple[torch.Tensor, ...] = (received,)
    if rank == root:
        (inputs,) = input_lists
        check_same_size(inputs, output, group_size, "scatter")
        packed = torch.stack([tensor.reshape(output.shape) for tensor in inputs])
        send_spec, keep = bytes_of(mpi, packed, parts=group_size), (received, packed)
    call = MpiCall("Scatter", (send_spec, bytes_of(mpi, received), root), keep)
    return Part(call, _copy_back_finish(received, output))


def reduce_part(mpi: ModuleType, rank: int, group_size: int, tensor: torch.Tensor, op: ReduceOp, root: int) -> Part:
    require_cpu_tensor(tensor, "reduce")
    reduction = reduction_for(mpi, op, tensor.dtype, group_size)
    staged = staged_copy(tensor, reduction.compute_dtype)
    values = values_of(mpi, staged, reduction.mpi_type)
    if rank == root:
        args = (mpi.IN_PLACE, values, reduction.mpi_op, root)
        return Part(MpiCall("Reduce", args, (staged,)), _reduction_finish(staged, tensor, reduction))
    # only the root's tensor receives the result
    return Part(MpiCall("Reduce", (values, None, reduction.mpi_op, root), (staged,)))


def reduce_scatter_part(
    mpi: ModuleType, group_size: int, output: torch.Tensor, inputs: list[torch.Tensor], op: ReduceOp
) -> Part:
    require_cpu_tensor(output, "reduce_scatter")
    check_same_size(inputs, output, group_size, "reduce_scatter")
    reduction = reduction_for(mpi, op, output.dtype, group_size)
    packed = torch.empty((group_size, *output.shape), dtype=reduction.compute_dtype)
    for piece, tensor in zip(packed, inputs, strict=True):
        piece.copy_(tensor.reshape(output.shape))
    return _reduce_scatter_packed_part(mpi, group_size, output, packed, reduction)


def reduce_scatter_single_part(
    mpi: ModuleType, group_size: int, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp
) -> Part:
    check_multiple(tensor, output, group_size, "reduce_scatter_tensor")
    reduction = reduction_for(mpi, op, output.dtype, group_size)
    return _reduce_scatter_packed_part(mpi, group_size, output, staged_copy(tensor, reduction.compute_dtype), reduction)


def all_to_all_single_part(
    mpi: ModuleType,
    group_size: int,
    output: torch.Tensor,
    input_tensor: torch.Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
) -> Part:
    require_cpu_tensor(output, "all_to_all_single")
    require_cpu_tensor(input_tensor, "all_to_all_single")
    send, received = staged_copy(input_tensor), staged_output(output)
    if not output_split_sizes and not input_split_sizes:
        if input_tensor.numel() != output.numel() or input_tensor.numel() % group_size:
            raise ValueError(
                "all_to_all_single without split sizes needs input and output of equal size divisible by the "
                f"group size {group_size}, got {describe_tensors([input_tensor, output])}."
            )
        args = (bytes_of(mpi, send, parts=group_size), bytes_of(mpi, received, parts=group_size))
        call = MpiCall("Alltoall", args, (send, received))
    else:
        args = (
            bytes_in_pieces(mpi, send, _split_bytes(input_tensor, input_split_sizes, group_size)),
            bytes_in_pieces(mpi, received, _split_bytes(output, output_split_sizes, group_size)),
        )
        call = MpiCall("Alltoallv", args, (send, received))
    return Part(call, _copy_back_finish(received, output))


def alltoall_part(mpi: ModuleType, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> Part:
    for tensor in (*outputs, *inputs):
        require_cpu_tensor(tensor, "alltoall")
    send = torch.cat([tensor.reshape(-1) for tensor in inputs])
    received = torch.empty(sum(tensor.numel() for tensor in outputs), dtype=send.dtype)
    args = (
        bytes_in_pieces(mpi, send, [t.numel() * t.element_size() for t in inputs]),
        bytes_in_pieces(mpi, received, [t.numel() * t.element_size() for t in outputs]),
    )
    return Part(MpiCall("Alltoallv", args, (send, received)), partial(_copy_pieces, received, outputs))


def send_parts(mpi: ModuleType, comm: MPI.Comm, tensors: list[torch.Tensor], destination: int, tag: int) -> list[Part]:
    check_tag(mpi, comm, tag)
    parts = []
    for tensor in tensors:
        require_cpu_tensor(tensor, "send")
        staged = staged_copy(tensor)
        parts.append(Part(MpiCall("Send", (bytes_of(mpi, staged), destination, tag), (staged,))))
    return parts


def recv_parts(mpi: ModuleType, comm: MPI.Comm, tensors: list[torch.Tensor], source: int, tag: int) -> list[Part]:
    check_tag(mpi, comm, tag)
    parts = []
    for tensor in tensors:
        require_cpu_tensor(tensor, "recv")
        staged = staged_output(tensor)
        call = MpiCall("Recv", (bytes_of(mpi, staged), source, tag), (staged,))
        parts.append(Part(call, _copy_back_finish(staged, tensor)))
    return parts


def _reduce_scatter_packed_part(
    mpi: ModuleType, group_size: int, output: torch.Tensor, packed: torch.Tensor, reduction: Reduction
) -> Part:
    received = staged_output(output, reduction.compute_dtype)
    args = (
        values_of(mpi, packed, reduction.mpi_type, parts=group_size),  # mpi4py: count per rank
        values_of(mpi, received, reduction.mpi_type),
        reduction.mpi_op,
    )
    finish = _reduction_finish(received, output, reduction)
    return Part(MpiCall("Reduce_scatter_block", args, (packed, received)), finish)


def _copy_back_finish(staged: torch.Tensor, tensor: torch.Tensor) -> Callable[[], None] | None:
    return None if staged is tensor else partial(copy_back, staged, tensor)


def _reduction_finish(staged: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> Callable[[], None] | None:
    if staged is tensor and reduction.finish is None:
        return None

    def finish() -> None:
        copy_back(staged, tensor)
        if reduction.finish is not None:
            reduction.finish(tensor)

    return finish


def _copy_pieces(source: torch.Tensor, targets: Sequence[torch.Tensor]) -> None:
    offset = 0
    flat = source.reshape(-1)
    for target in targets:
        target.copy_(flat[offset : offset + target.numel()].view(target.shape))
        offset += target.numel()


def _split_bytes(tensor: torch.Tensor, split_sizes: list[int], group_size: int) -> list[int]:
    """The bytes of each rank's piece of ``tensor``: ``split_sizes`` rows each, or equal shares if none given."""
    rows = list(split_sizes) or [tensor.shape[0] // group_size] * group_size
    return [rows_count * _row_bytes(tensor) for rows_count in rows]


def _row_bytes(tensor: torch.Tensor) -> int:
    return tensor[0].numel() * tensor.element_size() if tensor.dim() and tensor.shape[0] else 0
