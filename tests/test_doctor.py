"""``python -m lightning_dist_hooks doctor`` under real launchers, and one injected fault per verdict.

Each test starts the doctor as a user would (alone with ``--devices 2`` for Lightning's launcher, torchrun,
OpenMPI's mpirun, srun), then asserts the exit code and the verdict text. Faults are real: a port held by another
process, a directory mounted differently for one rank (a mount namespace), a shadowed mpi4py, a launcher layout that
differs from ``--devices``, a host with two interfaces (a network namespace with a veth pair on 198.18.0.0/23).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import job_environment, needs_mpi, needs_openmpi, openmpi_run, slurm_environment, wait_until_empty

pytestmark = pytest.mark.slow  # every test starts the doctor, most under a launcher

DOCTOR = [sys.executable, "-m", "lightning_dist_hooks", "doctor"]
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python")
# Long enough for a rank started late to find the other still waiting (imports take seconds on a busy 2-core CI);
# short where a test waits for the rendezvous to fail.
TIMEOUT_S = 60
FAILING_TIMEOUT_S = 12
RUN_TIMEOUT_S = 150


@dataclass
class DoctorRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return f"{self.stdout}\n{self.stderr}"

    def verdicts(self) -> dict[str, dict]:
        """The verdicts of rank 0's JSON document, by check (the first of each)."""
        document = json.loads(self.stdout.strip().splitlines()[-1])
        found: dict[str, dict] = {}
        for verdict in document["verdicts"]:
            found.setdefault(verdict["check"], verdict)
        return found


def run_doctor(
    *flags: str,
    launcher: tuple[str, ...] = (),
    env: dict | None = None,
    cwd: Path,
    timeout_s: float = TIMEOUT_S,
    doctor: tuple[str, ...] = tuple(DOCTOR),
) -> DoctorRun:
    command = ["timeout", str(RUN_TIMEOUT_S), *launcher, *doctor, "--timeout", str(timeout_s), *flags]
    completed = subprocess.run(
        command,
        cwd=cwd,
        env=env or job_environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 30,
    )
    return DoctorRun(completed.returncode, completed.stdout, completed.stderr)


def assert_healthy(
    run: DoctorRun, environment: str, rendezvous_dir: Path | None = None, warned: frozenset[str] = frozenset()
) -> dict:
    """Every check of the doctor's JSON passed, except those in ``warned``, which warned."""
    assert run.returncode == 0, run.output[-6000:]
    document = json.loads(run.stdout.strip().splitlines()[-1])
    assert document["ok"] is True
    assert [rank["rank"] for rank in document["ranks"]] == [0, 1]
    for rank in document["ranks"]:
        assert (rank["world_size"], rank["local_rank"], rank["node_rank"]) == (2, rank["rank"], 0)
        assert rank["environment"] == environment
        assert rank["allreduce"]["correct"] is True and rank["allreduce"]["latency_ms"] > 0
    statuses = {verdict["check"]: verdict["status"] for verdict in document["verdicts"]}
    assert statuses["all-reduce"] == "ok" and statuses["tasks-per-node"] == "ok" and statuses["nodes"] == "ok"
    assert {check for check, status in statuses.items() if status != "ok"} == warned, document["verdicts"]
    assert all(statuses[check] == "warn" for check in warned), document["verdicts"]
    if rendezvous_dir is not None:
        assert list(rendezvous_dir.iterdir()) == [], "the doctor leaves no file behind"
    return document


def test_lightning_launcher_healthy_table(tmp_path, rendezvous_dir):
    run = run_doctor("--devices", "2", "--init-method", f"file://{rendezvous_dir}/", cwd=tmp_path)
    assert run.returncode == 0, run.output[-6000:]
    assert "lightning-dist-hooks doctor: 2 ranks, backend gloo, init method file://" in run.stdout
    assert "environment: LightningEnvironment (LOCAL_RANK=0, NODE_RANK=0, WORLD_SIZE=2" in run.stdout
    assert f"ok    shared-directory: every rank sees the same {rendezvous_dir}" in run.stdout
    assert "ok    file-locking: file locks (flock, lockf) work in" in run.stdout
    assert "(the gloo backend, for connections between ranks)" in run.stdout
    assert run.stdout.rstrip().endswith("every check passed")
    assert list(rendezvous_dir.iterdir()) == []


