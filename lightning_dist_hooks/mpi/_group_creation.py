"""The backend creator torch calls for every new ``"mpi4py"`` group: its communicator, checked against torch's view.

torch hands the creator the rank and size it expects; MPI decides them. The default group duplicates
``COMM_WORLD``, a subgroup gets a communicator of its members only, and a rank or size on which the two disagree
is a ``RuntimeError`` naming both, raised before any collective could hang on it.
"""

from __future__ import annotations

import zlib
from types import ModuleType
from typing import TYPE_CHECKING

import torch.distributed as dist

from lightning_dist_hooks.mpi._engine import ProgressEngine
from lightning_dist_hooks.mpi._mpi import init_mpi
from lightning_dist_hooks.mpi._process_group import MpiProcessGroup

if TYPE_CHECKING:
    from mpi4py import MPI


def _communicator(mpi: ModuleType, options: dist.distributed_c10d._DistributedBackendOptions) -> tuple[MPI.Comm, str]:
    world = mpi.COMM_WORLD
    ranks = list(options.global_ranks_in_group)
    if not ranks:  # the default group: every rank of the job is creating it
        if (options.group_rank, options.group_size) != (world.Get_rank(), world.Get_size()):
            raise RuntimeError(
                f"init_process_group(rank={options.group_rank}, world_size={options.group_size}) does not match "
                f"MPI (rank {world.Get_rank()} of {world.Get_size()}). Start every rank with mpirun/mpiexec and "
                "let the rank and world size come from MPI (init_method=mpi_init_method())."
            )
        return world.Dup(), "the default process group"
    if (dist.get_rank(), dist.get_world_size()) != (world.Get_rank(), world.Get_size()):
        raise RuntimeError(
            f"Subgroups of the mpi4py backend need torch's global rank ({dist.get_rank()} of "
            f"{dist.get_world_size()}) to equal the MPI rank ({world.Get_rank()} of {world.Get_size()})."
        )
    # new_group() runs only on members, so use the constructor that only members call; members pass equal tags.
    world_group = world.Get_group()
    try:
        member_group = world_group.Incl(ranks)
        tag = zlib.crc32(",".join(map(str, ranks)).encode()) % 32768
        comm = world.Create_group(member_group, tag)
        member_group.Free()
    finally:
        world_group.Free()
    return comm, f"the process group of global ranks {ranks}"


def new_mpi_process_group(
    options: dist.distributed_c10d._DistributedBackendOptions, backend_options: object = None
) -> MpiProcessGroup:
    """Backend creator registered with ``torch.distributed.Backend.register_backend(..., extended_api=True)``."""
    del backend_options  # the backend has no options; torch passes the group's pg_options through
    mpi = init_mpi()
    comm, description = _communicator(mpi, options)
    if (comm.Get_rank(), comm.Get_size()) != (options.group_rank, options.group_size):
        raise RuntimeError(
            f"MPI placed this process at rank {comm.Get_rank()} of {comm.Get_size()} in {description}, but torch "
            f"expects rank {options.group_rank} of {options.group_size}."
        )
    return MpiProcessGroup(mpi, comm, ProgressEngine.instance(mpi), options.timeout, description)
