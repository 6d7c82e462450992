"""Which TCP ports a process listens on, read from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def listening_tcp_ports(pid: int) -> set[int]:
    """Ports of the TCP sockets in LISTEN state that process ``pid`` holds (IPv4 and IPv6)."""
    inodes = set()
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(descriptor)
        except OSError:  # closed since the directory was listed
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local_address, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                ports.add(int(local_address.rsplit(":", 1)[1], 16))
    return ports
