"""The ``mpi://`` rendezvous: rank and world size from MPI, and a store whose messages travel over MPI.

torch's ``init_process_group`` always wants a store; the default ``env://`` and ``tcp://`` methods make rank 0
listen on a TCP port, ``file://`` needs a filesystem every node shares. ``mpi://`` hands torch an
:class:`~lightning_dist_hooks.mpi._store.MpiStore` instead: every backend (gloo, NCCL, composites, the MPI
transport and its subgroups) meets through it, and neither it nor the rendezvous opens a socket or a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from ._mpi import init_mpi
from ._store import MpiStore

SCHEME = "mpi"
INIT_METHOD = f"{SCHEME}://"


def mpi_rendezvous(
    url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: object
) -> Iterator[tuple[dist.Store, int, int]]:
    """Rendezvous handler for ``mpi://`` (registered with ``torch.distributed.register_rendezvous_handler``).

    Yields ``(MpiStore, MPI rank, MPI size)``; collective over ``COMM_WORLD``, within ``timeout``. A rank or world
    size passed to ``init_process_group`` must agree with MPI.
    """
    del kwargs
    world = init_mpi().COMM_WORLD
    mpi_values = {"rank": world.Get_rank(), "world_size": world.Get_size()}
    for name, values in parse_qs(urlparse(url).query).items():
        if name in mpi_values and int(values[0]) not in (-1, mpi_values[name]):
            raise ValueError(
                f"{url}: {name}={values[0]} disagrees with MPI ({name} {mpi_values[name]}); with {INIT_METHOD} "
                "the rank and world size come from the MPI launcher, leave them unset or pass MPI's values."
            )
    yield MpiStore.create(timeout), mpi_values["rank"], mpi_values["world_size"]
    raise RuntimeError(f"Unable to perform re-rendezvous using {INIT_METHOD}")
