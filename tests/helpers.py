"""What the tests share, other than fixtures (those are in conftest.py): starting real jobs in a clean environment,
reading what each rank recorded, the launcher commands, skip markers for what this machine lacks, and the two
Lightning packages for tests that run with each."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
from jobs.sockets import listening_tcp_ports
from lightning_fabric.plugins.environments import LightningEnvironment

from lightning_dist_hooks import mpi
from lightning_dist_hooks.launcher_variables import without_launcher_variables
from lightning_dist_hooks.supported_versions import MPI_TRANSPORT_TORCH

REPO = Path(__file__).resolve().parents[1]
FIT_JOB = REPO / "tests" / "jobs" / "fit_job.py"


def job_environment(**overrides: str) -> dict[str, str]:
    """A clean environment for a job: loopback only, this checkout importable, no launcher variables (a
    surrounding srun shell, torchrun or mpirun would otherwise make Lightning detect the wrong cluster)."""
    env = without_launcher_variables(os.environ)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


def slurm_environment() -> dict[str, str]:
    """``job_environment`` for srun/sbatch. Loopback only: Lightning's SLURMEnvironment takes MASTER_ADDR over the
    node name (needed by env:// only)."""
    return job_environment(MASTER_ADDR="127.0.0.1")


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class JobResult:
    returncode: int
    output: str
    out_dir: Path
    ranks: dict[int, dict] = field(default_factory=dict)

    def assert_ok(self) -> JobResult:
        assert self.returncode == 0, f"job failed with exit code {self.returncode}:\n{self.output[-6000:]}"
        return self

    def same_on_all_ranks(self, key: str):
        values = {rank: record[key] for rank, record in self.ranks.items()}
        assert len(set(map(json.dumps, values.values()))) == 1, f"{key} differs across ranks: {values}"
        return next(iter(values.values()))


def _rank_records(out_dir: Path) -> dict[int, dict]:
    ranks = {}
    for record in out_dir.glob("rank*.json") if out_dir.is_dir() else ():
        data = json.loads(record.read_text())
        ranks[data["rank"]] = data
    return ranks


def run_command(
    command: list[str], cwd: Path, out_dir: Path, timeout: float = 240, env: dict | None = None
) -> JobResult:
    """Run ``command`` to completion (killed after ``timeout`` s) and collect the rank records in ``out_dir``."""
    try:
        completed = subprocess.run(
            command,
            cwd=cwd,
            env=env or job_environment(),
            timeout=timeout,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"{command} did not finish in {timeout} s:\n{(expired.output or '')[-6000:]}") from None
    return JobResult(completed.returncode, completed.stdout, out_dir, _rank_records(out_dir))


def run_ranks(
    rank_environments: list[dict[str, str]], flags: list[str], out_dir: Path, cwd: Path, timeout: float = 180
) -> JobResult:
    """Start tests/jobs/fit_job.py once per rank with that rank's environment, as an emulated launcher would."""
    logs = [cwd / f"rank{rank}.log" for rank in range(len(rank_environments))]
    processes = []
    for environment, log in zip(rank_environments, logs, strict=True):
        with open(log, "w") as output:
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(FIT_JOB), "--out", str(out_dir), *flags],
                    cwd=cwd,
                    env=environment,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
    try:
        returncodes = [process.wait(timeout=timeout) for process in processes]
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
            process.wait(timeout=30)
        raise AssertionError(f"the ranks did not finish in {timeout} s:\n" + _tails(logs)) from None
    return JobResult(max(returncodes, key=abs), _tails(logs), out_dir, _rank_records(out_dir))


def _tails(logs: list[Path]) -> str:
    return "\n".join(f"===== {log.name}\n{log.read_text()[-4000:]}" for log in logs)


