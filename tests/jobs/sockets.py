"""Which TCP ports a process listens on, read from /proc (Linux)."""

from __future__ import annotations

import socket
from pathlib import Path

from lightning_dist_hooks.listening_sockets import socket_inodes

# TCP states as /proc/net/tcp writes them. CLOSE_WAIT: the peer closed its end, this process has not yet.
_LISTEN, _ESTABLISHED, _CLOSE_WAIT = "0A", "01", "08"


def listening_tcp_ports(pid: int) -> set[int]:
    """Ports of the TCP sockets in LISTEN state that process ``pid`` holds (IPv4 and IPv6)."""
    return {int(local.rsplit(":", 1)[1], 16) for local, _, state in _tcp_sockets(pid) if state == _LISTEN}


def connected_ipv4_sockets(pid: int) -> list[tuple[str, str]]:
    """``(local "ADDRESS:PORT", remote "ADDRESS:PORT")`` of every IPv4 TCP connection ``pid`` holds open: established,
    or already closed by the peer (CLOSE_WAIT). A rank that finished first may have closed its end before a slower
    rank looks; the slower rank's socket still names both ends until it closes it itself.

    /proc/PID/net/tcp lists the whole network namespace; only sockets this process holds are kept.
    """
    return sorted(
        (_ipv4(local), _ipv4(remote))
        for local, remote, state in _tcp_sockets(pid, ("tcp",))
        if state in (_ESTABLISHED, _CLOSE_WAIT)
    )


def _tcp_sockets(pid: int, tables: tuple[str, ...] = ("tcp", "tcp6")) -> list[tuple[str, str, str]]:
    """(local, remote, state) in /proc's hex notation for the TCP sockets that process ``pid`` holds."""
    inodes = socket_inodes(pid)
    sockets = []
    for table in tables:
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                sockets.append((fields[1], fields[2], fields[3]))
    return sockets


def _ipv4(hex_address: str) -> str:
    """/proc/net/tcp's "0100007F:1F90" (little-endian address, port) as "127.0.0.1:8080"."""
    address, port = hex_address.split(":")
    return f"{socket.inet_ntoa(bytes.fromhex(address)[::-1])}:{int(port, 16)}"
