"""Listening TCP sockets, read from ``/proc`` (Linux): which a process holds, who opened each (the launcher, the MPI
library, the rendezvous store, the process group's backend), and who holds a given port. Standard library only:
the doctor and the MPI transport's start-up warning (``mpi/_listeners.py``) both read sockets and
their openers through it.

/proc does not say which library of a process opened a socket, so the openers say so themselves: each wraps the
call that may open sockets in :func:`attributing_new_sockets`, and the sockets that appear meanwhile are theirs
(MPI's start-up in ``mpi._mpi``, the process group's creation in ``process_group.create``). rank 0's TCP store is
known by its port, and a socket the rank inherited by its launcher holding it too.

    for socket in listening_sockets():
        print(socket, who_opened(socket))
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from typing_extensions import override  # a dependency of torch and of Lightning

_TCP_LISTEN = "0A"

# How every attribution of a socket the rank inherited starts: the verdicts tell the launcher's sockets by it, since
# the attribution is all that travels to the other ranks (``{"socket": ..., "opened_by": ...}``).
INHERITED = "inherited from the launcher"
# How every attribution of a socket the MPI library opened starts (its transport, e.g. Open MPI's tcp BTL).
MPI_LIBRARY = "the MPI library"
TCP_STORE = "torch's TCPStore, the rendezvous store rank 0 serves"
# A socket none of the above opened: the program's own, or a library's it loaded (Lightning's and ours open none).
UNKNOWN_OPENER = "this program or a library it loaded (not MPI, the rendezvous store nor the process group)"

# inode -> who opened it, as the block that opened it said (attributing_new_sockets).
_openers: dict[str, str] = {}


@dataclass(frozen=True)
class ListeningSocket:
    """A TCP socket in LISTEN state: the address it is bound to (``0.0.0.0``/``::`` mean every interface)."""

    address: str
    port: int
    inode: str

    @override
    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


def listening_sockets(pid: int | str = "self") -> list[ListeningSocket]:
    """The listening TCP sockets (IPv4 and IPv6) that process ``pid`` holds, by port."""
    inodes = socket_inodes(pid)
    return sorted(
        (socket for socket in _listening_in_namespace_of(pid) if socket.inode in inodes),
        key=lambda socket: (socket.port, socket.address),
    )


@contextmanager
def attributing_new_sockets(opener: Callable[[], str]) -> Iterator[None]:
    """The listening sockets this process opens during the block are ``opener()``'s (asked once the block is over,
    when e.g. the MPI library can name itself), unless a block inside named them first.

        with attributing_new_sockets(lambda: "the MPI library (Open MPI's tcp transport)"):
            from mpi4py import MPI
    """
    before = {socket.inode for socket in listening_sockets()}
    try:
        yield
    finally:
        new = [socket.inode for socket in listening_sockets() if socket.inode not in before]
        if new:
            name = opener()
            for inode in new:
                _openers.setdefault(inode, name)


def who_opened(socket: ListeningSocket, tcp_store_port: int | None = None) -> str:
    """Who opened this process's listening ``socket``: its launcher (inherited), rank 0's TCP store (on
    ``tcp_store_port``), the block that said so (:func:`attributing_new_sockets`), else :data:`UNKNOWN_OPENER`.

    >>> who_opened(ListeningSocket("0.0.0.0", 29500, "no-such-inode"), tcp_store_port=29500)
    "torch's TCPStore, the rendezvous store rank 0 serves"
    """
    launcher = launcher_of(socket.inode)
    if launcher is not None:
        return launcher
    if socket.port == tcp_store_port:
        return TCP_STORE
    return _openers.get(socket.inode, UNKNOWN_OPENER)


def is_mpi_librarys(attribution: str) -> bool:
    """Whether ``attribution`` (a :func:`who_opened` result) says the MPI library opened the socket."""
    return attribution.startswith(MPI_LIBRARY)


def is_launchers(attribution: str) -> bool:
    """Whether ``attribution`` (an ``opened_by`` result) says the launcher opened the socket, not the rank.

    >>> is_launchers("inherited from the launcher (slurmstepd, pid 1234)"), is_launchers("the MPI library")
    (True, False)
    """
    return attribution.startswith(INHERITED)


@dataclass(frozen=True)
class Ancestor:
    """A process above this one, as far as this user may see it: ``holds`` the socket in question (None: this user
    may not list its descriptors, e.g. root's slurmstepd for a user's rank); ``uid`` is its file-system uid, which a
    socket it creates belongs to."""

    pid: int
    command: str
    uid: int | None
    holds: bool | None


def launcher_of(inode: str, pid: int | str = "self") -> str | None:
    """``INHERITED (COMMAND, pid PID)`` when process ``pid`` inherited its socket ``inode`` from an ancestor (the
    launcher: slurmstepd, orted, mpirun, hydra_pmi_proxy, flux-broker, ...); None when it opened the socket itself.

    >>> launcher_of("no-such-socket") is None
    True
    """
    ancestors = [Ancestor(process, command, uid, _holds(process, inode)) for process, command, uid in _ancestry(pid)]
    return inherited_from(ancestors, _socket_owner(inode, pid), _fs_uid(pid))


def inherited_from(ancestors: list[Ancestor], socket_uid: int | None, own_uid: int | None) -> str | None:
    """The attribution of a socket given the process's ``ancestors`` (nearest first): the farthest that holds the same
    socket opened it; failing that, a socket of another user (``socket_uid``) than the process's own (``own_uid``)
    was not opened by the process, and the nearest ancestor running as that user is named. None: the process's own.

    >>> slurmstepd = Ancestor(1234, "slurmstepd", 0, holds=None)
    >>> print(inherited_from([slurmstepd], socket_uid=0, own_uid=1000))
    inherited from the launcher (slurmstepd, pid 1234; the socket belongs to uid 0, not to this rank's user 1000)
    >>> inherited_from([Ancestor(1234, "slurmstepd", 0, holds=True)], socket_uid=0, own_uid=0)
    'inherited from the launcher (slurmstepd, pid 1234)'
    >>> inherited_from([slurmstepd], socket_uid=1000, own_uid=1000) is None
    True
    """
    holders = [ancestor for ancestor in ancestors if ancestor.holds]
    if holders:
        # The farthest holder, not the nearest: a wrapper between (a shell, timeout, a container's starter) only
        # passed the socket on from the launcher that opened it.
        return f"{INHERITED} ({holders[-1].command}, pid {holders[-1].pid})"
    if socket_uid is None or own_uid is None or socket_uid == own_uid:
        return None
    # A socket belongs to the user who created it, so this process (which does not change users) did not: it came
    # from an ancestor whose descriptors this user may not list, most likely the nearest running as that user.
    why = f"the socket belongs to uid {socket_uid}, not to this rank's user {own_uid}"
    owner = next((ancestor for ancestor in ancestors if ancestor.uid == socket_uid), None)
    return f"{INHERITED} ({owner.command}, pid {owner.pid}; {why})" if owner else f"{INHERITED} ({why})"


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


def _ancestry(pid: int | str) -> list[tuple[int, str, int | None]]:
    """``(pid, command, file-system uid)`` of each ancestor of process ``pid``, nearest first, up to pid 1."""
    found: list[tuple[int, str, int | None]] = []
    process = _parent_of(pid)
    while process is not None and process > 0 and process not in {each[0] for each in found}:
        try:
            command = Path(f"/proc/{process}/comm").read_text().strip()
        except OSError:  # gone since its child read its pid: what was above it is not above us any more
            break
        found.append((process, command, _fs_uid(process)))
        process = _parent_of(process)
    return found


def _parent_of(pid: int | str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command, in parentheses, may itself hold spaces and parentheses: the fields after the last ")" are fixed.
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _fs_uid(pid: int | str) -> int | None:
    """The file-system uid of process ``pid`` (the owner of the sockets it creates), from ``/proc/PID/status``."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[4])  # real, effective, saved, file-system
    except OSError:
        pass
    return None


def _holds(pid: int, inode: str) -> bool | None:
    try:
        return inode in socket_inodes(pid)
    except OSError:  # another user's (or gone): its descriptors cannot be listed
        return None


def _socket_owner(inode: str, pid: int | str) -> int | None:
    """The uid socket ``inode`` belongs to (its creator's), as the TCP tables of ``pid``'s network namespace say."""
    return next((int(fields[7]) for fields in _tcp_table_rows(pid) if fields[9] == inode), None)


def _listening_in_namespace_of(pid: int | str) -> list[ListeningSocket]:
    found = []
    for fields in _tcp_table_rows(pid):
        local_address, state, inode = fields[1], fields[3], fields[9]
        if state == _TCP_LISTEN:
            address, port = local_address.rsplit(":", 1)
            found.append(ListeningSocket(_decode_address(address), int(port, 16), inode))
    return found


def _tcp_table_rows(pid: int | str) -> Iterator[list[str]]:
    """The fields of every row of the IPv4 and IPv6 TCP tables of ``pid``'s network namespace (``/proc/PID/net``)."""
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            yield line.split()


def _decode_address(hex_address: str) -> str:
    # /proc prints each 32-bit word of the address in host (little-endian) byte order.
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)
