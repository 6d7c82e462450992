"""Detect an MPI launcher (mpirun/mpiexec/srun --mpi) from the environment, without initialising MPI."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# (rank, world size, local rank, local world size) variables, per launcher family. Local values are optional.
_LAUNCHER_VARIABLES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH / Intel MPI (Hydra), srun --mpi=pmi2
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
)


@dataclass(frozen=True)
class MpiLaunch:
    """Where this process sits in a job started by an MPI launcher."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def detect_mpi_launch(environ: Mapping[str, str] | None = None) -> MpiLaunch | None:
    """Return this process's place in the MPI job, or ``None`` when no MPI launcher started it.

    Reads only environment variables set by Open MPI, MPICH/Intel MPI (Hydra, PMI) and MVAPICH, so it is cheap
    and safe to call before deciding whether to initialise MPI at all. When the launcher does not export local
    values, the process is assumed to be alone on its node (local rank 0 of 1)::

        launch = detect_mpi_launch()
        if launch is not None:
            os.environ.setdefault("LOCAL_RANK", str(launch.local_rank))
    """
    env = os.environ if environ is None else environ
    for rank_var, size_var, local_rank_var, local_size_var in _LAUNCHER_VARIABLES:
        if rank_var in env and size_var in env:
            return MpiLaunch(
                rank=int(env[rank_var]),
                world_size=int(env[size_var]),
                local_rank=int(env.get(local_rank_var, 0)),
                local_world_size=int(env.get(local_size_var, 1)),
            )
    return None


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """Return whether an MPI launcher started this process (see :func:`detect_mpi_launch`)."""
    return detect_mpi_launch(environ) is not None
