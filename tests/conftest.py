"""Fixtures shared by the tests; everything else they share is in tests/helpers.py."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
from _pytest.doctest import DoctestItem
from cluster import cluster_down, cluster_up
from helpers import FIT_JOB, REPO, JobResult, run_command
from run_locks import holding, restore_everything_recorded, shared_run_directory
from typing_extensions import override
from xdist.scheduler import LoadScopeScheduling

# Scripts that the tests run as jobs (under mpirun, or as a rank): --doctest-modules must not import them here.
collect_ignore = ["jobs", "mpi"]


# Test tiers (pytest.ini declares them). Every test has exactly one speed tier: ``unit`` (in this process, starts no
# process: ``python3 -m pytest -m unit`` runs them all in under a minute) or ``slow`` (starts processes: training
# jobs, launchers, fresh interpreters, the rendezvous janitor). What a test needs of the machine is marked besides:
# ``mpi``, ``gpu``, ``root``, ``cluster`` (which implies ``root``); those tests are ``slow``.
SPEED_TIERS = ("unit", "slow")
NEEDS = ("mpi", "gpu", "root", "cluster")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give doctests their tier (``unit``); refuse a test without exactly one speed tier, or a unit test that needs
    something of the machine."""
    problems = []
    for item in items:
        if isinstance(item, DoctestItem):  # the examples in docstrings (--doctest-modules)
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("cluster") and not item.get_closest_marker("root"):
            item.add_marker(pytest.mark.root)
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in SPEED_TIERS})
        needs = sorted({mark.name for mark in item.iter_markers() if mark.name in NEEDS})
        if len(tiers) != 1:
            problems.append(f"{item.nodeid}: {' and '.join(tiers) or 'no speed tier'}")
        elif tiers == ["unit"] and needs:
            problems.append(f"{item.nodeid}: unit, but needs {', '.join(needs)}")
    if problems:
        raise pytest.UsageError(
            f"{len(problems)} test(s) need exactly one speed tier, @pytest.mark.unit (in-process, starts no process) "
            "or @pytest.mark.slow (starts processes), and a unit test needs nothing of the machine (pytest.ini, "
            "markers; tests/conftest.py):\n  " + "\n  ".join(problems)
        )
    items[:] = in_the_order_workers_take_them(items)


def in_the_order_workers_take_them(items: list[pytest.Item]) -> list[pytest.Item]:
    """The slow tests first, one of each file in turn, then the unit tests. Neighbours in the queue run at the same
    time on different workers: taking the files in turn mixes tests that mostly wait (the doctor's, the emulated
    nodes') with tests that keep both cores busy (the attacks of test_security.py), where in file order whole minutes
    would be of one kind; the unit tests, seconds in all, come last so that the workers end together. A file keeps
    its own order (its module-scoped fixtures, its parameters)."""
    slow_by_file: dict[Path, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("unit") is None:
            slow_by_file.setdefault(item.path, []).append(item)
    in_turn = [item for turn in itertools.zip_longest(*slow_by_file.values()) for item in turn if item is not None]
    return in_turn + [item for item in items if item.get_closest_marker("unit") is not None]


# pytest-xdist (pytest.ini: -n 4) hands each test to whichever worker is free: most slow tests wait (on a timeout, a
# late peer, a launcher), so a file's waits overlap with other tests' work instead of adding up on one worker. These
# files run whole on one worker:
WHOLE_FILES = {
    # module-scoped jobs that the file's tests share, started once
    "test_mpi_backend.py",
    "test_mpi_store.py",
    "test_torch_backend_suite.py",
    "test_torch_store_contract.py",
    # every test needs the one emulated cluster, one at a time, and its session fixture takes the cluster down at the
    # end of the worker's run
    "test_multinode.py",
}


class WholeFilesThenTestByTest(LoadScopeScheduling):
    """xdist's scheduling by scope, a scope being a whole file for ``WHOLE_FILES`` and one test otherwise; scopes
    start largest first, so the whole files start at once. (``--dist loadgroup`` with ``xdist_group`` marks would say
    the same, but xdist 3.8 groups by rewriting a private node id that pytest 9.2 no longer reads.)"""

    @override
    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return path if Path(path).name in WHOLE_FILES else nodeid

    @override
    def _assign_work_unit(self, node: Any) -> None:
        super()._assign_work_unit(node)
        if not self.workqueue and (announce := os.environ.get(ALL_HANDED_OUT_VARIABLE)):
            Path(announce).touch()


# A file the run touches once its last test is handed to a worker: from then on fewer tests run than workers, and
# .ci/run starts its other checks beside them.
ALL_HANDED_OUT_VARIABLE = "LDH_TESTS_ALL_HANDED_OUT"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> WholeFilesThenTestByTest:
    return WholeFilesThenTestByTest(config, log)


# What the machine has once is handed out by a fixture, and each such thing has a lock of the run: a test holds the
# lock of every one its fixtures reach, so two tests that use the same one never overlap, whatever workers run them,
# and tests that use different ones (or only their own namespaces, users or files) run side by side (the locks:
# tests/run_locks.py). Other fixtures take their lock themselves, for less than a whole test: ``users``
# (test_security.py) only while it runs useradd, which fails while another holds /etc/passwd's lock;
# ``protections`` (test_security.py) shares its sysctl settings with the tests that want them the same way.
SHARED_BY_FIXTURE = {
    "slurm_cluster": "test-slurm",  # one SLURM of 2 CPUs: a second job would queue behind the first one's timeout
    "emulated_cluster": "emulated-cluster",  # its namespaces, bridge and 2-node SLURM
}


@pytest.fixture(autouse=True)
def _one_test_at_a_time_per_shared_resource(request: pytest.FixtureRequest) -> Iterator[None]:
    # Taken in one order (sorted), so that two tests needing the same two never wait on each other.
    names = sorted({SHARED_BY_FIXTURE[fixture] for fixture in request.fixturenames if fixture in SHARED_BY_FIXTURE})
    with contextlib.ExitStack() as held:
        for name in names:
            held.enter_context(holding(request.config, name))
        yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the run's controller: stop the test SLURM if a worker of this run started it (workers leave it running,
    as another worker may still use it), and put back what tests changed of the machine (run_locks.py)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not hasattr(session.config, "_tmp_path_factory"):
        return
    restore_everything_recorded(session.config)
    if (shared_run_directory(session.config) / SLURM_STARTED).exists():
        subprocess.run(["bash", str(REPO / ".ci" / "slurm-down.sh")], capture_output=True, timeout=120)


