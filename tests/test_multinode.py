"""Every launcher's multi-node form, on an emulated cluster of 2 nodes (tests/cluster.py, .ci/cluster-up.sh).

Each node is a network namespace with its own host name and address (198.18.0.1 and .2 on ``eth0``), so what
one node cannot reach of another fails here as on a real cluster: a main address of 127.0.0.1, gloo bound to
the wrong interface, node ranks derived wrongly, per-job names that differ between nodes.

Each launcher runs ``env://`` (each derives the main address and port its own way) and ``file:///DIR/`` (each
names the job its own way). ``tcp://NODE0:PORT`` and ``file:///DIR/name`` need nothing from the launcher, so
they run where a launcher could still break them: Lightning's launcher (a process per node, none shares a parent)
and torchrun (whose agent store hijacks ``tcp://``) for ``tcp://``, Lightning's launcher for
``file:///DIR/name``. ``mpi://`` runs under mpirun with the MPI transport over the ``tcp`` BTL. ``dir://``
(issue 21) trains with ``flock`` failing and with ``flock`` granting every lock (an LD_PRELOAD shim).
Every job runs 2 ranks per node (4 in all), so node rank and local rank both vary.
The doctor (issue 14) runs here too: healthy across both nodes, and with the faults only several nodes can have.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import CLUSTER_RSH, NODE_ADDRESSES, NODES, EmulatedCluster, start_on_nodes
from helpers import FIT_JOB, JobResult, job_environment, processes_mentioning, run_command, wait_until_empty

DEVICES = 2  # ranks per node
WORLD_SIZE = DEVICES * len(NODES)
PG_TIMEOUT_S = 30
JOB_TIMEOUT_S = 150
MAIN = NODES[0]
# Every test listens on ports of its own inside the namespaces (a port in TIME_WAIT is not reused).
_ports = itertools.count(29500)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

needs_openmpi = pytest.mark.skipif(
    shutil.which("mpirun.openmpi") is None, reason="OpenMPI's mpirun is not installed (.ci/install)"
)


@pytest.fixture
def cluster(emulated_cluster: EmulatedCluster, tmp_path: Path):
    """The cluster; after the test, no process of it (ranks, orted, slurmstepd's tasks) may still run."""
    yield emulated_cluster
    leftovers = wait_until_no_process_mentions(str(tmp_path))
    assert not leftovers, f"processes left running: {leftovers}"


@pytest.fixture
def slurm(cluster: EmulatedCluster) -> EmulatedCluster:
    if not cluster.has_slurm:
        pytest.skip("SLURM is not installed (.ci/install installs slurm-wlm and munge)")
    return cluster


def wait_until_no_process_mentions(text: str, within_s: float = 15) -> dict[int, str]:
    """Poll until no process mentions ``text``; kill and return those still there after ``within_s``."""
    deadline = time.monotonic() + within_s
    while (alive := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in alive:  # a leak, reported by the caller; it must not outlive the test either
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


def environment(**overrides: str) -> dict[str, str]:
    """A job's environment on the cluster: gloo on the nodes' eth0, one thread per rank (2 cores for 4 ranks)."""
    return job_environment(GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1", **overrides)


def fit_flags(out_dir: Path, init_method: str, backend: str = "gloo") -> list[str]:
    return [
        "--out",
        str(out_dir),
        "--init-method",
        init_method,
        "--backend",
        backend,
        "--setup-hook",
        "record",
        "--devices",
        str(DEVICES),
        "--num-nodes",
        str(len(NODES)),
        "--epochs",
        "1",
        "--strategy",
        "ddp-instance",
        "--timeout",
        str(PG_TIMEOUT_S),
    ]


def init_method_url(kind: str, rendezvous_dir: Path, port: int) -> str:
    return {
        "env": "env://",
        "tcp": f"tcp://{MAIN.address}:{port}",
        "file-dir": f"file://{rendezvous_dir}/",
        "file-name": f"file://{rendezvous_dir}/run42",
        "mpi": "mpi://",
    }[kind]


def assert_multinode_fit(
    result: JobResult, environment_name: str, init_method: str, rendezvous_dir: Path, backend: str = "gloo"
) -> None:
    """Ranks 0..3 ran 2 per node in block order on the right hosts, met through ``init_method``, trained the same
    weights over the nodes' eth0 addresses, and left the rendezvous directory empty."""
    result.assert_ok()
    assert sorted(result.ranks) == list(range(WORLD_SIZE)), result.output[-4000:]
    for rank, record in result.ranks.items():
        node = NODES[rank // DEVICES]
        assert record["environment"] == environment_name
        assert record["world_size"] == WORLD_SIZE
        assert (record["node_rank"], record["local_rank"]) == (node.index, rank % DEVICES), f"rank {rank}"
        assert record["hostname"] == node.name, f"rank {rank} ran on {record['hostname']}, not on {node.name}"
        (call,) = record["setup_calls"]
        assert (call["rank"], call["world_size"], call["backend"]) == (rank, WORLD_SIZE, backend)
        if init_method == "env://":
            # Node 0's real address (or its name), never 127.0.0.1, which the other node cannot reach.
            assert socket.gethostbyname(record["master_addr"]) == MAIN.address, f"rank {rank}: {record['master_addr']}"
        if init_method.startswith(("file://", "dir://")) and init_method.endswith("/"):
            # Inside the per-user directory (issue 9).
            assert call["init_method"].startswith(f"{init_method}ldh-uid-{os.geteuid()}/ldh-rendezvous-")
        elif init_method.startswith(("file://", "dir://")):
            directory, name = init_method.rsplit("/", 1)
            assert call["init_method"] == f"{directory}/ldh-uid-{os.geteuid()}/{name}"
        else:
            assert call["init_method"] == init_method
        if backend == "gloo":
            assert_gloo_used_eth0(rank, record, node)
    result.same_on_all_ranks("weights_sha256")
    # One file for the whole job: every node derived the same name.
    assert len({record["setup_calls"][0]["init_method"] for record in result.ranks.values()}) == 1
    deadline = time.monotonic() + 10  # a janitor's removal may land just after the launcher exits
    while (left := sorted(rendezvous_dir.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], "the rendezvous directory must be empty after a clean run"


def assert_gloo_used_eth0(rank: int, record: dict, node) -> None:
    """gloo's ring all-reduce connects every rank to a rank on the other node, from its own eth0 address
    (GLOO_SOCKET_IFNAME=eth0) to the peer node's eth0 address. Bound to lo, or to a host name resolving to
    127.0.x.x, gloo could make no such connection. (gloo connects pairs lazily: only ring neighbours appear.)"""
    to_other_nodes = [
        (local, remote)
        for local, remote in record["tcp_connections"]
        if remote.split(":")[0] in NODE_ADDRESSES and remote.split(":")[0] != node.address
    ]
    assert to_other_nodes, f"rank {rank} has no connection to another node: {record['tcp_connections']}"
    assert {local.split(":")[0] for local, _ in to_other_nodes} == {node.address}, f"rank {rank}: {to_other_nodes}"


# ---------------------------------------------------------------- Lightning's own launcher, once per node


def lightning_per_node(
    tmp_path: Path, flags: list[str], nodes=NODES, env: dict | None = None, timeout: float = JOB_TIMEOUT_S
) -> JobResult:
    """``python fit_job.py`` on each node with NODE_RANK and node 0's MASTER_ADDR/MASTER_PORT, as Lightning's docs
    say for a general cluster; each starts its node's other ranks itself."""
    port = str(next(_ports))
    commands = {
        node.name: node.command(
            [
                "env",
                f"NODE_RANK={node.index}",
                f"MASTER_ADDR={MAIN.address}",
                f"MASTER_PORT={port}",
                sys.executable,
                str(FIT_JOB),
                *flags,
            ]
        )
        for node in nodes
    }
    return run_per_node(commands, tmp_path, Path(flags[flags.index("--out") + 1]), env or environment(), timeout)


def run_per_node(
    commands: dict[str, list[str]], cwd: Path, out_dir: Path, env: dict[str, str], timeout: float
) -> JobResult:
    """Run one command per node to completion; the result's exit code is the worst (124: killed at timeout)."""
    processes = start_on_nodes(commands, cwd=cwd, env=env)
    exit_codes = processes.wait(timeout)
    worst = max((124 if code is None else code for code in exit_codes.values()), key=abs)
    ranks = {record["rank"]: record for record in (json.loads(path.read_text()) for path in out_dir.glob("rank*.json"))}
    return JobResult(worst, processes.output(), out_dir, ranks)


@pytest.mark.parametrize("kind", ["env", "tcp", "file-name"])
def test_lightning_launcher_per_node(cluster, tmp_path, rendezvous_dir, kind):
    init_method = init_method_url(kind, rendezvous_dir, next(_ports))
    result = lightning_per_node(tmp_path, fit_flags(tmp_path / "out", init_method))
    assert_multinode_fit(result, "LightningEnvironment", init_method, rendezvous_dir)


def test_lightning_launcher_per_node_refuses_a_per_launch_file(cluster, tmp_path, rendezvous_dir):
    # Each node's launcher would make its own launch token, so the nodes would wait on different files until the
    # timeout. Trainer(...) must refuse at once. The long process-group timeout shows that it did not wait.
    flags = fit_flags(tmp_path / "out", f"file://{rendezvous_dir}/")
    flags[flags.index("--timeout") + 1] = "300"
    started = time.monotonic()
    result = lightning_per_node(tmp_path, flags, timeout=60)
    assert result.returncode not in (0, 124), result.output[-4000:]
    assert time.monotonic() - started < 60
    assert "ValueError" in result.output and "rendezvous" in result.output, result.output[-4000:]
    assert result.ranks == {}


# ---------------------------------------------------------------- torchrun


@pytest.mark.parametrize("kind", ["env", "tcp", "file-dir"])
def test_torchrun_per_node(cluster, tmp_path, rendezvous_dir, kind):
    init_method = init_method_url(kind, rendezvous_dir, next(_ports))
    rendezvous_endpoint = f"{MAIN.address}:{next(_ports)}"
    commands = {
        node.name: node.command(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(len(NODES)),
                "--node-rank",
                str(node.index),
                "--nproc-per-node",
                str(DEVICES),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                rendezvous_endpoint,
                "--rdzv-id",
                f"job-{kind}",
                str(FIT_JOB),
                *fit_flags(tmp_path / "out", init_method),
            ]
        )
        for node in NODES
    }
    result = run_per_node(commands, tmp_path, tmp_path / "out", environment(), JOB_TIMEOUT_S)
    assert_multinode_fit(result, "TorchElasticEnvironment", init_method, rendezvous_dir)


# ---------------------------------------------------------------- OpenMPI mpirun over a host file


def openmpi_command(tmp_path: Path, mapping: str = f"ppr:{DEVICES}:node", *, np: int = WORLD_SIZE) -> list[str]:
    """mpirun on node 0 over a host file of the nodes, reaching node 1 through cluster-rsh (ssh's stand-in, with a
    fresh environment: only what -x forwards arrives), MPI's own traffic on eth0 over TCP."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{node.name} slots={DEVICES}\n" for node in NODES))
    return [
        "mpirun.openmpi",
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        str(np),
        "--hostfile",
        str(hostfile),
        "--map-by",
        mapping,
        "--mca",
        "plm_rsh_agent",
        str(CLUSTER_RSH),
        "--mca",
        "oob_tcp_if_include",
        "eth0",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
        "-x",
        "PYTHONPATH",
        "-x",
        "GLOO_SOCKET_IFNAME",
        "-x",
        "OMP_NUM_THREADS",
        "-x",
        "PYTHONUNBUFFERED",
    ]


@pytest.mark.mpi
@needs_openmpi
@pytest.mark.parametrize("kind, backend", [("env", "gloo"), ("file-dir", "gloo"), ("mpi", "mpi"), ("mpi", "gloo")])
def test_openmpi_mpirun_over_a_host_file(cluster, tmp_path, rendezvous_dir, kind, backend):
    init_method = init_method_url(kind, rendezvous_dir, next(_ports))
    # env://: OpenMPI gives no main address for more than one node; MASTER_ADDR names node 0 (the port is derived).
    forwarded = ["-x", f"MASTER_ADDR={MAIN.address}"] if kind == "env" else []
    command = MAIN.command(
        [
            "timeout",
            str(JOB_TIMEOUT_S),
            *openmpi_command(tmp_path),
            *forwarded,
            sys.executable,
            str(FIT_JOB),
            *fit_flags(tmp_path / "out", init_method, backend),
        ]
    )
    result = run_command(command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=JOB_TIMEOUT_S + 30, env=environment())
    assert_multinode_fit(
        result, "OpenMPIEnvironment", init_method, rendezvous_dir, backend="mpi4py" if backend == "mpi" else backend
    )


@pytest.mark.mpi
@needs_openmpi
def test_openmpi_round_robin_placement_fails_at_start(cluster, tmp_path, rendezvous_dir):
    # --map-by node puts ranks 0 and 2 on node 0: node ranks derived as rank // 2 would be wrong. The ranks whose
    # local rank shows it refuse at start-up, and mpirun stops the others. (Sizes that do not match devices or
    # num_nodes are tests/test_environments.py's.)
    flags = fit_flags(tmp_path / "out", f"file://{rendezvous_dir}/")
    flags[flags.index("--timeout") + 1] = "300"
    command = MAIN.command(["timeout", "120", *openmpi_command(tmp_path, "node"), sys.executable, str(FIT_JOB), *flags])
    started = time.monotonic()
    result = run_command(command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=150, env=environment())
    assert result.returncode not in (0, 124), result.output[-4000:]
    assert time.monotonic() - started < 120, "the job must stop at start-up, not at the process-group timeout"
    assert re.search(
        r"ValueError: OpenMPIEnvironment: rank \d has local rank \d, but with 2 consecutive ranks per "
        r"node it would have local rank \d: the launcher placed the ranks round-robin",
        result.output,
    ), result.output[-4000:]
    assert result.ranks == {}


# ---------------------------------------------------------------- SLURM: one slurmd per node


def slurm_environment(cluster: EmulatedCluster) -> dict[str, str]:
    return environment(SLURM_CONF=str(cluster.slurm_conf))


@pytest.mark.parametrize("kind", ["env", "file-dir"])
def test_srun_on_two_nodes(slurm, tmp_path, rendezvous_dir, kind):
    # env://: no MASTER_ADDR/MASTER_PORT; SLURMEnvironment takes node 0 from SLURM_NODELIST (ldh-n0, resolved
    # through /etc/hosts to 198.18.0.1) and derives the port from the job id.
    init_method = init_method_url(kind, rendezvous_dir, next(_ports))
    command = MAIN.command(
        [
            "timeout",
            str(JOB_TIMEOUT_S),
            "srun",
            f"--nodes={len(NODES)}",
            f"--ntasks-per-node={DEVICES}",
            "--kill-on-bad-exit=1",
            "-J",
            "ldhmulti",
            sys.executable,
            str(FIT_JOB),
            *fit_flags(tmp_path / "out", init_method),
        ]
    )
    result = run_command(
        command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=JOB_TIMEOUT_S + 30, env=slurm_environment(slurm)
    )
    assert_multinode_fit(result, "SLURMEnvironment", init_method, rendezvous_dir)


def test_sbatch_on_two_nodes_with_a_per_job_file(slurm, tmp_path, rendezvous_dir):
    init_method = f"file://{rendezvous_dir}/"
    flags = " ".join(fit_flags(tmp_path / "out", init_method))
    script = tmp_path / "job.sbatch"
    script.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                "#SBATCH --job-name=ldhmulti",
                f"#SBATCH --nodes={len(NODES)}",
                f"#SBATCH --ntasks-per-node={DEVICES}",
                f"#SBATCH --output={tmp_path}/slurm-%j.out",
                f"srun --kill-on-bad-exit=1 {sys.executable} {FIT_JOB} {flags}",
                "",
            ]
        )
    )
    command = MAIN.command(["timeout", str(JOB_TIMEOUT_S), "sbatch", "--wait", str(script)])
    result = run_command(
        command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=JOB_TIMEOUT_S + 30, env=slurm_environment(slurm)
    )
    result.output += "".join(log.read_text()[-6000:] for log in tmp_path.glob("slurm-*.out"))
    assert_multinode_fit(result, "SLURMEnvironment", init_method, rendezvous_dir)
    assert "SLURM_JOB_ID-" in result.ranks[0]["setup_calls"][0]["init_method"]


# ---------------------------------------------------------------- dir:// where flock fails or locks nothing (issue 21)


_FLOCK_PROBE = """
import errno, fcntl, os, sys
first, second = (os.open(os.path.join(sys.argv[1], ".probe"), os.O_CREAT | os.O_RDWR, 0o600) for _ in range(2))
try:
    fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a second exclusive lock on the file: granted only by the shim
    print("both exclusive locks granted")
except OSError as error:
    print(errno.errorcode[error.errno])
os.unlink(os.path.join(sys.argv[1], ".probe"))
"""


def flock_environment(shim: Path, rendezvous_dir: Path, flock: str) -> dict[str, str]:
    """The job's environment with the shim, after checking that flock in ``rendezvous_dir`` really does ``flock``."""
    env = environment(
        LD_PRELOAD=str(shim),
        LDH_NOLOCK_DIR=str(rendezvous_dir),
        **({"LDH_NOLOCK_MODE": "noop"} if flock == "no-op" else {}),
    )
    probe = subprocess.run(
        [sys.executable, "-c", _FLOCK_PROBE, str(rendezvous_dir)], env=env, capture_output=True, text=True, timeout=60
    )
    expected = "both exclusive locks granted" if flock == "no-op" else "ENOLCK"
    assert probe.stdout.strip() == expected, probe.stdout + probe.stderr
    return env


@pytest.mark.parametrize("flock", ["fails", "no-op"])
def test_dir_trains_across_nodes_whatever_flock_does(cluster, tmp_path, rendezvous_dir, flock_shim, flock):
    init_method = f"dir://{rendezvous_dir}/run42"
    result = lightning_per_node(
        tmp_path, fit_flags(tmp_path / "out", init_method), env=flock_environment(flock_shim, rendezvous_dir, flock)
    )
    assert_multinode_fit(result, "LightningEnvironment", init_method, rendezvous_dir)


def test_dir_per_launch_under_torchrun_with_flock_failing(cluster, tmp_path, rendezvous_dir, flock_shim):
    init_method = f"dir://{rendezvous_dir}/"
    rendezvous_endpoint = f"{MAIN.address}:{next(_ports)}"
    commands = {
        node.name: node.command(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(len(NODES)),
                "--node-rank",
                str(node.index),
                "--nproc-per-node",
                str(DEVICES),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                rendezvous_endpoint,
                "--rdzv-id",
                "job-dir",
                str(FIT_JOB),
                *fit_flags(tmp_path / "out", init_method),
            ]
        )
        for node in NODES
    }
    result = run_per_node(
        commands, tmp_path, tmp_path / "out", flock_environment(flock_shim, rendezvous_dir, "fails"), JOB_TIMEOUT_S
    )
    assert_multinode_fit(result, "TorchElasticEnvironment", init_method, rendezvous_dir)


# ---------------------------------------------------------------- faults across nodes

FAULT_TIMEOUT_S = 15
# Starting Python and importing torch and Lightning on 4 ranks of a loaded 2-core machine, and the launchers'
# own shutdown: what a time bound must allow beyond the process-group timeout.
MARGIN_S = 45


def test_a_node_that_never_starts_is_named_by_rank_0(cluster, tmp_path, rendezvous_dir):
    flags = fit_flags(tmp_path / "out", init_method_url("file-name", rendezvous_dir, 0))
    flags[flags.index("--timeout") + 1] = str(FAULT_TIMEOUT_S)
    started = time.monotonic()
    result = lightning_per_node(tmp_path, flags, nodes=NODES[:1], timeout=FAULT_TIMEOUT_S + MARGIN_S + 30)
    elapsed = time.monotonic() - started
    assert result.returncode not in (0, 124), result.output[-4000:]
    assert elapsed < FAULT_TIMEOUT_S + MARGIN_S
    assert "rank 0 of 4 timed out after 15 s" in result.output, result.output[-4000:]
    # Node 1's ranks, and rank 1 too where its start (a second Python importing torch and Lightning on a loaded
    # machine) took longer than the timeout.
    assert re.search(r"ranks that never arrived: \[(1, )?2, 3\]", result.output), result.output[-4000:]
    assert sorted(rendezvous_dir.iterdir()) == []


def test_a_node_whose_network_goes_down_mid_fit_ends_every_rank(cluster, tmp_path, rendezvous_dir):
    marker = tmp_path / "training"
    # The process-group timeout (PG_TIMEOUT_S) also bounds the rendezvous, which must survive a slow start.
    flags = [*fit_flags(tmp_path / "out", "env://"), "--training-marker", str(marker), "--step-seconds", "0.5"]
    flags[flags.index("--epochs") + 1] = "100"
    port = str(next(_ports))
    commands = {
        node.name: node.command(
            [
                "env",
                f"NODE_RANK={node.index}",
                f"MASTER_ADDR={MAIN.address}",
                f"MASTER_PORT={port}",
                sys.executable,
                str(FIT_JOB),
                *flags,
            ]
        )
        for node in NODES
    }
    processes = start_on_nodes(commands, cwd=tmp_path, env=environment())
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not all(Path(f"{marker}.rank{rank}").exists() for rank in range(WORLD_SIZE)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in processes.processes.values()), (
                processes.output()
            )
            time.sleep(0.2)
        subprocess.run(["ip", "-n", NODES[1].name, "link", "set", "eth0", "down"], check=True)
        cut = time.monotonic()
        codes = processes.wait(PG_TIMEOUT_S + MARGIN_S)
        elapsed = time.monotonic() - cut
    finally:
        processes.kill()
        subprocess.run(["ip", "-n", NODES[1].name, "link", "set", "eth0", "up"], check=True)
    output = processes.output()
    assert all(code not in (0, None) for code in codes.values()), f"{codes}\n{output[-6000:]}"
    # The collective's timeout, then at most 2 * 5 s + 1 s asking who is still there
    # (lightning_dist_hooks.process_group.lost_peers).
    assert elapsed < PG_TIMEOUT_S + 11 + 20, output[-6000:]
    node0, node1 = (processes.logs[node.name].read_text() for node in NODES)
    # Node 0 holds rank 0's store: its ranks see who stopped answering. Node 1's ranks cannot reach that store.
    for rank in (0, 1):
        assert f"rank {rank} of 4 lost contact with ranks [2, 3]" in node0, node0[-6000:]
    assert "lost contact with rank 0: the rendezvous store rank 0 holds did not answer" in node1, node1[-6000:]


# ---------------------------------------------------------------- the doctor across nodes (issue 14)

DOCTOR = [sys.executable, "-m", "lightning_dist_hooks", "doctor"]
DOCTOR_TIMEOUT_S = 60  # a healthy rendezvous: 4 ranks importing torch and Lightning on a loaded 2-core machine
TABLE_ROW = re.compile(r"^(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+\d+\s", re.MULTILINE)


def doctor_per_node(
    tmp_path: Path, flags: list[str], mount_namespace_on_node_1: str = ""
) -> tuple[dict[str, int | None], dict[str, str]]:
    """The doctor started like ``lightning_per_node``'s job: Lightning's launcher once per node, with NODE_RANK
    and node 0's MASTER_ADDR/MASTER_PORT. ``mount_namespace_on_node_1``: a shell command run first, in a mount
    namespace of node 1's own. Returns each node's exit code (None: killed at the time limit) and output."""
    port = str(next(_ports))
    commands = {}
    for node in NODES:
        command = [
            "env",
            f"NODE_RANK={node.index}",
            f"MASTER_ADDR={MAIN.address}",
            f"MASTER_PORT={port}",
            *DOCTOR,
            "--devices",
            str(DEVICES),
            "--num-nodes",
            str(len(NODES)),
            *flags,
        ]
        if node.index == 1 and mount_namespace_on_node_1:
            command = [
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'{mount_namespace_on_node_1} && exec "$@"',
                "sh",
                *command,
            ]
        commands[node.name] = node.command(command)
    processes = start_on_nodes(commands, cwd=tmp_path, env=environment())
    codes = processes.wait(DOCTOR_TIMEOUT_S + MARGIN_S)
    return codes, {name: log.read_text() for name, log in processes.logs.items()}


def test_doctor_on_two_nodes_is_healthy(cluster, tmp_path, rendezvous_dir):
    codes, outputs = doctor_per_node(
        tmp_path, ["--init-method", f"file://{rendezvous_dir}/doctor42", "--timeout", str(DOCTOR_TIMEOUT_S)]
    )
    report = outputs[MAIN.name]
    assert codes == {node.name: 0 for node in NODES}, f"{codes}\n{report[-6000:]}\n{outputs[NODES[1].name][-3000:]}"
    private = rendezvous_dir / f"ldh-uid-{os.geteuid()}"
    assert (
        f"lightning-dist-hooks doctor: {WORLD_SIZE} ranks, backend gloo, init method file://{private}/doctor42"
        in report
    ), report[-6000:]
    rows = [
        (int(rank), int(node_rank), int(local_rank), host, addresses)
        for rank, node_rank, local_rank, host, addresses in TABLE_ROW.findall(report)
    ]
    # Ranks in block order, 2 per node, each on its own node's host, whose name resolves to its eth0 address.
    assert rows == [
        (rank, rank // DEVICES, rank % DEVICES, NODES[rank // DEVICES].name, NODES[rank // DEVICES].address)
        for rank in range(WORLD_SIZE)
    ], report[-6000:]
    assert "environment: LightningEnvironment (" in report
    assert "GLOO_SOCKET_IFNAME=eth0" in report
    for line in (
        "ok    all-reduce: the all-reduce sums correctly on every rank",
        f"ok    tasks-per-node: {DEVICES} ranks on each host, as devices",
        f"ok    nodes: {len(NODES)} host(s), as num_nodes",
        "ok    host-name: host names resolve to addresses the ranks can use",
        f"ok    shared-directory: every rank sees the same {private}",
    ):
        assert line in report, report[-6000:]
    assert "\nevery check passed\n" in report, report[-6000:]  # (the logs hold the ranks' stderr too)
    assert "verdicts:" not in outputs[NODES[1].name], "only rank 0 prints the report"
    assert wait_until_empty(rendezvous_dir) == [], "the doctor leaves no file behind"


def test_doctor_on_two_nodes_finds_a_rendezvous_directory_of_each_node_its_own(cluster, tmp_path, rendezvous_dir):
    # Node 1 sees its own (empty) tmpfs at the rendezvous directory's path, as a node-local /tmp would be: each
    # node's ranks meet only each other's tokens and files, and every rank gives up at the timeout.
    started = time.monotonic()
    codes, outputs = doctor_per_node(
        tmp_path,
        ["--init-method", f"file://{rendezvous_dir}/doctor42", "--timeout", str(FAULT_TIMEOUT_S)],
        mount_namespace_on_node_1=f'mount -t tmpfs doctor-test "{rendezvous_dir}"',
    )
    elapsed = time.monotonic() - started
    node0, node1 = (outputs[node.name] for node in NODES)
    assert all(code not in (0, None) for code in codes.values()), f"{codes}\n{node0[-6000:]}\n{node1[-3000:]}"
    assert elapsed < FAULT_TIMEOUT_S + MARGIN_S
    private = rendezvous_dir / f"ldh-uid-{os.geteuid()}"
    assert (
        f"FAIL  shared-directory: {private} holds the doctor's tokens of ranks [0, 1] only: ranks [2, 3] never "
        "started, gave up already, or wrote theirs to a different directory of that name on their node" in node0
    ), node0[-6000:]
    assert "is not the same directory on every node (a node-local /tmp?)" in node0
    assert f"FAIL  shared-directory: {private} holds the doctor's tokens of ranks [2, 3] only" in node1, node1[-6000:]
    assert "ranks that never arrived: [2, 3]" in node0, node0[-6000:]
    assert wait_until_empty(rendezvous_dir) == [], "node 0's ranks remove their files and tokens"


def test_doctor_under_torchrun_on_two_nodes_finds_a_node_count_other_than_num_nodes(cluster, tmp_path, rendezvous_dir):
    # torchrun --nnodes 2 for a job that asks for num_nodes=1: the doctor still meets all 4 ranks and says so.
    rendezvous_endpoint = f"{MAIN.address}:{next(_ports)}"
    commands = {
        node.name: node.command(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(len(NODES)),
                "--node-rank",
                str(node.index),
                "--nproc-per-node",
                str(DEVICES),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                rendezvous_endpoint,
                "--rdzv-id",
                "doctor-nodes",
                "--no-python",
                *DOCTOR,
                "--devices",
                str(DEVICES),
                "--num-nodes",
                "1",
                "--init-method",
                f"file://{rendezvous_dir}/",
                "--timeout",
                str(DOCTOR_TIMEOUT_S),
                "--json",
            ]
        )
        for node in NODES
    }
    processes = start_on_nodes(commands, cwd=tmp_path, env=environment())
    codes = processes.wait(DOCTOR_TIMEOUT_S + MARGIN_S)
    report = processes.logs[MAIN.name].read_text()
    assert all(code not in (0, None) for code in codes.values()), f"{codes}\n{report[-6000:]}"
    document = json.loads(next(line for line in reversed(report.splitlines()) if line.startswith('{"ok"')))
    assert document["ok"] is False
    assert [(rank["rank"], rank["node_rank"], rank["host"]) for rank in document["ranks"]] == [
        (rank, rank // DEVICES, NODES[rank // DEVICES].name) for rank in range(WORLD_SIZE)
    ]
    verdicts = {verdict["check"]: verdict for verdict in reversed(document["verdicts"])}
    assert verdicts["nodes"]["status"] == "fail"
    assert verdicts["nodes"]["message"] == (
        "the launcher started processes on 2 node(s) (LOCAL_WORLD_SIZE=2, "
        "WORLD_SIZE=4), but the job asks for num_nodes=1"
    )
    assert verdicts["nodes"]["fix"].startswith("ask the launcher for 1 node(s) (srun -N 1, torchrun --nnodes 1)")
    assert verdicts["all-reduce"]["status"] == "ok"
    assert wait_until_empty(rendezvous_dir) == [], "the doctor leaves no file behind"