class Rank(LightningEnvironment):
    """What a rendezvous handler asks of its cluster environment: this process's global rank and the world size (a
    ClusterEnvironment, as the handlers' signatures say; nothing else of it is asked)."""

    def __init__(self, rank: int, world_size: int = 2) -> None:
        super().__init__()
        self.rank, self.size = rank, world_size

    def global_rank(self) -> int:
        return self.rank

    def world_size(self) -> int:
        return self.size


def _open_mpi_mpirun() -> str | None:
    """Open MPI's mpirun: Debian's ``mpirun.openmpi``, or an ``mpirun`` that says it is Open MPI."""
    if shutil.which("mpirun.openmpi"):
        return shutil.which("mpirun.openmpi")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return None
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    return mpirun if "Open MPI" in version else None


OPENMPI_MPIRUN = _open_mpi_mpirun()
needs_openmpi = pytest.mark.skipif(OPENMPI_MPIRUN is None, reason="OpenMPI's mpirun is not installed (.ci/install)")
TORCH_FITS_THE_MPI_TRANSPORT = mpi.torch_fits_the_transport()
needs_transport_torch = pytest.mark.skipif(
    not TORCH_FITS_THE_MPI_TRANSPORT, reason=f"the MPI transport needs torch{MPI_TRANSPORT_TORCH}"
)
needs_mpi = pytest.mark.skipif(
    OPENMPI_MPIRUN is None or not mpi.is_available() or not TORCH_FITS_THE_MPI_TRANSPORT,
    reason="needs Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev), mpi4py (pip install mpi4py) and "
    f"torch{MPI_TRANSPORT_TORCH} for the MPI transport",
)


def openmpi_run(ranks: int = 2) -> list[str]:
    """``mpirun -n RANKS`` kept on loopback (TCP out-of-band, shared memory between ranks), as root too."""
    assert OPENMPI_MPIRUN is not None, "mark the test with needs_openmpi or needs_mpi"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [
        OPENMPI_MPIRUN,
        "-n",
        str(ranks),
        *root,
        "--oversubscribe",
        "--mca",
        "oob_tcp_if_include",
        "lo",
        "--mca",
        "btl",
        "self,vader",
        "-x",
        "GLOO_SOCKET_IFNAME=lo",
        "-x",
        "PYTHONPATH",
    ]


# Jobs of tests/mpi/*.py under mpirun: what they share with the tests is tests/mpi/_setup.py (RankReport,
# pause_for_inspection, init_from_mpi_launch's MPI_TEST_PORT).
MPI_JOBS = REPO / "tests" / "mpi"


def mpi_job_environment(**overrides: str) -> dict[str, str]:
    """``job_environment`` with ``MPI_TEST_PORT``: a free port for gloo's TCP store (``init_from_mpi_launch``)."""
    return job_environment(MPI_TEST_PORT=str(free_port()), **overrides)


def mpirun_command(script: str | Path, *args: str, ranks: int = 2, timeout_s: float = 240) -> list[str]:
    """``mpirun -n RANKS python SCRIPT ARGS`` (SCRIPT: a name in tests/mpi/, or a path), killed after ``timeout_s``."""
    mpirun = [*openmpi_run(ranks), sys.executable, str(MPI_JOBS / script), *args]
    return ["timeout", "-k", "10", str(timeout_s), *mpirun]  # mpirun kills the ranks when it is killed


def rank_reports(report_dir: Path) -> dict[int, list[str]]:
    """Rank -> the lines it reported (``_setup.RankReport``: ``REPORT_DIR/rank-R.txt``)."""
    return {
        int(path.stem.removeprefix("rank-")): path.read_text().splitlines() for path in report_dir.glob("rank-*.txt")
    }


@dataclass(frozen=True)
class MpiJob:
    returncode: int
    output: str  # stdout and stderr of mpirun and every rank, together
    reports: dict[int, list[str]]  # rank_reports(report_dir), empty without one
    listening: dict[int, set[int]]  # with pause_dir: rank -> the TCP ports it listened on while paused