# Lightning's and torch's own warnings during the doctor's Trainer run (issue 30), which used to follow the verdict.
LIGHTNING_WARNINGS = (
    "`isinstance(treespec, LeafSpec)` is deprecated",
    "Using `DistributedSampler` with the dataloaders",
    "The `srun` command is available on your system but is not used",
)


@pytest.mark.parametrize("output", ["table", "json"])
def test_the_report_comes_last_and_lists_lightnings_warnings_before_the_verdicts(tmp_path, rendezvous_dir, output):
    run = run_doctor(
        "--devices",
        "2",
        "--init-method",
        f"file://{rendezvous_dir}/",
        *(["--json"] if output == "json" else []),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.output[-6000:]
    # stderr carries the live lines only: no warning of Lightning's or torch's (formatted "file.py:LINE: ...").
    for text in LIGHTNING_WARNINGS:
        assert text not in run.stderr, run.stderr[-6000:]
    assert not re.search(r"\.py:\d+: ", run.stderr), run.stderr[-6000:]
    if output == "json":
        document = json.loads(run.stdout.strip().splitlines()[-1])  # the last line, as before
        assert document["ok"] is True
        assert any("Using `DistributedSampler` with the dataloaders" in text for text in document["warnings"])
        return
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert lines[-1] == "every check passed", run.stdout[-6000:]
    section, verdicts = run.stdout.index("\nwarnings during the check (rank 0; "), run.stdout.index("\nverdicts:\n")
    assert section < verdicts
    assert (
        "data_connector.py:" in run.stdout[section:verdicts]
        and "Using `DistributedSampler`" in run.stdout[section:verdicts]
    )
    assert not any(text in run.stdout[verdicts:] for text in LIGHTNING_WARNINGS)
    assert list(rendezvous_dir.iterdir()) == []


def test_lightning_launcher_healthy_json_names_the_store_socket(tmp_path, free_port):
    run = run_doctor("--devices", "2", "--init-method", f"tcp://127.0.0.1:{free_port}", "--json", cwd=tmp_path)
    document = assert_healthy(run, "LightningEnvironment")
    rank0 = document["ranks"][0]
    store = {"socket": f"[::]:{free_port}", "opened_by": "torch's TCPStore, the rendezvous store rank 0 serves"}
    assert store in rank0["listening"]
    assert document["verdicts"][0]["status"] == "ok"
    assert {"main-port", "main-address", "host-name", "interfaces"} <= {v["check"] for v in document["verdicts"]}


def test_torchrun(tmp_path, rendezvous_dir):
    run = run_doctor("--init-method", f"file://{rendezvous_dir}/", "--json", cwd=tmp_path, launcher=TORCHRUN)
    assert_healthy(run, "TorchElasticEnvironment", rendezvous_dir)


@pytest.mark.mpi
@needs_openmpi
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_openmpi_mpirun(tmp_path, backend):
    run = run_doctor("--backend", backend, "--json", cwd=tmp_path, launcher=tuple(openmpi_run()))
    # gloo's default init method under mpirun is env://: rank 0 serves a TCP store, which mpi:// would not need.
    document = assert_healthy(run, "OpenMPIEnvironment", warned=frozenset({"mpi-sockets"} if backend == "gloo" else ()))
    assert "OMPI_COMM_WORLD_SIZE" in document["ranks"][1]["evidence"]
    if backend == "gloo":
        verdict = run.verdicts()["mpi-sockets"]
        assert verdict["message"].startswith("torch_dist_backend='gloo' rank 0 serves a TCP rendezvous store (rank 0: ")
        assert verdict["fix"] == "torch_dist_init_method='mpi://': the ranks meet over MPI, and no store listens"
    if backend == "mpi":
        # The mpi4py transport through mpi://: no store, no gloo, so no rank listens on any TCP port.
        assert [rank["init_method"] for rank in document["ranks"]] == ["mpi://", "mpi://"]
        assert [rank["listening"] for rank in document["ranks"]] == [[], []]
        assert "mpi-sockets" in {verdict["check"] for verdict in document["verdicts"]}
    else:
        assert all(rank["listening"] for rank in document["ranks"])


@pytest.mark.mpi
@needs_mpi
def test_mpi_ranks_listening_on_one_node_fail_naming_the_sockets_and_the_mca_fix(tmp_path):
    # Open MPI's tcp transport allowed as well as shared memory (kept on loopback): each rank listens.
    launcher = [part if part != "self,vader" else "self,vader,tcp" for part in openmpi_run()]
    launcher += ["--mca", "btl_tcp_if_include", "lo"]
    run = run_doctor("--backend", "mpi", cwd=tmp_path, launcher=tuple(launcher))
    assert run.returncode == 1, run.output[-6000:]
    assert re.search(
        r"FAIL  mpi-sockets: torch_dist_backend='mpi4py' on one node, yet ranks listen \(rank 0: "
        r"[^;]+:\d+.*; rank 1: .*\): the MPI library opened them",
        run.stdout,
    ), run.stdout
    assert "fix: start with mpirun --mca btl self,vader" in run.stdout


@pytest.mark.mpi
@needs_mpi
def test_gloo_through_mpi_under_plain_mpirun_names_open_mpis_tcp_transport_not_gloo(tmp_path):
    # gloo + mpi://: gloo's sockets are gloo's, the ones MPI's start-up opened are the MPI library's, and fail.
    launcher = [part if part != "self,vader" else "self,vader,tcp" for part in openmpi_run()]
    launcher += ["--mca", "btl_tcp_if_include", "lo"]
    run = run_doctor("--backend", "gloo", "--init-method", "mpi://", cwd=tmp_path, launcher=tuple(launcher))
    assert run.returncode == 1, run.output[-6000:]
    assert "(the MPI library (Open MPI's tcp transport))" in run.stdout, run.stdout
    assert "(the gloo backend, for connections between ranks)" in run.stdout
    assert re.search(
        r"FAIL  mpi-sockets: torch_dist_backend='gloo' on one node, yet ranks listen \(rank 0: "
        r"[^;]+:\d+.*; rank 1: .*\): the MPI library opened them",
        run.stdout,
    ), run.stdout
    assert "every check passed" not in run.stdout


@pytest.mark.mpi
@needs_mpi
def test_the_mpi_transport_through_a_tcp_store_is_warned_of_the_store_not_of_open_mpi(tmp_path, free_port):
    run = run_doctor(
        "--backend",
        "mpi",
        "--init-method",
        f"tcp://127.0.0.1:{free_port}",
        "--json",
        cwd=tmp_path,
        launcher=tuple(openmpi_run()),
    )
    document = assert_healthy(run, "OpenMPIEnvironment", warned=frozenset({"mpi-sockets"}))
    store = {"socket": f"[::]:{free_port}", "opened_by": "torch's TCPStore, the rendezvous store rank 0 serves"}
    assert document["ranks"][0]["listening"] == [store] and document["ranks"][1]["listening"] == []
    verdict = run.verdicts()["mpi-sockets"]
    assert verdict["message"] == (
        f"torch_dist_backend='mpi4py' rank 0 serves a TCP rendezvous store (rank 0: [::]:{free_port}), reachable by "
        "anyone who can reach its node, though MPI already knows every rank"
    )
    assert verdict["fix"] == "torch_dist_init_method='mpi://': the ranks meet over MPI, and no store listens"


@pytest.mark.cluster
def test_srun(slurm_cluster, tmp_path, rendezvous_dir):
    run = run_doctor(
        "--init-method",
        f"file://{rendezvous_dir}/",
        "--json",
        cwd=tmp_path,
        env=slurm_environment(),
        launcher=("srun", "-N1", "--ntasks-per-node=2", "-J", "ldhdoctor", "--kill-on-bad-exit=1"),
    )
    document = assert_healthy(run, "SLURMEnvironment", rendezvous_dir)
    assert document["verdicts"][0]["message"].startswith("2 processes per node (SLURM_STEP_TASKS_PER_NODE=2")


@pytest.mark.cluster
@pytest.mark.mpi
@needs_mpi
def test_srun_mpi_pmix_the_launchers_socket_is_not_mpis(slurm_cluster, tmp_path):
    # SLURM's own launcher, no mpirun: Open MPI kept off TCP, yet every rank holds slurmstepd's PMIx socket, inherited
    # across exec. It is named as the launcher's, and mpi-sockets passes.
    plugins = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30)
    if "pmix" not in plugins.stdout + plugins.stderr:
        pytest.skip("SLURM's mpi/pmix plugin is not installed (Debian: slurm-wlm ships it)")
    env = {**slurm_environment(), "OMPI_MCA_btl": "self,vader"}
    run = run_doctor(
        "--backend",
        "mpi",
        "--json",
        cwd=tmp_path,
        env=env,
        launcher=("srun", "--mpi=pmix", "-N1", "--ntasks-per-node=2", "-J", "ldhdoctor", "--kill-on-bad-exit=1"),
    )
    document = assert_healthy(run, "SLURMEnvironment")
    assert [rank["init_method"] for rank in document["ranks"]] == ["mpi://", "mpi://"]
    launchers = [
        [
            each
            for each in rank["listening"]
            if re.fullmatch(r"inherited from the launcher \(slurmstepd, pid \d+\)", each["opened_by"])
        ]
        for rank in document["ranks"]
    ]
    assert launchers[0] and launchers[0] == launchers[1], document["ranks"]  # one socket, the same in both ranks
    verdict = run.verdicts()["mpi-sockets"]
    assert verdict["status"] == "ok"
    assert verdict["message"].startswith(
        "torch_dist_backend='mpi4py': neither MPI nor a rendezvous store opened a "
        "listening TCP socket; the ranks hold their launcher's, which MPI did not "
        "open: "
    )
    assert f"{launchers[0][0]['socket']}, {launchers[0][0]['opened_by']} by ranks [0, 1]" in verdict["message"]


