"""The checks of an operation's arguments made before MPI sees them: one tensor per rank in a list, one piece per
rank in a whole tensor, a message tag MPI accepts.

A mismatch is a ``ValueError`` naming the operation, raised on the calling rank. Passed on, MPI would read or write
as many bytes as it is told to, or fail with an MPI error, which ends the whole job.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

import torch

from lightning_dist_hooks.mpi._buffers import require_cpu_tensor

if TYPE_CHECKING:
    from mpi4py import MPI


def check_same_size(tensors: Sequence[torch.Tensor], like: torch.Tensor, count: int, operation: str) -> None:
    if len(tensors) != count:
        raise ValueError(f"{operation}: expected a list of {count} tensors (one per rank), got {len(tensors)}.")
    for tensor in tensors:
        require_cpu_tensor(tensor, operation)
        if tensor.numel() != like.numel() or tensor.dtype != like.dtype:
            raise ValueError(
                f"{operation}: every tensor must match {like.dtype}{list(like.shape)}, got "
                f"{tensor.dtype}{list(tensor.shape)}."
            )


def check_multiple(total: torch.Tensor, piece: torch.Tensor, count: int, operation: str) -> None:
    require_cpu_tensor(total, operation)
    require_cpu_tensor(piece, operation)
    if total.numel() != count * piece.numel() or total.dtype != piece.dtype:
        raise ValueError(
            f"{operation}: the whole tensor must hold {count} x {piece.dtype}{list(piece.shape)}, got "
            f"{total.dtype}{list(total.shape)}."
        )


def check_tag(mpi: ModuleType, comm: MPI.Comm, tag: int) -> None:
    upper_bound = cast(int, comm.Get_attr(mpi.TAG_UB))  # MPI always sets TAG_UB
    if not 0 <= tag <= upper_bound:
        raise ValueError(f"MPI message tags must lie in [0, {upper_bound}], got {tag}.")
