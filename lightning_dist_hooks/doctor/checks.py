"""The doctor's checks: each turns facts into a :class:`Verdict` that says what is wrong and how to fix it.

Checks before the rendezvous need only this rank; they still give their verdict when the rendezvous fails. Checks
after it read the facts every rank gathered (``ranks``: one dict per rank, see ``facts.rank_facts``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import socket
import stat
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from lightning_dist_hooks.backends import MPI_BACKENDS
from lightning_dist_hooks.doctor.facts import LauncherLayout, is_loopback
from lightning_dist_hooks.listening_sockets import holders_of_port, is_launchers

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass
class Verdict:
    """One check's outcome. ``status`` is ``"ok"``, ``"warn"`` (exit code unchanged) or ``"fail"``."""

    check: str
    status: str
    message: str
    fix: str = ""
    ranks: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge(verdicts: list[Verdict]) -> list[Verdict]:
    """One verdict per distinct outcome, naming every rank that reached it; failures first."""
    merged: dict[tuple[str, str, str, str], Verdict] = {}
    for verdict in verdicts:
        key = (verdict.check, verdict.status, verdict.message, verdict.fix)
        if key in merged:
            merged[key].ranks = sorted(set(merged[key].ranks) | set(verdict.ranks))
        else:
            merged[key] = Verdict(*key, ranks=sorted(verdict.ranks))
    order = {FAIL: 0, WARN: 1, OK: 2}
    return sorted(merged.values(), key=lambda verdict: order[verdict.status])


# Before the rendezvous ---------------------------------------------------------------------------------------------


def check_launcher_layout(layout: LauncherLayout, devices: int, num_nodes: int) -> list[Verdict]:
    """The launcher's processes per node and node count against ``devices`` and ``num_nodes``."""
    verdicts = []
    if len(set(layout.tasks_per_node)) > 1:
        verdicts.append(
            Verdict(
                "tasks-per-node",
                FAIL,
                f"the launcher started a different number of processes on each node ({layout.source}); Lightning runs "
                "the same number on every node",
                f"start {devices} tasks on every node (e.g. srun --ntasks-per-node={devices})",
            )
        )
    elif layout.tasks_per_node[0] != devices:
        tasks = layout.tasks_per_node[0]
        verdicts.append(
            Verdict(
                "tasks-per-node",
                FAIL,
                f"the launcher started {tasks} processes per node ({layout.source}), but the job asks for "
                f"devices={devices}",
                f"start {devices} tasks per node (srun --ntasks-per-node={devices}, "
                f"torchrun --nproc-per-node={devices}, mpirun --map-by ppr:{devices}:node), or pass devices={tasks}",
            )
        )
    else:
        verdicts.append(Verdict("tasks-per-node", OK, f"{devices} processes per node ({layout.source}), as devices"))
    if layout.nodes != num_nodes:
        verdicts.append(
            Verdict(
                "nodes",
                FAIL,
                f"the launcher started processes on {layout.nodes} node(s) ({layout.source}), but the job asks for "
                f"num_nodes={num_nodes}",
                f"ask the launcher for {num_nodes} node(s) (srun -N {num_nodes}, torchrun --nnodes {num_nodes}), "
                f"or pass num_nodes={layout.nodes}",
            )
        )
    else:
        verdicts.append(Verdict("nodes", OK, f"{num_nodes} node(s), as num_nodes"))
    return verdicts


def check_mpi4py(backend: str | None, mpi4py_installed: bool, install_hint: str) -> Verdict | None:
    if backend not in MPI_BACKENDS:
        return None
    if mpi4py_installed:
        return Verdict("mpi4py", OK, f"mpi4py is installed for torch_dist_backend={backend!r}")
    return Verdict(
        "mpi4py",
        FAIL,
        f"torch_dist_backend={backend!r} needs mpi4py, which this Python cannot import",
        f"{install_hint}, in the environment every rank runs",
    )