# A launcher in miniature: a listening socket on loopback, handed to a child across exec (pass_fds), as slurmstepd
# hands its PMIx socket to the ranks; the child reports what the doctor would say of it.
_INHERITING_CHILD = """
import json, os
from lightning_dist_hooks.doctor.sockets import opened_by
from lightning_dist_hooks.listening_sockets import listening_sockets
print(json.dumps({"parent": os.getppid(), "sockets": [
    [str(each), opened_by(each, set(), None)] for each in listening_sockets()]}))
"""
_LAUNCHER = """
import socket, subprocess, sys
with open("/proc/self/comm", "w") as comm:  # the name the child should give
    comm.write("ldh-launcher")
with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    subprocess.run([sys.executable, "-c", sys.argv[1]], pass_fds=[listener.fileno()], check=True)
"""


def test_a_socket_inherited_from_the_parent_is_attributed_to_it(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, _INHERITING_CHILD],
        cwd=tmp_path,
        env=job_environment(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-6000:]
    port, child = run.stdout.splitlines()
    report = json.loads(child)
    assert report["sockets"] == [
        [f"127.0.0.1:{port}", f"inherited from the launcher (ldh-launcher, pid {report['parent']})"]
    ]


# root's launcher, a user's rank: the rank may not list root's descriptors (as a user's rank under root's slurmstepd),
# but the socket belongs to root, so the rank did not open it.
_ROOTS_LAUNCHER = """
import json, os, socket
from lightning_dist_hooks.doctor.sockets import opened_by
from lightning_dist_hooks.listening_sockets import listening_sockets
with open("/proc/self/comm", "w") as comm:
    comm.write("ldh-launcher")
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
if os.fork() == 0:
    os.setgid(65534)
    os.setuid(65534)
    print(json.dumps({"parent": os.getppid(), "sockets": [
        [str(each), opened_by(each, set(), None)] for each in listening_sockets()]}))
    os._exit(0)
os.wait()
"""


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to start a rank as another user")
def test_a_socket_of_roots_launcher_is_attributed_to_it_by_its_owner(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", _ROOTS_LAUNCHER],
        cwd=tmp_path,
        env=job_environment(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-6000:]
    report = json.loads(run.stdout)
    [(address, attribution)] = report["sockets"]
    assert address.startswith("127.0.0.1:")
    assert attribution == (
        f"inherited from the launcher (ldh-launcher, pid {report['parent']}; the socket belongs to "
        "uid 0, not to this rank's user 65534)"
    )


def test_flux_variables(tmp_path, free_port):
    # flux run cannot run here: two tasks with exactly the variables Flux sets, env:// on loopback.
    processes = [
        subprocess.Popen(
            [*DOCTOR, "--timeout", str(TIMEOUT_S), "--json", "--init-method", "env://"],
            cwd=tmp_path,
            env=job_environment(
                FLUX_TASK_RANK=str(rank),
                FLUX_TASK_LOCAL_ID=str(rank),
                FLUX_JOB_SIZE="2",
                FLUX_JOB_NNODES="1",
                FLUX_JOB_ID="f2doctor",
                PMI_RANK=str(rank),
                PMI_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(free_port),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=RUN_TIMEOUT_S) for process in processes]
    run = DoctorRun(max(process.returncode for process in processes), *outputs[0])
    # Flux's PMI sets PMI_RANK: an MPI launch, where env://'s TCP store is one that mpi:// would not need.
    assert_healthy(run, "FluxEnvironment", warned=frozenset({"mpi-sockets"}))
    assert run.verdicts()["tasks-per-node"]["message"] == (
        "2 processes per node (FLUX_JOB_NNODES=1, FLUX_JOB_SIZE=2), as devices"
    )
    assert run.verdicts()["mpi-sockets"]["message"] == (
        f"torch_dist_backend='gloo' rank 0 serves a TCP rendezvous store (rank 0: [::]:{free_port}), reachable by "
        "anyone who can reach its node, though MPI already knows every rank"
    )


def test_tasks_per_node_different_from_devices(tmp_path):
    # torchrun starts 2 processes; the job asks for 3 devices. The doctor still meets with the 2 that exist.
    run = run_doctor("--devices", "3", "--json", cwd=tmp_path, launcher=TORCHRUN)
    assert run.returncode == 1, run.output[-6000:]
    verdict = run.verdicts()["tasks-per-node"]
    assert verdict["status"] == "fail"
    assert verdict["message"] == (
        "the launcher started 2 processes per node (LOCAL_WORLD_SIZE=2, WORLD_SIZE=2), but the job asks for devices=3"
    )
    assert verdict["fix"].startswith("start 3 tasks per node (srun --ntasks-per-node=3, torchrun --nproc-per-node=3")
    assert run.verdicts()["all-reduce"]["status"] == "ok"


def test_node_count_different_from_num_nodes(tmp_path):
    run = run_doctor("--num-nodes", "2", "--json", cwd=tmp_path, launcher=TORCHRUN)
    assert run.returncode == 1, run.output[-6000:]
    verdict = run.verdicts()["nodes"]
    assert verdict["message"] == (
        "the launcher started processes on 1 node(s) (LOCAL_WORLD_SIZE=2, WORLD_SIZE=2), but "
        "the job asks for num_nodes=2"
    )


def test_main_port_in_use_gives_its_verdict_although_the_rendezvous_fails(tmp_path, busy_port):
    run = run_doctor(
        "--devices", "2", "--init-method", f"tcp://127.0.0.1:{busy_port}", cwd=tmp_path, timeout_s=FAILING_TIMEOUT_S
    )
    assert run.returncode == 1, run.output[-6000:]
    assert "no rendezvous, so these are this rank's own findings only" in run.stdout
    assert (
        f"FAIL  main-port: port {busy_port}, where rank 0's store must listen, is already in use on its host, "
        f"held by {os.getpid()} ("
    ) in run.stdout
    assert "fix: choose a free port (MASTER_PORT=..., or tcp://HOST:FREE_PORT), or stop what holds it" in run.stdout
    assert "FAIL  rendezvous: DistributedSetupError: " in run.stdout and "EADDRINUSE" in run.stdout


def test_a_rank_stuck_inside_torch_past_the_timeout_reports_its_findings_and_exits(tmp_path):
    # Rank 1 of a Flux job whose rank 0's port is held by a process that never accepts: torch 2.13's TCPStore client
    # waits there forever, whatever the timeout.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        env = job_environment(
            FLUX_TASK_RANK="1",
            FLUX_TASK_LOCAL_ID="1",
            FLUX_JOB_SIZE="2",
            FLUX_JOB_NNODES="1",
            FLUX_JOB_ID="f2stuck",
            PMI_RANK="1",
            PMI_SIZE="2",
        )
        run = run_doctor("--init-method", f"tcp://127.0.0.1:{port}", cwd=tmp_path, env=env, timeout_s=FAILING_TIMEOUT_S)
    assert run.returncode == 1, run.output[-6000:]
    assert "lightning-dist-hooks doctor: rank 1 of 2" in run.stdout, run.output[-6000:]
    assert (
        f"FAIL  rendezvous: TimeoutError: [lightning_dist_hooks] rank 1 of 2: the rendezvous through "
        f"tcp://127.0.0.1:{port} has not returned 10 s after its {FAILING_TIMEOUT_S} s timeout: it is stuck "
        "inside torch"
    ) in run.stdout, run.output[-6000:]


def test_mpi4py_missing_for_the_mpi_backend(tmp_path):
    shadow = tmp_path / "shadow" / "mpi4py"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('mpi4py hidden by the test')\n")
    env = job_environment()
    env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), env["PYTHONPATH"]])
    run = run_doctor("--backend", "mpi", cwd=tmp_path, env=env)
    assert run.returncode == 1, run.output[-6000:]
    assert ("FAIL  mpi4py: torch_dist_backend='mpi' needs mpi4py, which this Python cannot import") in run.stdout
    assert (
        'fix: pip install "mpi4py>=4.0,<5" (from a clone of lightning-dist-hooks: pip install ".[mpi]"), in the '
        "environment every rank"
    ) in run.stdout


