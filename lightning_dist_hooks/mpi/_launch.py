"""Detect an MPI launcher (mpirun/mpiexec/srun --mpi) from the environment, without initialising MPI: from the
launchers' tables marked ``mpi`` (:mod:`lightning_dist_hooks.launcher_variables`), a registered one's included; and
check, before any rank starts, that one started as many ranks as the Trainer expects."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from lightning_dist_hooks.launcher_variables import LaunchSize, SizeMismatch, mpi_launchers


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


def check_mpi_launch(
    needed_by: str,
    otherwise: str,
    num_devices: int,
    num_nodes: int,
    *,
    devices_by_default: str | None = None,
    owner: str = "Trainer",
) -> None:
    """Raise ``ValueError`` unless an MPI launcher started this process, with ``num_devices x num_nodes`` ranks.

    For the messages: ``needed_by`` is the flag that needs the launch, as the user wrote it (e.g.
    ``"torch_dist_backend='mpi' (the mpi4py transport)"``); ``otherwise``, what to use without MPI;
    ``devices_by_default``, where the user left ``devices`` at Lightning's default ``'auto'``, what that gave (e.g.
    ``"1 process per node on CPU"``); ``owner`` names the class (``Trainer``, ``Fabric``). Read from the launcher's
    variables (:func:`detect_mpi_launch`): MPI is not initialised.
    """
    expected = num_devices * num_nodes
    launch = detect_mpi_launch()
    if launch is None and "PMIX_RANK" in os.environ:
        return  # a PMIx launcher (srun --mpi=pmix) exports the rank but no job size to compare with
    if launch is None:
        raise ValueError(
            f"{needed_by} needs every rank started by an MPI launcher, but this process was not (no variable of "
            f"Open MPI, MPICH/Intel MPI, MVAPICH or PMIx is set). Start the script with `mpirun -n {expected} python "
            f"...` (or `srun --mpi=pmix --ntasks-per-node={num_devices} python ...` under SLURM), or use {otherwise}."
        )
    if SizeMismatch.WORLD_SIZE not in LaunchSize(launch.world_size).mismatches(num_devices, num_nodes):
        return
    if devices_by_default is not None:
        raise ValueError(
            f"{owner}(num_nodes={num_nodes}) leaves devices at its default ('auto': {devices_by_default}), which "
            f"makes a world of {_processes(expected)}, but the MPI launcher started {launch.world_size} "
            f"({needed_by}). {_devices_fix(launch.world_size, launch.local_world_size, num_nodes, owner)}"
        )
    raise ValueError(
        f"{owner}(devices={num_devices}, num_nodes={num_nodes}) makes a world of {_processes(expected)}, but the "
        f"MPI launcher started {launch.world_size} ({needed_by}). Start the job with `mpirun -n {expected}`, or set "
        f"devices x num_nodes to {launch.world_size}."
    )


def _processes(count: int) -> str:
    return f"{count} process{'' if count == 1 else 'es'}"


def _devices_fix(world_size: int, ranks_per_node: int, num_nodes: int, owner: str) -> str:
    """What to pass for ``devices`` (and ``num_nodes``) to match a launcher of ``world_size`` ranks, this node's
    ``ranks_per_node`` of them (1 may only mean that the launcher does not say).

    >>> _devices_fix(2, 2, 1, "Trainer")
    "Pass devices=2, the launcher's ranks per node: Trainer(devices=2, num_nodes=1)."
    >>> _devices_fix(8, 4, 1, "Fabric")
    "Pass devices=4, the launcher's ranks per node, and num_nodes=2: Fabric(devices=4, num_nodes=2)."
    >>> _devices_fix(6, 1, 2, "Trainer")
    "Pass devices=N, N the launcher's ranks per node, with N x num_nodes = 6."
    """
    if ranks_per_node > 1 and world_size % ranks_per_node == 0:
        nodes = world_size // ranks_per_node
        also = f", and num_nodes={nodes}" if nodes != num_nodes else ""
        return (
            f"Pass devices={ranks_per_node}, the launcher's ranks per node{also}: "
            f"{owner}(devices={ranks_per_node}, num_nodes={nodes})."
        )
    return f"Pass devices=N, N the launcher's ranks per node, with N x num_nodes = {world_size}."