# A unit test that starts a process fails: the unit tier runs in this process only. Seen through the interpreter's
# audit events; importing mpi4py.MPI counts too, as it initialises MPI and Open MPI's singleton starts an orted.
_PROCESS_EVENTS = {
    "subprocess.Popen",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.spawn",
    "os.system",
    "os.exec",
    "pty.spawn",
}
_MPI_INIT = "import mpi4py.MPI (MPI_Init: Open MPI's singleton starts an orted)"
_started_by_unit_test: list[str] | None = None  # a list while a unit test runs


def _record_process_starts(event: str, args: tuple) -> None:
    started = _started_by_unit_test
    if started is None:
        return
    if event in _PROCESS_EVENTS:
        started.append(f"{event} {args[1] if event == 'subprocess.Popen' else args[:2]!r}"[:300])
    elif event == "import" and args[0] == "mpi4py.MPI" and "mpi4py.MPI" not in sys.modules and _MPI_INIT not in started:
        started.append(_MPI_INIT)


sys.addaudithook(_record_process_starts)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest):
    global _started_by_unit_test
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    started = _started_by_unit_test = []
    try:
        yield
    finally:
        _started_by_unit_test = None
    if started:
        pytest.fail(f"a unit test started {len(started)} process(es); mark it slow: {started}", pytrace=False)


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
def launcher_env(monkeypatch: pytest.MonkeyPatch):
    """``launcher_env(variables)`` replaces every launcher variable of this process (what a launcher, or the job's
    scheduler, set: everything ``helpers.job_environment`` leaves out) with ``variables``; restored after the test."""

    def set_variables(variables: dict[str, str]) -> None:
        clean = helpers.job_environment()
        for key in list(os.environ):
            if key not in clean:
                monkeypatch.delenv(key)
        for key, value in variables.items():
            monkeypatch.setenv(key, value)

    return set_variables


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


# In the run's shared directory when a worker started the test SLURM (pytest_sessionfinish stops it).
SLURM_STARTED = "slurm-started-by-this-run"


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest):
    """A running single-node SLURM (.ci/slurm-up.sh); stopped at the end only if this session started it."""
    missing = [
        command for command in ("srun", "sbatch", "slurmctld", "slurmd", "munged") if shutil.which(command) is None
    ]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing); .ci/install installs slurm-wlm and munge")
    if os.geteuid() != 0:
        pytest.skip("starting the test SLURM cluster (.ci/slurm-up.sh) needs root")
    state_dir = Path(os.environ.get("LDH_SLURM_DIR", "/tmp/ldh-slurm"))
    with holding(request.config, SHARED_BY_FIXTURE["slurm_cluster"]):  # two workers must not start it at once
        started_here = not _slurm_daemons_alive(state_dir)
        up = subprocess.run(["bash", str(REPO / ".ci" / "slurm-up.sh")], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, f".ci/slurm-up.sh failed:\n{up.stdout}\n{up.stderr}"
    if started_here and os.environ.get("PYTEST_XDIST_WORKER"):
        (shared_run_directory(request.config) / SLURM_STARTED).touch()  # the controller stops it at the end
        started_here = False
    yield state_dir
    if started_here:
        subprocess.run(["bash", str(REPO / ".ci" / "slurm-down.sh")], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def emulated_cluster(request: pytest.FixtureRequest):
    """Two emulated nodes (.ci/cluster-up.sh), with a SLURM of them when SLURM is installed; removed at the end of
    the session, whatever the tests did (leftovers of a killed session are removed first)."""
    if os.geteuid() != 0:
        pytest.skip("the emulated cluster (.ci/cluster-up.sh) creates network namespaces, which needs root")
    missing = [command for command in ("ip", "nsenter", "unshare") if shutil.which(command) is None]
    if missing:
        pytest.skip(f"the emulated cluster needs {', '.join(missing)} (.ci/install installs iproute2 and util-linux)")
    slurm = all(shutil.which(command) for command in ("srun", "sbatch", "slurmctld", "slurmd", "munged"))
    directory = Path(os.environ.get("LDH_CLUSTER_DIR", "/tmp/ldh-cluster"))
    with holding(request.config, SHARED_BY_FIXTURE["emulated_cluster"]):
        cluster = cluster_up(directory, slurm=slurm)
    try:
        yield cluster
    finally:
        with holding(request.config, SHARED_BY_FIXTURE["emulated_cluster"]):
            cluster_down(directory)


@pytest.fixture(scope="session")
def flock_shim(tmp_path_factory) -> Path:
    """tests/faults/nolock.c built: under LD_PRELOAD, flock() in $LDH_NOLOCK_DIR fails with ENOLCK, or with
    LDH_NOLOCK_MODE=noop succeeds without locking (a filesystem whose locks do not cross nodes)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the flock shim")
    shim = tmp_path_factory.mktemp("shim") / "nolock.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(shim), str(Path(__file__).parent / "faults" / "nolock.c"), "-ldl"],
        check=True,
    )
    return shim
