"""The emulated cluster of .ci/cluster-up.sh seen from the tests: its nodes, and running commands on them.

Every node is a network namespace with its own host name and its own address on 198.18.0.0/24; all of them see
the machine's files, so ``tmp_path`` is the "shared filesystem". Names and addresses come from
.ci/cluster/names.env, which the shell scripts read too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER_EXEC = REPO / ".ci" / "cluster-exec.sh"
CLUSTER_RSH = REPO / ".ci" / "cluster-rsh"
NODE_COUNT = 2


def _names(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of a shell environment file (values double-quoted where they hold spaces)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    pairs = [line.split("=", 1) for line in lines if line and not line.startswith("#")]
    return {key: value.strip('"') for key, value in pairs}


NAMES = _names(REPO / ".ci" / "cluster" / "names.env")


@dataclass(frozen=True)
class Node:
    index: int

    @property
    def name(self) -> str:
        return f"{NAMES['NODE_PREFIX']}{self.index}"

    @property
    def address(self) -> str:
        return f"{NAMES['NODE_SUBNET']}.{self.index + 1}"

    def command(self, command: list[str]) -> list[str]:
        """``command`` run on this node: in its network namespace, with its host name."""
        return [str(CLUSTER_EXEC), self.name, *command]


NODES = tuple(Node(index) for index in range(NODE_COUNT))
NODE_ADDRESSES = {node.address: node for node in NODES}


@dataclass(frozen=True)
class EmulatedCluster:
    directory: Path
    nodes: tuple[Node, ...] = NODES

    @property
    def slurm_conf(self) -> Path:
        return self.directory / "slurm" / "slurm.conf"

    @property
    def has_slurm(self) -> bool:
        return (self.directory / "slurm" / "slurmctld.pid").exists()


def cluster_up(directory: Path, slurm: bool) -> EmulatedCluster:
    command = ["bash", str(REPO / ".ci" / "cluster-up.sh"), *(["--slurm"] if slurm else [])]
    environment = {**os.environ, "LDH_CLUSTER_DIR": str(directory), "LDH_CLUSTER_NODES": str(NODE_COUNT)}
    up = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)
    if up.returncode != 0:
        cluster_down(directory)
        raise AssertionError(f".ci/cluster-up.sh failed:\n{up.stdout}\n{up.stderr}")
    return EmulatedCluster(directory)


def cluster_down(directory: Path) -> None:
    environment = {**os.environ, "LDH_CLUSTER_DIR": str(directory)}
    subprocess.run(["bash", str(REPO / ".ci" / "cluster-down.sh")], capture_output=True, timeout=120, env=environment)


@dataclass
class NodeProcesses:
    """Commands started on nodes, each in its own session so that its whole process tree can be killed."""

    logs: dict[str, Path]
    processes: dict[str, subprocess.Popen]

    def wait(self, timeout: float) -> dict[str, int | None]:
        """Exit codes by name; every process tree still running at ``timeout`` is killed and reported as None."""
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for name, process in self.processes.items():
            try:
                codes[name] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        self.kill()
        return codes

    def kill(self) -> None:
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)

    def output(self) -> str:
        return "\n".join(f"===== {name}\n{log.read_text()[-5000:]}" for name, log in self.logs.items())


def start_on_nodes(commands: dict[str, list[str]], cwd: Path, env: dict[str, str]) -> NodeProcesses:
    """Start ``commands`` (name -> full command line) with their output in ``cwd/NAME.log``."""
    logs, processes = {}, {}
    for name, command in commands.items():
        logs[name] = cwd / f"{name}.log"
        with open(logs[name], "w") as log:
            processes[name] = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
    return NodeProcesses(logs, processes)
