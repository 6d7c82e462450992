"""Helpers shared by the tests: launching real jobs and reading what each rank recorded."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIT_JOB = REPO / "tests" / "jobs" / "fit_job.py"

# Variables a surrounding launcher (an srun shell, torchrun, mpirun) may have set; a test that starts its
# own job must not inherit them, or Lightning would detect the wrong cluster environment.
_LAUNCHER_VARIABLE_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "FLUX_", "PALS_", "LSB_",
                               "JSM_", "MV2_", "PBS_")
_LAUNCHER_VARIABLES = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK",
                       "LOCAL_WORLD_SIZE",
                       "LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN"}


def job_environment(**overrides: str) -> dict[str, str]:
    """A clean environment for a job: loopback only, this checkout importable, no launcher variables."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(_LAUNCHER_VARIABLE_PREFIXES) and key not in _LAUNCHER_VARIABLES}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


@dataclass
class JobResult:
    returncode: int
    output: str
    out_dir: Path
    ranks: dict[int, dict] = field(default_factory=dict)

    def assert_ok(self) -> "JobResult":
        assert self.returncode == 0, f"job failed with exit code {self.returncode}:\n{self.output[-6000:]}"
        return self

    def same_on_all_ranks(self, key: str):
        values = {rank: record[key] for rank, record in self.ranks.items()}
        assert len(set(map(json.dumps, values.values()))) == 1, f"{key} differs across ranks: {values}"
        return next(iter(values.values()))


def run_command(command: list[str], cwd: Path, out_dir: Path, timeout: float = 240, env: dict | None = None) -> JobResult:
    """Run ``command`` to completion (killed after ``timeout`` s) and collect the rank records in ``out_dir``."""
    try:
        completed = subprocess.run(command, cwd=cwd, env=env or job_environment(), timeout=timeout,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"{command} did not finish in {timeout} s:\n{(expired.output or '')[-6000:]}") from None
    ranks = {}
    if out_dir.is_dir():
        for record in out_dir.glob("rank*.json"):
            data = json.loads(record.read_text())
            ranks[data["rank"]] = data
    return JobResult(completed.returncode, completed.stdout, out_dir, ranks)


@pytest.fixture
def run_job(tmp_path: Path):
    """``run_job(*flags)`` runs tests/jobs/fit_job.py with those flags (Lightning's own launcher)."""
    counter = iter(range(1000))

    def run(*flags: str, timeout: float = 240, env: dict | None = None) -> JobResult:
        out_dir = tmp_path / f"job{next(counter)}"
        command = [sys.executable, str(FIT_JOB), "--out", str(out_dir), *flags]
        return run_command(command, cwd=tmp_path, out_dir=out_dir, timeout=timeout, env=env)

    return run


@pytest.fixture
def busy_port():
    """A loopback port held by a listening socket that never accepts: nothing else can bind or use it."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(0)
        yield holder.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(rank_environments: list[dict[str, str]], flags: list[str], out_dir: Path, cwd: Path,
              timeout: float = 180) -> JobResult:
    """Start tests/jobs/fit_job.py once per rank with that rank's environment, as an emulated launcher would."""
    logs = [cwd / f"rank{rank}.log" for rank in range(len(rank_environments))]
    processes = []
    for environment, log in zip(rank_environments, logs):
        with open(log, "w") as output:
            processes.append(subprocess.Popen([sys.executable, str(FIT_JOB), "--out", str(out_dir), *flags], cwd=cwd,
                                              env=environment, stdout=output, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL))
    try:
        returncodes = [process.wait(timeout=timeout) for process in processes]
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
            process.wait(timeout=30)
        raise AssertionError(f"the ranks did not finish in {timeout} s:\n" + _tails(logs)) from None
    ranks = {}
    for record in out_dir.glob("rank*.json") if out_dir.is_dir() else ():
        data = json.loads(record.read_text())
        ranks[data["rank"]] = data
    return JobResult(max(returncodes, key=abs), _tails(logs), out_dir, ranks)


def _tails(logs: list[Path]) -> str:
    return "\n".join(f"===== {log.name}\n{log.read_text()[-4000:]}" for log in logs)


def _slurm_daemons_alive(state_dir: Path) -> bool:
    for name in ("slurmctld", "slurmd", "munged"):
        try:
            pid = (state_dir / f"{name}.pid").read_text().strip()
            if Path(f"/proc/{pid}/comm").read_text().strip() != name:
                return False
        except OSError:
            return False
    return True


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running single-node SLURM (.ci/slurm-up.sh); stopped at the end only if this session started it."""
    missing = [command for command in ("srun", "sbatch", "slurmctld", "slurmd", "munged") if shutil.which(command) is None]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing); .ci/install installs slurm-wlm and munge")
    if os.geteuid() != 0:
        pytest.skip("starting the test SLURM cluster (.ci/slurm-up.sh) needs root")
    state_dir = Path(os.environ.get("LDH_SLURM_DIR", "/tmp/ldh-slurm"))
    started_here = not _slurm_daemons_alive(state_dir)
    up = subprocess.run(["bash", str(REPO / ".ci" / "slurm-up.sh")], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, f".ci/slurm-up.sh failed:\n{up.stdout}\n{up.stderr}"
    yield state_dir
    if started_here:
        subprocess.run(["bash", str(REPO / ".ci" / "slurm-down.sh")], capture_output=True, timeout=120)
