"""Who opened each listening TCP socket the doctor finds on a rank, told from when it appeared (the facts
themselves come from :mod:`lightning_dist_hooks.listening_sockets`)."""

from __future__ import annotations

import sys

from lightning_dist_hooks.backends import MPI_BACKENDS
from lightning_dist_hooks.listening_sockets import launcher_of


def opened_by(inode: str, port: int, before: set[str], store_port: int | None, backend: str) -> str:
    """Who most likely opened this process's listening socket ``inode`` on ``port``, told from when it appeared.

    ``before`` holds the inodes that were listening before the rendezvous; ``store_port`` is rank 0's TCPStore port
    (None on other ranks). A socket that the rendezvous did not need is what the doctor's verdicts point at.

    >>> opened_by("42", 29500, before=set(), store_port=29500, backend="gloo")
    'the rendezvous store (TCPStore) of rank 0'
    """
    launcher = launcher_of(inode)
    if launcher is not None:
        # Before everything else: an inherited socket is also "open before the rendezvous", but neither MPI's nor ours.
        return launcher
    if inode in before:
        if "mpi4py.MPI" in sys.modules:
            # Lightning's MPIEnvironment.detect() imports mpi4py.MPI (initialising MPI) whenever mpi4py is installed.
            return "the MPI library, initialised before the rendezvous"
        return "open before the rendezvous (the launcher's library or the program)"
    if port == store_port:
        return "the rendezvous store (TCPStore) of rank 0"
    if backend in MPI_BACKENDS:
        return "the MPI library"
    return f"the {backend} backend, for connections between ranks"
