"""What one rank can find out about itself without talking to the others."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_dist_hooks._lightning_internals import PYTORCH_LIGHTNING
from lightning_dist_hooks.backends import available_backends
from lightning_dist_hooks.environments import LauncherEnvironment, detect_cluster_environment

if TYPE_CHECKING:
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment

# The doctor builds pytorch_lightning's Trainer, so it reads pytorch_lightning's environments.
LightningEnvironment, LSFEnvironment, SLURMEnvironment, TorchElasticEnvironment = (
    PYTORCH_LIGHTNING.lightning_environment(name)
    for name in ("LightningEnvironment", "LSFEnvironment", "SLURMEnvironment", "TorchElasticEnvironment")
)

# The variables each of Lightning's own environments reads to detect itself (``detect()`` in lightning_fabric).
_LIGHTNING_DETECT_VARIABLES: dict[type, tuple[str, ...]] = {
    TorchElasticEnvironment: ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"),
    SLURMEnvironment: ("SLURM_NTASKS", "SLURM_JOB_NAME", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"),
    LSFEnvironment: ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE"),
    LightningEnvironment: ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"),
}


def rank_facts(
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    node_rank: int,
    environment: ClusterEnvironment,
    backend: str,
    init_method: str,
    rendezvous_file: Path | None,
) -> dict[str, Any]:
    """What this rank knows about itself just before the rendezvous: the row it adds to rank 0's table and JSON.

    Plain values only, since every rank's dict travels to the others (``all_gather_object``). ``listening``,
    ``allreduce`` and ``tokens_seen`` are placeholders until after the rendezvous; each transport taking part adds
    its own (``Transport.doctor_facts``).
    """
    host = socket.gethostname()
    return {
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "node_rank": node_rank,
        "pid": os.getpid(),
        "host": host,
        "host_addresses": host_addresses(host),
        "interfaces": network_interfaces(),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "environment": type(environment).__name__,
        "evidence": environment_evidence(type(environment)),
        "backend": backend,
        "backends_available": available_backends(),
        "init_method": init_method,
        "rendezvous_file": str(rendezvous_file) if rendezvous_file else None,
        "listening": [],
        "allreduce": None,
        "tokens_seen": None,
    }


def environment_evidence(environment: type[ClusterEnvironment]) -> dict[str, str]:
    """The variables (and their values) that make ``environment`` this process's cluster environment."""
    if issubclass(environment, LauncherEnvironment):
        names: tuple[str, ...] = environment.variables.detect
    else:
        names = next(
            (variables for kind, variables in _LIGHTNING_DETECT_VARIABLES.items() if issubclass(environment, kind)), ()
        )
    return {name: os.environ[name] for name in names if name in os.environ}


@dataclass(frozen=True)
class LauncherLayout:
    """How many processes per node and how many nodes the launcher started, and the variables that say so."""

    tasks_per_node: list[int]
    nodes: int
    source: str


def launcher_layout() -> LauncherLayout | None:
    """The layout the launcher that started this process reports, or None (no launcher, or it does not say)."""
    environment = detect_cluster_environment()
    if environment is None:
        return None
    if environment is SLURMEnvironment:
        return _slurm_layout()
    if environment is TorchElasticEnvironment:
        local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
        if local and world:
            return LauncherLayout(
                [int(local)], int(world) // int(local), f"LOCAL_WORLD_SIZE={local}, WORLD_SIZE={world}"
            )
        return None
    if issubclass(environment, LauncherEnvironment):
        table = environment.variables
        world_size = int(os.environ[table.world_size])
        if table.node_count and table.node_count in os.environ:
            nodes = int(os.environ[table.node_count])
            return LauncherLayout(
                [world_size // nodes], nodes, f"{table.node_count}={nodes}, {table.world_size}={world_size}"
            )
        if table.local_size and table.local_size in os.environ:
            local_size = int(os.environ[table.local_size])
            return LauncherLayout(
                [local_size],
                world_size // local_size,
                f"{table.local_size}={local_size}, {table.world_size}={world_size}",
            )
    return None


def _slurm_layout() -> LauncherLayout | None:
    # srun sets the step's own layout; in a batch script without srun only the allocation's is known.
    for tasks_name, nodes_name in (
        ("SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_NODES"),
        ("SLURM_TASKS_PER_NODE", "SLURM_NNODES"),
    ):
        tasks, nodes = os.environ.get(tasks_name), os.environ.get(nodes_name)
        if tasks and nodes:
            return LauncherLayout(expand_slurm_counts(tasks), int(nodes), f"{tasks_name}={tasks}, {nodes_name}={nodes}")
    return None


def expand_slurm_counts(value: str) -> list[int]:
    """SLURM's compressed per-node counts as one number per node.

    >>> expand_slurm_counts("4(x2),3")
    [4, 4, 3]
    """
    counts = []
    for part in value.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"unexpected SLURM task count {value!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def host_addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to here, in resolver order (empty when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP, _IFF_LOOPBACK = 0x8913, 0x8915, 0x1, 0x8


def network_interfaces() -> dict[str, str]:
    """Interfaces that are up and have an IPv4 address, loopback excluded: ``{"eth0": "10.0.0.5", ...}``."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(probe.fileno(), _SIOCGIFFLAGS, request)[16:18])[0]
                if not flags & _IFF_UP or flags & _IFF_LOOPBACK:
                    continue
                found[name] = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)[20:24])
            except OSError:  # no IPv4 address
                continue
    return found