def check_directory_privacy(directory: Path) -> Verdict:
    """A rendezvous directory other users cannot use to replace or plant files (docs/security.md)."""
    try:
        info = os.lstat(directory)
    except OSError as error:
        return Verdict("private", FAIL, f"cannot inspect {directory}: {error.strerror}", "create it, or name another")
    owner = _user_name(info.st_uid)
    described = f"{directory} (owner {owner}, mode {stat.filemode(info.st_mode)})"
    sticky = bool(info.st_mode & stat.S_ISVTX)
    if stat.S_ISLNK(info.st_mode):
        return Verdict(
            "private",
            FAIL,
            f"{directory} is a symbolic link, which another user may point elsewhere",
            f"name the real directory ({os.path.realpath(directory)}) instead",
        )
    if info.st_mode & stat.S_IWOTH and not sticky:
        return Verdict(
            "private",
            FAIL,
            f"{described} is writable by every user and not sticky: anyone can replace the rendezvous files in it",
            f"chmod +t {directory} (or o-w), or use a directory of your own",
        )
    if info.st_uid != os.geteuid() and not sticky:
        return Verdict(
            "private",
            FAIL,
            f"{described} belongs to another user, who can replace the files in it",
            "use a directory you own, or a sticky shared one",
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return Verdict("private", OK, f"{described} is shared but sticky: only the owner of a file can replace it")
    return Verdict("private", OK, f"{described} is writable only by its owner")


def check_file_privacy(path: Path) -> Verdict:
    """The rendezvous file: a regular file of this user, one link, no access for others."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return Verdict("private", OK, f"{path} does not exist yet; it is created private (0600)")
    described = f"{path} (owner {_user_name(info.st_uid)}, mode {stat.filemode(info.st_mode)}, {info.st_nlink} link(s))"
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1 or info.st_mode & 0o077:
        return Verdict(
            "private",
            FAIL,
            f"the rendezvous file {described} is not a private regular file of this user",
            f"remove {path} once no run uses it, and keep its directory private",
        )
    return Verdict("private", OK, f"the rendezvous file {described} is private")


def check_file_locking(directory: Path, scheme: str, needs_file_locks: bool) -> Verdict:
    """A scheme that ``needs_file_locks`` (``file://``: torch's FileStore flocks its file) needs a filesystem that has
    them, which some network filesystems refuse; one that takes none (``dir://``) does not care."""
    if not needs_file_locks:
        return Verdict("file-locking", OK, f"{scheme}:// takes no file locks, so it needs none in {directory}")
    try:
        descriptor, probe = tempfile.mkstemp(dir=directory, prefix=".ldh-doctor-lock-")
    except OSError as error:
        return Verdict(
            "file-locking",
            FAIL,
            f"cannot create a file in {directory}: {error.strerror}",
            "choose a directory you can write to",
        )
    try:
        for name, lock, unlock in (("flock", fcntl.flock, fcntl.flock), ("lockf", fcntl.lockf, fcntl.lockf)):
            try:
                lock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                unlock(descriptor, fcntl.LOCK_UN)
            except OSError as error:
                return Verdict(
                    "file-locking",
                    FAIL,
                    f"the filesystem of {directory} refuses file locks "
                    f"({name}: {os.strerror(cast(int, error.errno))}), which torch's FileStore needs",
                    f"use dir://{directory}/ instead of file:// (it needs no file locks), mount the filesystem with "
                    "locking (NFS: without 'nolock'; Lustre: -o flock), or use tcp:// / env://",
                )
    finally:
        os.close(descriptor)
        os.unlink(probe)
    return Verdict("file-locking", OK, f"file locks (flock, lockf) work in {directory}")


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


def check_tokens(directory: Path, seen: list[int], world_size: int) -> Verdict:
    """Each rank left a token in the rendezvous directory: those it cannot see went to another directory."""
    missing = [rank for rank in range(world_size) if rank not in seen]
    if missing:
        return Verdict(
            "shared-directory",
            FAIL,
            f"{directory} holds the doctor's tokens of ranks {seen} only: ranks {missing} never started, gave up "
            "already, or wrote theirs to a different directory of that name on their node",
            f"if those ranks started (see their output), {directory} is not the same directory on every node (a "
            "node-local /tmp?): use a directory on a filesystem every node mounts",
        )
    return Verdict("shared-directory", OK, f"every rank sees the same {directory}")


# After the rendezvous: from every rank's facts -----------------------------------------------------------------------


def check_hosts(ranks: list[dict[str, Any]], devices: int, num_nodes: int) -> list[Verdict]:
    """Where the ranks really run, by host name, when the launcher did not say (e.g. Lightning's own launcher)."""
    per_host = Counter(rank["host"] for rank in ranks)
    described = ", ".join(f"{host}: {count}" for host, count in sorted(per_host.items()))
    verdicts = []
    if any(count != devices for count in per_host.values()):
        verdicts.append(
            Verdict(
                "tasks-per-node",
                FAIL,
                f"ranks per host ({described}) differ from devices={devices}",
                f"start {devices} processes on every node, or pass the devices the launcher gives",
            )
        )
    else:
        verdicts.append(Verdict("tasks-per-node", OK, f"{devices} ranks on each host, as devices"))
    if len(per_host) != num_nodes:
        verdicts.append(
            Verdict(
                "nodes",
                FAIL,
                f"the ranks run on {len(per_host)} host(s) ({described}), but num_nodes={num_nodes}",
                f"start the job on {num_nodes} node(s), or pass num_nodes={len(per_host)}",
            )
        )
    else:
        verdicts.append(Verdict("nodes", OK, f"{num_nodes} host(s), as num_nodes"))
    return verdicts


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


def check_mpi_sockets(backend: str | None, ranks: list[dict[str, Any]], spans_nodes: bool) -> Verdict | None:
    """Under an MPI backend nothing needs to listen on one node; Open MPI's tcp transport listens unless excluded.

    A socket a rank inherited from its launcher (slurmstepd's PMIx server under ``srun --mpi=pmix``) is neither
    MPI's nor one the user can exclude: it is named, never failed. ``ranks`` holds each rank's ``"listening"``
    entries (``{"socket": ..., "opened_by": ...}``).

    >>> check_mpi_sockets("gloo", [], spans_nodes=False) is None
    True
    >>> launchers = {"socket": "0.0.0.0:35929", "opened_by": "inherited from the launcher (slurmstepd, pid 7)"}
    >>> check_mpi_sockets("mpi", [{"rank": 0, "listening": [launchers]}], spans_nodes=False).status
    'ok'
    """
    if backend not in MPI_BACKENDS:
        return None
    opened = {rank["rank"]: [each["socket"] for each in _not_launchers(rank)] for rank in ranks if _not_launchers(rank)}
    inherited = _launchers_sockets(ranks)
    if not opened:
        if inherited:
            return Verdict(
                "mpi-sockets",
                OK,
                f"torch_dist_backend={backend!r}: no rank opened a listening TCP socket; the ranks hold only their "
                f"launcher's, which MPI did not open: {inherited}",
            )
        return Verdict("mpi-sockets", OK, f"torch_dist_backend={backend!r}: no rank holds a listening TCP socket")
    shown = "; ".join(f"rank {rank}: {', '.join(sockets)}" for rank, sockets in sorted(opened.items()))
    # Named so that the user does not take the launcher's socket for one the fix below removes.
    besides = f"; besides, the launcher's, which MPI did not open: {inherited}" if inherited else ""
    if spans_nodes:
        return Verdict(
            "mpi-sockets",
            WARN,
            f"torch_dist_backend={backend!r}: ranks listen ({shown}): the MPI "
            f"library's transport between nodes, reachable from other nodes{besides}",
            "use a network MPI reaches without TCP (InfiniBand, e.g. --mca btl ^tcp with UCX) where the "
            "cluster has one, or restrict TCP to the job's network with --mca btl_tcp_if_include",
            ranks=sorted(opened),
        )
    return Verdict(
        "mpi-sockets",
        FAIL,
        f"torch_dist_backend={backend!r} on one node, yet ranks listen ({shown}): "
        f"the MPI library opened them (Open MPI's tcp transport), though shared memory needs none{besides}",
        "start with mpirun --mca btl self,vader (Open MPI 4; self,sm on Open MPI 5), or export OMPI_MCA_btl=self,vader",
        ranks=sorted(opened),
    )


def _not_launchers(rank: dict[str, Any]) -> list[dict[str, str]]:
    """The rank's listening sockets that it opened itself (or its MPI library did)."""
    return [each for each in rank["listening"] if not is_launchers(each["opened_by"])]


def _launchers_sockets(ranks: list[dict[str, Any]]) -> str:
    """The launcher's sockets the ranks inherited, each once with the ranks that hold it: under srun every rank of a
    node holds the same slurmstepd socket.

    >>> held = {"socket": "0.0.0.0:35929", "opened_by": "inherited from the launcher (slurmstepd, pid 7)"}
    >>> _launchers_sockets([{"rank": 0, "listening": [held]}, {"rank": 1, "listening": [held]}])
    '0.0.0.0:35929, inherited from the launcher (slurmstepd, pid 7) by ranks [0, 1]'
    """
    holders: dict[tuple[str, str], list[int]] = {}
    for rank in ranks:
        for each in rank["listening"]:
            if is_launchers(each["opened_by"]):
                holders.setdefault((each["socket"], each["opened_by"]), []).append(rank["rank"])
    return "; ".join(
        f"{address}, {attribution} by ranks {sorted(holding)}" for (address, attribution), holding in holders.items()
    )


def check_allreduce(ranks: list[dict[str, Any]]) -> Verdict:
    wrong = [rank["rank"] for rank in ranks if not rank["allreduce"]["correct"]]
    if wrong:
        return Verdict(
            "all-reduce",
            FAIL,
            f"the all-reduce gave a wrong sum on ranks {wrong}",
            "report this with the doctor's --json output: the backend or the network corrupts data",
        )
    return Verdict("all-reduce", OK, "the all-reduce sums correctly on every rank")


def check_all_tokens(directory: Path, ranks: list[dict[str, Any]]) -> Verdict:
    for rank in ranks:
        verdict = check_tokens(directory, rank["tokens_seen"], len(ranks))
        if verdict.status != OK:
            verdict.ranks = [rank["rank"]]
            return verdict
    return check_tokens(directory, list(range(len(ranks))), len(ranks))


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
