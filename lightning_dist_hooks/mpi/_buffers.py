"""Zero-copy mpi4py buffer specifications for CPU tensors, and staging copies where zero-copy is impossible."""

from __future__ import annotations

from types import ModuleType

import torch


def require_cpu_tensor(tensor: torch.Tensor, operation: str) -> None:
    """Reject what MPI cannot address directly: device memory and non-strided layouts."""
    if tensor.is_cpu and tensor.layout is torch.strided:  # checked on every collective: the cheap test first
        return
    if not tensor.is_cpu:
        raise RuntimeError(
            f"{operation}: the mpi4py backend handles CPU tensors only, got a tensor on {tensor.device}. "
            f"Use the nccl (or gloo) backend for {tensor.device.type} tensors, or copy the tensor to CPU first."
        )
    if tensor.layout != torch.strided:
        raise RuntimeError(f"{operation}: the mpi4py backend handles dense tensors only, got layout {tensor.layout}.")


def staged_copy(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Return ``tensor`` itself if MPI can use its memory as is, else a contiguous copy in ``dtype``."""
    dtype = dtype or tensor.dtype
    if tensor.is_contiguous() and tensor.dtype == dtype:
        return tensor
    return torch.empty(tensor.shape, dtype=dtype).copy_(tensor)


def staged_output(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Like :func:`staged_copy` for a buffer MPI only writes: a fresh copy needs no initial values."""
    dtype = dtype or tensor.dtype
    if tensor.is_contiguous() and tensor.dtype == dtype:
        return tensor
    return torch.empty(tensor.shape, dtype=dtype)


def copy_back(staged: torch.Tensor, tensor: torch.Tensor) -> None:
    """Copy results from a staging buffer into the user's tensor (rounding back to its dtype)."""
    if staged is not tensor:
        tensor.copy_(staged.view(tensor.shape))


def bytes_of(mpi: ModuleType, contiguous: torch.Tensor, parts: int = 1) -> list:
    """Buffer spec moving ``contiguous`` as raw bytes, split evenly in ``parts`` (the per-rank count MPI wants
    for the gathered/scattered side of Allgather, Gather, Scatter and Alltoall)."""
    nbytes = contiguous.numel() * contiguous.element_size()
    return [mpi.buffer.fromaddress(contiguous.data_ptr(), nbytes), nbytes // parts, mpi.BYTE]


def values_of(mpi: ModuleType, contiguous: torch.Tensor, mpi_type: object, parts: int = 1) -> list:
    """Buffer spec of ``contiguous`` as ``mpi_type`` elements, split evenly in ``parts`` (see :func:`bytes_of`)."""
    count = contiguous.numel()
    memory = mpi.buffer.fromaddress(contiguous.data_ptr(), count * contiguous.element_size())
    return [memory, count // parts, mpi_type]


def bytes_in_pieces(mpi: ModuleType, contiguous: torch.Tensor, piece_bytes: list[int]) -> list:
    """Vector buffer spec: consecutive pieces of the given byte sizes (Alltoallv)."""
    offsets = [sum(piece_bytes[:index]) for index in range(len(piece_bytes))]
    memory = mpi.buffer.fromaddress(contiguous.data_ptr(), contiguous.numel() * contiguous.element_size())
    return [memory, (piece_bytes, offsets), mpi.BYTE]