def test_a_rendezvous_directory_anyone_can_write_is_not_private(tmp_path, rendezvous_dir):
    rendezvous_dir.chmod(0o777)  # world-writable, no sticky bit
    run = run_doctor("--devices", "2", "--init-method", f"file://{rendezvous_dir}/", cwd=tmp_path)
    assert run.returncode == 1, run.output[-6000:]
    owner = pwd.getpwuid(os.geteuid()).pw_name
    assert (
        f"FAIL  private: {rendezvous_dir} (owner {owner}, mode drwxrwxrwx) is writable by every user and not "
        "sticky: anyone can replace the rendezvous files in it"
    ) in run.stdout
    assert f"fix: chmod +t {rendezvous_dir} (or o-w), or use a directory of your own" in run.stdout


def test_a_filesystem_without_file_locks(tmp_path, rendezvous_dir, flock_shim):
    # An LD_PRELOAD shim makes flock() fail with ENOLCK under the rendezvous directory, for the doctor's probe and
    # torch's FileStore alike: what a filesystem mounted without locking does.
    env = job_environment(LD_PRELOAD=str(flock_shim), LDH_NOLOCK_DIR=str(rendezvous_dir))
    run = run_doctor(
        "--devices",
        "2",
        "--init-method",
        f"file://{rendezvous_dir}/",
        cwd=tmp_path,
        env=env,
        timeout_s=FAILING_TIMEOUT_S,
    )
    assert run.returncode == 1, run.output[-6000:]
    assert (
        f"FAIL  file-locking: the filesystem of {rendezvous_dir} refuses file locks (flock: No locks available), "
        "which torch's FileStore needs"
    ) in run.stdout
    assert (
        f"fix: use dir://{rendezvous_dir}/ instead of file:// (it needs no file locks), mount the filesystem with "
        "locking (NFS: without 'nolock'; Lustre: -o flock)"
    ) in run.stdout


