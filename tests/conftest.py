"""Fixtures shared by the tests; everything else they share is in tests/helpers.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from cluster import EmulatedCluster, cluster_down, cluster_up
from helpers import FIT_JOB, REPO, JobResult, run_command

# Scripts that the tests run as jobs (under mpirun, or as a rank): --doctest-modules must not import them here.
collect_ignore = ["jobs", "mpi"]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under .ci/compat the tests must exercise the installed wheel or sdist, not a source tree beside them."""
    if os.environ.get("LDH_TEST_INSTALLED_PACKAGE") == "1":
        import lightning_dist_hooks

        location = Path(lightning_dist_hooks.__file__).resolve()
        assert Path(sys.prefix).resolve() in location.parents and REPO not in location.parents, (
            f"LDH_TEST_INSTALLED_PACKAGE=1, but lightning_dist_hooks was imported from {location}, not from the "
            f"environment {sys.prefix}"
        )


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
    return helpers.free_port()


@pytest.fixture
def rendezvous_dir(tmp_path: Path) -> Path:
    """An empty directory for ``file:///DIR/`` rendezvous files; tests assert that it is empty again at the end."""
    directory = tmp_path / "rendezvous"
    directory.mkdir()
    return directory


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


@pytest.fixture(scope="session")
def emulated_cluster():
    """Two emulated nodes (.ci/cluster-up.sh), with a SLURM of them when SLURM is installed; removed at the end of
    the session, whatever the tests did (leftovers of a killed session are removed first)."""
    if os.geteuid() != 0:
        pytest.skip("the emulated cluster (.ci/cluster-up.sh) creates network namespaces, which needs root")
    missing = [command for command in ("ip", "nsenter", "unshare") if shutil.which(command) is None]
    if missing:
        pytest.skip(f"the emulated cluster needs {', '.join(missing)} (.ci/install installs iproute2 and util-linux)")
    slurm = all(shutil.which(command) for command in ("srun", "sbatch", "slurmctld", "slurmd", "munged"))
    directory = Path(os.environ.get("LDH_CLUSTER_DIR", "/tmp/ldh-cluster"))
    cluster = cluster_up(directory, slurm=slurm)
    try:
        yield cluster
    finally:
        cluster_down(directory)
