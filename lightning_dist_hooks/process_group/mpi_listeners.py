"""Under an MPI backend on one node, say in the job's log when the ranks listen on TCP sockets shared memory does not
need: what a site that forbids listening sockets must hear without running the doctor.

Plain ``mpirun -n 2`` starts Open MPI's tcp transport besides shared memory, and every rank then listens on a port
of every interface for the whole job. Once the default group exists, every rank lists the listening sockets it holds
that it did not inherit from its launcher (slurmstepd's PMIx socket under ``srun --mpi=pmix`` is the launcher's:
the rank neither opened it nor can close it), the lists are gathered, and rank 0 warns once, naming each rank's
sockets and the fix. Across nodes MPI needs a network transport, so nothing is said there; the doctor's
``mpi-sockets`` check warns about it instead.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import torch.distributed as dist

from lightning_dist_hooks.backends import MPI_BACKENDS
from lightning_dist_hooks.listening_sockets import launcher_of, listening_sockets

FIX = (
    "Start the job with mpirun --mca btl self,vader (Open MPI 4; self,sm on Open MPI 5), or export "
    "OMPI_MCA_btl=self,vader before it starts: the ranks then meet through shared memory alone"
)


def own_listeners() -> list[str]:
    """This process's listening TCP sockets, except those it inherited from its launcher."""
    return [str(each) for each in listening_sockets() if launcher_of(each.inode) is None]


def warn_if_mpi_listens(backend: str, warn: Callable[[str], None]) -> None:
    """Collective over the default group, on every rank: under an MPI ``backend`` on one node, ``warn`` (on rank 0)
    names every rank's own listening sockets, if any rank holds one. Does nothing for other backends.

        warn_if_mpi_listens("mpi4py", flavour.rank_zero_warn)   # right after init_process_group
    """
    if backend not in MPI_BACKENDS:
        return
    gathered: list[tuple[str, list[str]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (socket.gethostname(), own_listeners()))
    message = listening_message(backend, [entry for entry in gathered if entry is not None])
    if message is not None and dist.get_rank() == 0:
        warn(message)


def listening_message(backend: str, ranks: list[tuple[str, list[str]]]) -> str | None:
    """The warning for each rank's ``(host, own listening sockets)``, or None when none listens or the job spans nodes.

    >>> print(listening_message("mpi4py", [("n1", ["0.0.0.0:1024", "[::]:1024"]), ("n1", ["0.0.0.0:1025"])]))
    torch_dist_backend='mpi4py' on one node, yet the ranks listen on TCP sockets the MPI library opened (Open MPI's \
tcp transport), reachable by anyone who can reach this node: rank 0: 0.0.0.0:1024, [::]:1024; rank 1: 0.0.0.0:1025. \
Start the job with mpirun --mca btl self,vader (Open MPI 4; self,sm on Open MPI 5), or export \
OMPI_MCA_btl=self,vader before it starts: the ranks then meet through shared memory alone.
    >>> listening_message("mpi4py", [("n1", []), ("n2", ["0.0.0.0:1024"])]) is None  # two nodes: MPI needs a network
    True
    """
    if len({host for host, _ in ranks}) > 1:
        return None
    listening = [(rank, sockets) for rank, (_, sockets) in enumerate(ranks) if sockets]
    if not listening:
        return None
    shown = "; ".join(f"rank {rank}: {', '.join(sockets)}" for rank, sockets in listening)
    return (
        f"torch_dist_backend={backend!r} on one node, yet the ranks listen on TCP sockets the MPI library opened "
        f"(Open MPI's tcp transport), reachable by anyone who can reach this node: {shown}. {FIX}."
    )
