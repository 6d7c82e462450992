"""Detect an MPI launcher (mpirun/mpiexec/srun --mpi) from the environment, without initialising MPI: from the
launchers' tables marked ``mpi`` (:mod:`lightning_dist_hooks.launcher_variables`), a registered one's included."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from lightning_dist_hooks.launcher_variables import mpi_launchers


@dataclass(frozen=True)
class MpiLaunch:
    """Where this process sits in a job started by an MPI launcher."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def detect_mpi_launch(environ: Mapping[str, str] | None = None) -> MpiLaunch | None:
    """Return this process's place in the MPI job, or ``None`` when no MPI launcher started it.

    Reads only environment variables set by Open MPI, MPICH/Intel MPI (Hydra, PMI), MVAPICH, Cray PALS and any
    launcher registered as an MPI launcher, so it is cheap and safe to call before deciding whether to initialise
    MPI at all. When the launcher does not export local values, the process is assumed to be alone on its node
    (local rank 0 of 1)::

        launch = detect_mpi_launch()
        if launch is not None:
            os.environ.setdefault("LOCAL_RANK", str(launch.local_rank))
    """
    env = os.environ if environ is None else environ
    # Rank and size suffice: unlike environments.HydraEnvironment, this does not need to tell a process srun
    # started (PMI_RANK/PMI_SIZE without MPI_LOCALRANKID) from Hydra's, since MPI numbers both alike.
    for launcher in mpi_launchers():
        if launcher.rank in env and launcher.world_size in env:
            local_size = env.get(launcher.local_size, 1) if launcher.local_size else 1
            return MpiLaunch(
                rank=int(env[launcher.rank]),
                world_size=int(env[launcher.world_size]),
                local_rank=int(env.get(launcher.local_rank, 0)),
                local_world_size=int(local_size),
            )
    return None


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """Return whether an MPI launcher started this process (see :func:`detect_mpi_launch`)."""
    return detect_mpi_launch(environ) is not None