def test_dir_needs_no_file_locks(tmp_path, rendezvous_dir, flock_shim):
    # The same filesystem without locks: dir:// never takes one, so the doctor passes it and the ranks meet.
    env = job_environment(LD_PRELOAD=str(flock_shim), LDH_NOLOCK_DIR=str(rendezvous_dir))
    run = run_doctor("--devices", "2", "--init-method", f"dir://{rendezvous_dir}/", cwd=tmp_path, env=env)
    assert run.returncode == 0, run.output[-6000:]
    assert f"ok    file-locking: dir:// takes no file locks, so it needs none in {rendezvous_dir}" in run.stdout
    assert f"ok    shared-directory: every rank sees the same {rendezvous_dir}" in run.stdout
    assert run.stdout.rstrip().endswith("every check passed")
    assert list(rendezvous_dir.iterdir()) == []


def _torchrun_rank(rank: int, world_size: int, local_world_size: int, port: int) -> dict[str, str]:
    """The variables torchrun sets for one worker (one agent per node, started by hand)."""
    return job_environment(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % local_world_size),
        LOCAL_WORLD_SIZE=str(local_world_size),
        GROUP_RANK=str(rank // local_world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_RUN_ID="doctor-test",
        TORCHELASTIC_RESTART_COUNT="0",
    )