def run_mpi_job(
    script: str | Path,
    *args: str,
    ranks: int = 2,
    timeout_s: float = 240,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    report_dir: Path | None = None,
    pause_dir: Path | None = None,
) -> MpiJob:
    """Run ``script`` under ``mpirun -n RANKS`` to its end (``mpirun_command``) in ``env`` (``mpi_job_environment()``).

    With ``pause_dir``, the job is one that pauses every rank (``_setup.pause_for_inspection``): once every rank
    wrote its pid there, each rank's listening TCP ports are read, then the job resumes.
    """
    command = mpirun_command(script, *args, ranks=ranks, timeout_s=timeout_s)
    listening: dict[int, set[int]] = {}
    with subprocess.Popen(
        command,
        cwd=cwd,
        env=env or mpi_job_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as job:
        try:
            if pause_dir is not None:
                listening = _listening_while_paused(job, pause_dir, ranks, timeout_s)
            output, _ = job.communicate(timeout=timeout_s + 30)
        except subprocess.TimeoutExpired:
            job.kill()
            raise AssertionError(
                f"{command} did not finish in {timeout_s + 30} s:\n{job.communicate()[0][-6000:]}"
            ) from None
        finally:
            if job.poll() is None:
                job.kill()
    return MpiJob(job.returncode, output, rank_reports(report_dir) if report_dir else {}, listening)


def _listening_while_paused(
    job: subprocess.Popen, pause_dir: Path, ranks: int, timeout_s: float
) -> dict[int, set[int]]:
    deadline = time.monotonic() + timeout_s
    pid_files = [pause_dir / f"rank{rank}.pid" for rank in range(ranks)]
    assert job.stdout is not None  # run_mpi_job starts it with stdout=PIPE
    while not all(path.exists() for path in pid_files):
        assert job.poll() is None, f"the job ended before pausing:\n{job.stdout.read()[-6000:]}"
        assert time.monotonic() < deadline, f"the job did not pause within {timeout_s} s"
        time.sleep(0.05)
    listening = {rank: listening_tcp_ports(int(path.read_text())) for rank, path in enumerate(pid_files)}
    (pause_dir / "resume").touch()
    return listening


# The two Lightning packages, for tests that run once with each (those that touch Lightning's objects).
@dataclass(frozen=True)
class Package:
    """One Lightning package and this project's module for it."""

    name: str  # the --package value of tests/jobs/*.py
    pytorch_module: str
    fabric_module: str
    ours_module: str

    @property
    def pl(self) -> ModuleType:
        """``pytorch_lightning`` or ``lightning.pytorch``."""
        return importlib.import_module(self.pytorch_module)

    @property
    def fabric(self) -> ModuleType:
        return importlib.import_module(self.fabric_module)

    @property
    def ours(self) -> ModuleType:
        """``lightning_dist_hooks`` or ``lightning_dist_hooks.lightning``."""
        return importlib.import_module(self.ours_module)


PYTORCH_LIGHTNING = Package("pytorch_lightning", "pytorch_lightning", "lightning_fabric", "lightning_dist_hooks")
LIGHTNING = Package("lightning", "lightning.pytorch", "lightning.fabric", "lightning_dist_hooks.lightning")
BOTH = (PYTORCH_LIGHTNING, LIGHTNING)

both_packages = pytest.mark.parametrize("package", BOTH, ids=[package.name for package in BOTH])


def processes_mentioning(text: str) -> dict[int, str]:
    """PID → command line of every live process whose command line contains ``text`` (a path unique to a test)."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited while we looked
        if text in command:
            found[int(cmdline.parent.name)] = command
    return found


def wait_until_empty(directory: Path, within_s: float = 10) -> list[Path]:
    """Everything left in ``directory``, however deep, once it is empty or ``within_s`` has passed (a janitor's
    removal may land just after its rank is gone)."""
    deadline = time.monotonic() + within_s
    while (left := sorted(directory.rglob("*"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
