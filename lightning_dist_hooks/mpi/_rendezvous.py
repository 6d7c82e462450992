"""The ``mpi://`` rendezvous: rank and world size from MPI, and a process-local store instead of a TCP one.

torch's ``init_process_group`` always wants a store; the default ``env://`` and ``tcp://`` methods make rank 0
listen on a TCP port. The mpi4py backend needs no store at all, so ``mpi://`` hands torch an in-process
``HashStore`` and the job holds no listening socket.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from ._mpi import init_mpi

SCHEME = "mpi"
INIT_METHOD = f"{SCHEME}://"


def mpi_rendezvous(url: str, **kwargs: object) -> Iterator[tuple[dist.Store, int, int]]:
    """Rendezvous handler for ``mpi://`` (registered with ``torch.distributed.register_rendezvous_handler``).

    Yields ``(HashStore(), MPI rank, MPI size)``. A rank or world size passed to ``init_process_group`` must
    agree with MPI. The store is local to the process: only a backend that needs no store (``mpi4py``, or
    torch's native ``mpi``) can use it.
    """
    del kwargs  # torch passes the timeout; MPI's own launch has already brought every rank up
    world = init_mpi().COMM_WORLD
    mpi_values = {"rank": world.Get_rank(), "world_size": world.Get_size()}
    for name, values in parse_qs(urlparse(url).query).items():
        if name in mpi_values and int(values[0]) not in (-1, mpi_values[name]):
            raise ValueError(
                f"{url}: {name}={values[0]} disagrees with MPI ({name} {mpi_values[name]}); with {INIT_METHOD} "
                "the rank and world size come from the MPI launcher, leave them unset or pass MPI's values."
            )
    yield dist.HashStore(), mpi_values["rank"], mpi_values["world_size"]
    raise RuntimeError(f"Unable to perform re-rendezvous using {INIT_METHOD}")