# Runs a command under the host name "localhost" (its own UTS namespace), which resolves to 127.0.0.1 everywhere.
AS_LOCALHOST = ("unshare", "-u", "sh", "-c", 'hostname localhost && exec "$@"', "sh")
needs_namespaces = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root and unshare"
)


@pytest.mark.root
@needs_namespaces
def test_host_name_resolving_to_loopback_while_ranks_span_nodes(tmp_path, free_port):
    # Two "nodes" of one rank each, as two torchrun agents give them, on a host named localhost.
    processes = [
        subprocess.Popen(
            [*AS_LOCALHOST, *DOCTOR, "--timeout", str(TIMEOUT_S), "--num-nodes", "2", "--devices", "1", "--json"],
            cwd=tmp_path,
            env=_torchrun_rank(rank, 2, 1, free_port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=RUN_TIMEOUT_S) for process in processes]
    run = DoctorRun(processes[0].returncode, *outputs[0])
    assert [process.returncode for process in processes] == [1, 1], run.output[-6000:]
    assert run.verdicts()["host-name"]["status"] == "fail"
    assert "resolve to a loopback address while the ranks span nodes" in run.verdicts()["host-name"]["message"]
    assert run.verdicts()["main-address"]["message"] == (
        "the main address '127.0.0.1' is a loopback address, which other nodes cannot reach"
    )
    assert outputs[1][0] == "", "only rank 0 prints the report"


@pytest.mark.root
@needs_namespaces
def test_a_rendezvous_directory_that_differs_between_nodes(tmp_path, rendezvous_dir, free_port):
    # Rank 1 sees its own (empty) tmpfs at the same path, as a node-local directory would be.
    command = [
        *DOCTOR,
        "--timeout",
        str(FAILING_TIMEOUT_S),
        "--init-method",
        f"file://{rendezvous_dir}/",
        "--devices",
        "1",
        "--num-nodes",
        "2",
    ]
    rank1 = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs doctor-test "{rendezvous_dir}" && exec "$@"',
        "sh",
        *command,
    ]
    processes = [
        subprocess.Popen(
            launch,
            cwd=tmp_path,
            env=_torchrun_rank(rank, 2, 1, free_port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, launch in ((0, command), (1, rank1))
    ]
    outputs = [process.communicate(timeout=RUN_TIMEOUT_S) for process in processes]
    assert [process.returncode for process in processes] == [1, 1], outputs
    stdout0, stderr0 = outputs[0]
    private = rendezvous_dir / f"ldh-uid-{os.geteuid()}"  # the tokens sit beside the file, in the per-user directory
    assert (
        f"FAIL  shared-directory: {private} holds the doctor's tokens of ranks [0] only: ranks [1] never "
        "started, gave up already, or wrote theirs to a different directory of that name on their node"
    ) in stdout0
    assert f"FAIL  shared-directory: {private} holds the doctor's tokens of ranks [1] only" in outputs[1][0]
    assert "ranks that never arrived: [1]" in stdout0
    # The live line, while rank 0 waited for a rank that could never come, naming the file really used (issue 30).
    assert f"rank 0: waiting for 1 of 2 ranks ([1]) through file://{private}/ldh-rendezvous-" in stderr0
    assert list(rendezvous_dir.iterdir()) == []


def test_a_doctor_killed_while_it_waits_leaves_nothing_behind(tmp_path, rendezvous_dir, free_port):
    # Lightning's launcher SIGKILLs its main process (rank 0) within seconds of a child rank's failure: a rank 0
    # still waiting then never removes its token itself. Here both ranks wait for ranks 2 and 3, which never come,
    # and are killed together.
    private = rendezvous_dir / f"ldh-uid-{os.geteuid()}"
    tokens = [private / f".ldh-doctor-doctor42.rank{rank}" for rank in (0, 1)]
    environment = job_environment(NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port))
    flags = [
        "--timeout",
        str(TIMEOUT_S),
        "--init-method",
        f"file://{rendezvous_dir}/doctor42",
        "--devices",
        "2",
        "--num-nodes",
        "2",
    ]
    doctor = subprocess.Popen(
        [*DOCTOR, *flags],
        cwd=tmp_path,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not all(token.exists() for token in tokens):
            assert doctor.poll() is None and time.monotonic() < deadline, "both ranks leave their tokens"
            time.sleep(0.2)
    finally:
        os.killpg(doctor.pid, signal.SIGKILL)  # both ranks: the child rank is in its launcher's process group
        doctor.wait()
    assert wait_until_empty(rendezvous_dir) == [], "the janitors remove the ranks' files, tokens and private directory"


@pytest.mark.root
@pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("ip") is None or os.geteuid() != 0,
    reason="needs root, unshare and ip",
)
def test_several_interfaces_without_gloo_socket_ifname_is_a_warning(tmp_path):
    # A veth pair, both ends in the new namespace: two interfaces with an address each, connected to nothing else.
    # Named localhost: gloo without GLOO_SOCKET_IFNAME binds the address the host name resolves to (127.0.0.1).
    network = (
        "hostname localhost && ip link set lo up && ip link add ldhd0 type veth peer name ldhd1 && "
        "ip addr add 198.18.0.1/24 dev ldhd0 && ip addr add 198.18.1.1/24 dev ldhd1 && "
        'ip link set ldhd0 up && ip link set ldhd1 up && exec "$@"'
    )
    env = job_environment()
    del env["GLOO_SOCKET_IFNAME"]
    run = run_doctor(
        "--devices", "2", "--json", cwd=tmp_path, env=env, launcher=("unshare", "-n", "-u", "sh", "-c", network, "sh")
    )
    assert run.returncode == 0, run.output[-6000:]
    verdict = run.verdicts()["interfaces"]
    assert verdict["status"] == "warn"
    assert verdict["message"].startswith(
        "this host has several interfaces (ldhd0 198.18.0.1, ldhd1 198.18.1.1) and GLOO_SOCKET_IFNAME is not set"
    )
    assert verdict["fix"] == "export GLOO_SOCKET_IFNAME=<the interface the nodes share> to every rank"


def test_a_trainer_that_cannot_be_built_is_a_verdict(tmp_path):
    run = run_doctor("--devices", "2", "--init-method", f"file://{tmp_path}/missing/", cwd=tmp_path)
    assert run.returncode == 1, run.output[-6000:]
    assert (
        f"FAIL  trainer: ValueError: torch_dist_init_method='file://{tmp_path}/missing/': the directory "
        f"'{tmp_path}/missing' does not exist."
    ) in run.stdout


def test_the_console_script_and_the_module_run_the_same_main():
    setup = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    assert '"lightning-dist-hooks-doctor=lightning_dist_hooks.doctor:main"' in setup
    usage = subprocess.run(
        [sys.executable, "-m", "lightning_dist_hooks"], capture_output=True, text=True, env=job_environment()
    )
    assert usage.returncode == 2 and "usage: python -m lightning_dist_hooks {doctor}" in usage.stderr


def test_the_module_lists_its_commands_with_help_and_says_its_version():
    from lightning_dist_hooks import __version__

    def run(*arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lightning_dist_hooks", *arguments], capture_output=True,
                              text=True, env=job_environment())  # fmt: skip

    listed = run("--help")
    assert listed.returncode == 0 and listed.stderr == "", listed
    assert "\n  doctor  check that a job's ranks can meet and all-reduce" in listed.stdout
    version = run("--version")
    assert (version.returncode, version.stdout) == (0, f"lightning-dist-hooks {__version__}\n")


# A scheme a user registers, written against the public API only: it meets through a FileStore file in the
# directory it names, and says so through the handler's questions, which is all the doctor asks.
_USER_SCHEME_DOCTOR = """
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit
from lightning_dist_hooks import InitMethod, Rendezvous, register_init_method
from lightning_dist_hooks.doctor import main

class ScratchInitMethod(InitMethod):
    scheme = "scratch"
    needs_file_locks = True  # it meets through torch's FileStore

    def shared_directory(self, url):
        return Path(urlsplit(url).path)

    def resolve(self, url, cluster_environment, num_nodes):
        return url.rstrip("/") + "/meet"

    def meeting_path(self, url):
        return Path(urlsplit(url).path)

    def prepare(self, url, cluster_environment):
        path = urlsplit(url).path
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))  # private before torch's FileStore opens it
        return Rendezvous(f"file://{path}")

    def finish(self, rendezvous):
        Path(urlsplit(rendezvous.init_method).path).unlink(missing_ok=True)

register_init_method(ScratchInitMethod())
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("mode", [0o700, 0o777])
def test_a_scheme_the_user_registers_gets_the_same_checks(tmp_path, mode):
    directory = tmp_path / "meet"
    directory.mkdir()
    directory.chmod(mode)
    script = tmp_path / "doctor_with_scratch.py"
    script.write_text(_USER_SCHEME_DOCTOR)
    run = run_doctor(
        "--devices",
        "2",
        "--backend",
        "gloo",
        "--init-method",
        f"scratch://{directory}/",
        "--json",
        cwd=tmp_path,
        doctor=(sys.executable, str(script)),
    )
    verdicts = run.verdicts()
    assert verdicts["file-locking"]["status"] == "ok", verdicts
    assert str(directory) in verdicts["file-locking"]["message"]
    assert [rank["rendezvous_file"] for rank in json.loads(run.stdout.strip().splitlines()[-1])["ranks"]] == [
        f"{directory}/meet"
    ] * 2
    if mode == 0o700:
        assert_healthy(run, "LightningEnvironment")
    else:  # the directory check the doctor makes for file:// holds for the user's scheme too
        assert run.returncode == 1
        assert verdicts["private"]["status"] == "fail" and "writable by every user" in verdicts["private"]["message"]
