"""Listening TCP sockets, read from ``/proc`` (Linux): which this process holds, what opened them, and who holds a
given port."""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from lightning_dist_hooks.backends import MPI_BACKENDS

_TCP_LISTEN = "0A"


@dataclass(frozen=True)
class ListeningSocket:
    """A TCP socket in LISTEN state: the address it is bound to (``0.0.0.0``/``::`` mean every interface)."""

    address: str
    port: int
    inode: str

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


def listening_sockets(pid: int | str = "self") -> list[ListeningSocket]:
    """The listening TCP sockets (IPv4 and IPv6) that process ``pid`` holds, by port."""
    inodes = socket_inodes(pid)
    return sorted(
        (socket for socket in _listening_in_namespace_of(pid) if socket.inode in inodes),
        key=lambda socket: (socket.port, socket.address),
    )


def opened_by(inode: str, port: int, before: set[str], store_port: int | None, backend: str) -> str:
    """Who most likely opened this process's listening socket ``inode`` on ``port``, told from when it appeared.

    ``before`` holds the inodes that were listening before the rendezvous; ``store_port`` is rank 0's TCPStore port
    (None on other ranks). A socket that the rendezvous did not need is what the doctor's verdicts point at.

    >>> opened_by("42", 29500, before=set(), store_port=29500, backend="gloo")
    'the rendezvous store (TCPStore) of rank 0'
    """
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


def holders_of_port(port: int) -> list[str]:
    """``"PID (command)"`` of each process this user may inspect that listens on ``port``."""
    inodes = {socket.inode for socket in _listening_in_namespace_of("self") if socket.port == port}
    holders = []
    for process in Path("/proc").glob("[0-9]*"):
        try:
            if inodes & socket_inodes(process.name):
                holders.append(f"{process.name} ({(process / 'comm').read_text().strip()})")
        except OSError:  # gone, or another user's
            continue
    return holders


def socket_inodes(pid: int | str) -> set[str]:
    """The inode numbers (as /proc/net/* writes them) of the sockets process ``pid`` holds."""
    inodes = set()
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(descriptor)
        except OSError:  # closed since the directory was listed
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _listening_in_namespace_of(pid: int | str) -> list[ListeningSocket]:
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            local_address, state, inode = fields[1], fields[3], fields[9]
            if state == _TCP_LISTEN:
                address, port = local_address.rsplit(":", 1)
                found.append(ListeningSocket(_decode_address(address), int(port, 16), inode))
    return found


def _decode_address(hex_address: str) -> str:
    # /proc prints each 32-bit word of the address in host (little-endian) byte order.
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)
