"""The network between the ranks: rank 0's main address and port, the interface gloo uses, what host names resolve to.

``env://`` and ``tcp://`` meet at a store at the main address: its port must be free where rank 0 opens it itself
(not under torchrun's agent), and the address one of rank 0's host that the other nodes reach. gloo then connects the
ranks over the address a host name resolves to, or the interface ``GLOO_SOCKET_IFNAME`` names: a loopback address
there holds a job that spans nodes at its first collective. All but ``host-name`` (from every rank's facts, after
the rendezvous) are given before it.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from lightning_dist_hooks.doctor.checks.verdict import FAIL, OK, WARN, Verdict
from lightning_dist_hooks.doctor.facts import is_loopback
from lightning_dist_hooks.listening_sockets import holders_of_port


def check_main_port(port: int) -> Verdict:
    """Rank 0's store listens on ``port`` on every interface: it must be free here."""
    for family, everywhere in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore binds
                probe.bind((everywhere, port))
            return Verdict("main-port", OK, f"port {port} is free on rank 0's host")
        except OSError as error:
            if error.errno == errno.EAFNOSUPPORT:
                continue
            if error.errno != errno.EADDRINUSE:
                raise
            holders = holders_of_port(port)
            held_by = f", held by {', '.join(holders)}" if holders else ""
            return Verdict(
                "main-port",
                FAIL,
                f"port {port}, where rank 0's store must listen, is already in use on its host{held_by}",
                "choose a free port (MASTER_PORT=..., or tcp://HOST:FREE_PORT), or stop what holds it; a port derived "
                "from the job id can collide with another job's: set MASTER_PORT",
            )
    return Verdict("main-port", WARN, f"could not test port {port}: no IPv4 or IPv6 here")


def check_main_address(address: str, resolved: list[str], local_addresses: set[str], spans_nodes: bool) -> Verdict:
    """``MASTER_ADDR`` (or the tcp:// host) on rank 0: an address of this host that other nodes can reach."""
    if not resolved:
        return Verdict(
            "main-address",
            FAIL,
            f"the main address {address!r} does not resolve on rank 0's host",
            "set MASTER_ADDR (or tcp://HOST:PORT) to rank 0's host name or IP address",
        )
    if spans_nodes and all(is_loopback(each) for each in resolved):
        return Verdict(
            "main-address",
            FAIL,
            f"the main address {address!r} is a loopback address, which other nodes cannot reach",
            "set MASTER_ADDR (or tcp://HOST:PORT) to an address of rank 0's node on the network the nodes share",
        )
    if not any(is_loopback(each) or each in local_addresses for each in resolved):
        return Verdict(
            "main-address",
            FAIL,
            f"the main address {address!r} ({', '.join(resolved)}) is not an address of rank 0's host",
            "set MASTER_ADDR (or tcp://HOST:PORT) to the host where rank 0 runs",
        )
    return Verdict("main-address", OK, f"the main address {address!r} ({', '.join(resolved)}) is rank 0's host")


def check_interfaces(backend: str, interfaces: dict[str, str], ifname: str | None) -> Verdict | None:
    """gloo binds to one interface: with several, it should be told which."""
    if backend != "gloo":
        return None
    if ifname:
        names = ifname.split(",")
        unknown = [name for name in names if name not in interfaces and name != "lo"]
        if unknown:
            return Verdict(
                "interfaces",
                FAIL,
                f"GLOO_SOCKET_IFNAME={ifname} names {unknown}, which this host does "
                f"not have up with an IPv4 address (it has: {sorted(interfaces) or 'only lo'})",
                "set GLOO_SOCKET_IFNAME to an interface every node has",
            )
        return Verdict("interfaces", OK, f"gloo uses GLOO_SOCKET_IFNAME={ifname}")
    if len(interfaces) > 1:
        listed = ", ".join(f"{name} {address}" for name, address in sorted(interfaces.items()))
        return Verdict(
            "interfaces",
            WARN,
            f"this host has several interfaces ({listed}) and GLOO_SOCKET_IFNAME is "
            "not set: gloo uses the address the host name resolves to, which may not be one the other "
            "nodes reach",
            "export GLOO_SOCKET_IFNAME=<the interface the nodes share> to every rank",
        )
    return Verdict(
        "interfaces", OK, f"one network interface ({', '.join(interfaces) or 'lo'}); gloo needs no GLOO_SOCKET_IFNAME"
    )


def check_host_names(ranks: list[dict[str, Any]], spans_nodes: bool) -> Verdict:
    """A node whose own name resolves to 127.x: gloo (and SLURM's MASTER_ADDR) would hand that to the others."""
    loopback = sorted(
        {
            rank["host"]
            for rank in ranks
            if rank["host_addresses"] and all(is_loopback(each) for each in rank["host_addresses"])
        }
    )
    if spans_nodes and loopback:
        return Verdict(
            "host-name",
            FAIL,
            f"host name(s) {loopback} resolve to a loopback address while the ranks "
            "span nodes: gloo advertises that address, which other nodes cannot reach",
            "fix /etc/hosts (or DNS) so each node's name resolves to its network address, or set "
            "GLOO_SOCKET_IFNAME to that network's interface",
        )
    return Verdict("host-name", OK, "host names resolve to addresses the ranks can use")
