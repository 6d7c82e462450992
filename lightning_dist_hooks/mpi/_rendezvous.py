"""The ``mpi://`` rendezvous: rank and world size from MPI, and a store whose messages travel over MPI.

torch's ``init_process_group`` always wants a store; the default ``env://`` and ``tcp://`` methods make rank 0
listen on a TCP port, ``file://`` needs a filesystem every node shares. ``mpi://`` hands torch an
:class:`~lightning_dist_hooks.mpi._store.MpiStore` instead: every backend (gloo, NCCL, composites, the MPI
transport and its subgroups) meets through it, and neither it nor the rendezvous opens a socket or a file.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from lightning_dist_hooks.launcher_variables import launcher_facts
from lightning_dist_hooks.mpi._launch import detect_mpi_launch
from lightning_dist_hooks.mpi._mpi import init_mpi
from lightning_dist_hooks.mpi._store import MpiStore
from lightning_dist_hooks.outside_watchdog import OutsideWatchdog, WatchedWait, watched_from_outside
from lightning_dist_hooks.wait_schedule import DEFAULT_SCHEDULE, grace_s

SCHEME = "mpi"
INIT_METHOD = f"{SCHEME}://"
# The phases a rank can wait in here, as the watchdog names them.
MPI_START_UP = "MPI's start-up (MPI_Init returns once every rank of the job has started and called it)"
STORE_CREATION = "the creation of the mpi:// store (every rank of the MPI job must reach it)"


def mpi_rendezvous(
    url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: object
) -> Iterator[tuple[dist.Store, int, int]]:
    """Rendezvous handler for ``mpi://`` (registered with ``torch.distributed.register_rendezvous_handler``).

    Yields ``(MpiStore, MPI rank, MPI size)``; collective over ``COMM_WORLD``, within ``timeout``. A rank or world
    size passed to ``init_process_group`` must agree with MPI.

    Where this starts MPI, a watchdog outside the process (``outside_watchdog``) watches the wait: ``MPI_Init`` holds
    Python's interpreter lock until every rank of the job has started, so the rank's own threads could neither
    report nor end it.
    """
    del kwargs
    with _watchdog_while_mpi_starts(timeout) as watchdog:
        world = init_mpi().COMM_WORLD
        mpi_values = {"rank": world.Get_rank(), "world_size": world.Get_size()}
        for name, values in parse_qs(urlparse(url).query).items():
            if name in mpi_values and int(values[0]) not in (-1, mpi_values[name]):
                raise ValueError(
                    f"{url}: {name}={values[0]} disagrees with MPI ({name} {mpi_values[name]}); with {INIT_METHOD} "
                    "the rank and world size come from the MPI launcher, leave them unset or pass MPI's values."
                )
        if watchdog is not None:
            watchdog.phase(STORE_CREATION)
        store = MpiStore.create(timeout)
    yield store, mpi_values["rank"], mpi_values["world_size"]
    raise RuntimeError(f"Unable to perform re-rendezvous using {INIT_METHOD}")


def _watchdog_while_mpi_starts(timeout: timedelta) -> AbstractContextManager[OutsideWatchdog | None]:
    """A watchdog outside this process, where MPI has not started yet (once it has, no wait here holds the interpreter
    lock, and the rank's own threads report: no process to start)."""
    mpi_module = sys.modules.get("mpi4py.MPI")
    if mpi_module is not None and mpi_module.Is_initialized():
        return nullcontext()
    rank, world_size = _launch_rank_and_size()
    wait = WatchedWait(
        rank=rank,
        world_size=world_size,
        place=INIT_METHOD,
        timeout_s=timeout.total_seconds(),
        report_at=tuple(DEFAULT_SCHEDULE.times_within(timeout.total_seconds())),
        deadline_s=timeout.total_seconds() + grace_s(timeout),
        launcher=f"{launcher_facts(os.environ)} on {socket.gethostname()}",
    )
    return watched_from_outside(wait, MPI_START_UP)


def _launch_rank_and_size() -> tuple[int | None, int | None]:
    """This rank's place as the launcher gave it: an MPI launcher's, else SLURM's (``srun --mpi=pmix`` sets none of
    an MPI launcher's variables); None where no launcher says."""
    launch = detect_mpi_launch()
    if launch is not None:
        return launch.rank, launch.world_size
    rank, size = os.environ.get("SLURM_PROCID", ""), os.environ.get("SLURM_NTASKS", "")
    return (int(rank) if rank.isdigit() else None), (int(size) if size.isdigit() else None)
