"""Under an MPI launcher, or an MPI backend, say in the job's log when ranks listen on TCP sockets that a setting of
theirs would close: what a site that forbids listening sockets must hear without running the doctor.

Plain ``mpirun -n 2`` starts Open MPI's tcp transport besides shared memory, and every rank then listens on a port
of every interface for the whole job, whatever torch backend runs over it (gloo + ``mpi://`` too); ``tcp://`` and
``env://`` make rank 0 serve a TCP store although MPI already knows every rank. Once the default group exists, every
rank lists the listening sockets it holds with who opened each (``listening_sockets.who_opened``: the MPI library,
the TCP store, the backend; one inherited from the launcher is the launcher's, and neither closable nor ours to
blame), the lists are gathered, and rank 0 warns once when a socket of the MPI library (on one node: across nodes
MPI needs a network, and the doctor's ``mpi-sockets`` check speaks of it) or of the TCP store is among them, with the
fix for each cause.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import torch.distributed as dist

from lightning_dist_hooks.listening_sockets import (
    TCP_STORE,
    is_launchers,
    is_mpi_librarys,
    listening_sockets,
    who_opened,
)

MPI_LIBRARY_FIX = (
    "for the MPI library's: start the job with mpirun --mca btl self,vader (Open MPI 4; self,sm on Open MPI 5), or "
    "export OMPI_MCA_btl=self,vader before it starts: the ranks then meet through shared memory alone"
)
TCP_STORE_FIX = (
    "for the TCP store's: torch_dist_init_method='mpi://' (the ranks meet over MPI) or 'dir:///shared/rdzv/' (a "
    "shared directory): no rendezvous store listens"
)

Opened = tuple[str, str]  # (socket, who opened it)


def own_listeners(tcp_store_port: int | None) -> list[Opened]:
    """This process's listening TCP sockets with who opened each, except those it inherited from its launcher."""
    found = [(str(each), who_opened(each, tcp_store_port)) for each in listening_sockets()]
    return [(address, opener) for address, opener in found if not is_launchers(opener)]


def warn_if_ranks_listen_needlessly(backend: str, tcp_store_port: int | None, warn: Callable[[str], None]) -> None:
    """Collective over the default group, on every rank: ``warn`` (on rank 0) names every rank's own listening
    sockets and who opened them, if a setting would close some (see the module's description). The MPI transport
    calls it right after the group exists, in a job it takes part in (an MPI backend or launcher).

        warn_if_ranks_listen_needlessly("gloo", None, flavour.rank_zero_warn)
    """
    gathered: list[tuple[str, list[Opened]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (socket.gethostname(), own_listeners(tcp_store_port)))
    message = listening_message(backend, [entry for entry in gathered if entry is not None])
    if message is not None and dist.get_rank() == 0:
        warn(message)


def listening_message(backend: str, ranks: list[tuple[str, list[Opened]]]) -> str | None:
    """The warning for each rank's ``(host, [(socket, who opened it)])``, or None when no socket has a fix here.

    >>> mpi = "the MPI library (Open MPI's tcp transport)"
    >>> print(listening_message("gloo", [("n1", [("0.0.0.0:1024", mpi)]), ("n1", [("127.0.0.1:4000", "gloo's")])]))
    torch_dist_backend='gloo' under an MPI launcher, yet ranks listen on TCP sockets a setting would close, \
reachable by anyone who can reach this node: rank 0: 0.0.0.0:1024 (the MPI library (Open MPI's tcp transport)); \
rank 1: 127.0.0.1:4000 (gloo's). Fixes: for the MPI library's: start the job with mpirun --mca btl self,vader \
(Open MPI 4; self,sm on Open MPI 5), or export OMPI_MCA_btl=self,vader before it starts: the ranks then meet through \
shared memory alone.
    >>> listening_message("mpi", [("n1", []), ("n2", [("0.0.0.0:1024", mpi)])]) is None  # two nodes: MPI's network
    True
    """
    one_node = len({host for host, _ in ranks}) == 1
    openers = {opener for _, sockets in ranks for _, opener in sockets}
    fixes = [MPI_LIBRARY_FIX] if one_node and any(is_mpi_librarys(opener) for opener in openers) else []
    fixes += [TCP_STORE_FIX] if TCP_STORE in openers else []
    if not fixes:
        return None
    shown = "; ".join(
        f"rank {rank}: {', '.join(f'{address} ({opener})' for address, opener in sockets)}"
        for rank, (_, sockets) in enumerate(ranks)
        if sockets
    )
    where = "this node" if one_node else "these nodes"
    return (
        f"torch_dist_backend={backend!r} under an MPI launcher, yet ranks listen on TCP sockets a setting would "
        f"close, reachable by anyone who can reach {where}: {shown}. Fixes: {'; '.join(fixes)}."
    )
