"""Transports (issue 37): torch's backends and the MPI transport are registry entries, and a transport registered from
outside the package (tests/jobs/wrapped_gloo.py, gloo under names of its own) gets what the built-in ones get: the
Trainer's early checks, a doctor row and its failure hook, without a change to the package."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import job_environment, run_command
from pytorch_lightning.strategies import DDPStrategy

from lightning_dist_hooks import Trainer, Transport, _lightning_internals, register_transport, transports
from lightning_dist_hooks.backends import available_backends, check_backend_fits_devices, normalize_backend
from lightning_dist_hooks.bootstrap_plan import BootstrapPlan
from lightning_dist_hooks.transports import _base

JOBS = Path(__file__).parent / "jobs"
TRANSPORT_JOB = JOBS / "transport_job.py"


class SharpGloo(Transport):
    names = ("sharp-gloo", "sharp")
    devices = ("cpu",)

    def __init__(self) -> None:
        self.heard: list[str] = []

    def backend_for(self, given: str, name: str) -> str:
        return "gloo"  # what torch creates: a name of this transport's is an alias of gloo

    def run_started(self) -> None:
        self.heard.append("started")

    def run_failed(self, error: BaseException) -> None:
        self.heard.append(f"failed: {error}")


@pytest.fixture
def registry(monkeypatch):
    """The transports' registry as the package made it, restored after the test."""
    monkeypatch.setattr(_base, "_REGISTRY", dict(_base._REGISTRY))


@pytest.mark.unit
def test_torchs_backends_and_the_mpi_transport_are_registry_entries():
    assert [transport.names for transport in transports.registered_transports()][:6] == [
        ("gloo",),
        ("nccl",),
        ("mpi",),
        ("ucc",),
        ("xccl",),
        ("mpi4py",),
    ]
    assert isinstance(transports.transport_named(" MPI4PY "), transports.MpiTransport)
    nccl = transports.transport_named("nccl")
    assert nccl is not None and nccl.devices == ("cuda",)
    assert [type(each).__name__ for each in transports.transports_of("cpu:gloo,cuda:nccl")] == [
        "NativeTransport",
        "NativeTransport",
    ]


@pytest.mark.unit
def test_a_registered_transport_answers_to_its_names_and_hears_every_run(registry):
    sharp = SharpGloo()
    register_transport(sharp)
    assert normalize_backend("SHARP") == "gloo"
    assert {"sharp-gloo", "sharp"} <= set(available_backends())
    transports.announce_run_started()
    transports.announce_failure(RuntimeError("boom"))
    assert sharp.heard == ["started", "failed: boom"]
    assert transports.transports_taking_part("sharp") == [sharp]


@pytest.mark.unit
def test_a_name_is_taken_over_only_with_replace(registry):
    register_transport(SharpGloo())
    with pytest.raises(
        ValueError,
        match=r"torch_dist_backend 'sharp-gloo' already has a transport \(SharpGloo\)\. "
        r"Pass replace=True",
    ):
        register_transport(SharpGloo())
    replacement = SharpGloo()
    register_transport(replacement, replace=True)
    assert transports.transport_named("sharp") is replacement
    with pytest.raises(ValueError, match=r"Transport sets no names"):
        register_transport(Transport())


@pytest.mark.unit
def test_the_devices_a_transport_serves_are_checked_by_its_declaration(registry):
    register_transport(SharpGloo())
    with pytest.raises(
        ValueError,
        match=r"torch_dist_backend='Sharp' \(the sharp-gloo transport\) moves CPU "
        r"tensors only, but this Trainer runs on CUDA",
    ):
        check_backend_fits_devices("sharp-gloo", uses_cuda=True, given="Sharp")
    check_backend_fits_devices("sharp-gloo", uses_cuda=False)
    check_backend_fits_devices("cpu:sharp-gloo,cuda:nccl", uses_cuda=True)  # a composite names a backend per device


@pytest.mark.unit
def test_a_transport_named_in_a_package_s_entry_points_is_registered_on_first_look(registry, monkeypatch, tmp_path):
    _write_entry_point(tmp_path, "test_transports:SharpGloo")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_base, "_entry_points_loaded", False)
    assert isinstance(transports.transport_named("sharp"), SharpGloo)


@pytest.mark.unit
def test_the_generic_layers_import_no_transport():
    """What a transport needs they ask the registry. The plan keeps one call into mpi/: the check that an MPI
    launcher started the ranks, for a transport or scheme that says it ``needs_mpi_launch`` (launcher knowledge,
    beside ``detect_mpi_launch``, not the transport's)."""
    package = Path(transports.__file__).parents[1]
    generic = [
        package / "backends.py",
        package / "bootstrap_plan.py",
        package / "strategy.py",
        *(package / "process_group").rglob("*.py"),
        *(package / "doctor").rglob("*.py"),
    ]
    for path in generic:
        tree = ast.parse(path.read_text())
        imported = {
            f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        from_mpi = {name for name in imported if ".mpi" in name}
        expected = {"lightning_dist_hooks.mpi.check_mpi_launch"} if path.name == "bootstrap_plan.py" else set()
        assert from_mpi == expected, path
        assert "MPI_BACKENDS" not in path.read_text(), path
        assert not re.search(r"\bmpi\.", path.read_text()), path


def _write_entry_point(site: Path, target: str) -> None:
    """What installing a package that names a transport in ``lightning_dist_hooks.transports`` leaves on sys.path."""
    info = site / "wrapped_gloo_transport-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wrapped-gloo-transport\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{_base.ENTRY_POINT_GROUP}]\nwrapped = {target}\n")


@pytest.mark.slow
def test_a_transport_registered_outside_the_package_creates_the_group_and_hears_each_rank_fail(tmp_path):
    healthy = run_command(
        [sys.executable, str(TRANSPORT_JOB), "--backend", "Wrapped-Gloo"], cwd=tmp_path, out_dir=tmp_path
    ).assert_ok()
    for rank in (0, 1):
        assert f"rank {rank} trains over wrapped-gloo" in healthy.output
    assert healthy.output.count("wrapped-gloo heard: a run starts") == 2
    failed = run_command(
        [sys.executable, str(TRANSPORT_JOB), "--backend", "wrapped-gloo", "--fail"], cwd=tmp_path, out_dir=tmp_path
    )
    assert failed.returncode != 0
    for rank in (0, 1):
        assert f"failed on RuntimeError: injected on rank {rank}" in failed.output, failed.output[-6000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "refusal"),
    [
        ("cuda-gloo", "torch_dist_backend='cuda-gloo' needs CUDA devices, but this Trainer's accelerator is not CUDA"),
        (
            "mpi-launched-gloo",
            (
                "torch_dist_backend='mpi-launched-gloo' needs every rank started by an MPI launcher, "
                "but this process was not"
            ),
        ),
    ],
)
def test_a_transport_registered_outside_the_package_gets_the_trainer_s_early_checks(tmp_path, backend, refusal):
    run = run_command([sys.executable, str(TRANSPORT_JOB), "--backend", backend], cwd=tmp_path, out_dir=tmp_path)
    assert run.returncode == 1
    assert f"ValueError: {refusal}" in run.output
    assert "heard: a run starts" not in run.output  # refused in Trainer(...), before any rank started


@pytest.mark.slow
def test_a_transport_named_in_an_entry_point_gets_a_doctor_row(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _write_entry_point(site, "wrapped_gloo:WrappedGlooTransport")
    env = job_environment()
    env["PYTHONPATH"] = f"{site}:{JOBS}:{env['PYTHONPATH']}"
    doctor = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_dist_hooks",
            "doctor",
            "--backend",
            "wrapped-gloo",
            "--devices",
            "2",
            "--json",
            "--timeout",
            "60",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert doctor.returncode == 0, (doctor.stdout + doctor.stderr)[-6000:]
    document = json.loads(doctor.stdout.strip().splitlines()[-1])
    rows = {verdict["check"]: verdict for verdict in document["verdicts"]}
    assert rows["wrapped-gloo"]["status"] == "ok"
    assert rows["wrapped-gloo"]["message"] == "torch_dist_backend='wrapped-gloo': gloo under a name of its own"
    assert rows["wrapped-gloo"]["ranks"] == [0, 1]
    assert {rank["backend"] for rank in document["ranks"]} == {"wrapped-gloo"}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("options", "backend"),
    [
        (dict, "gloo"),  # Lightning's choice for CPU devices, decided in Trainer(...)
        (lambda: {"torch_dist_backend": "GLOO"}, "gloo"),
        (lambda: {"strategy": DDPStrategy(process_group_backend="gloo")}, "gloo"),  # the strategy's own
    ],
)
def test_the_plan_names_the_backend_every_rank_creates(options, backend):
    trainer = Trainer(**{"accelerator": "cpu", "devices": 2, "strategy": "ddp", "logger": False, **options()})
    plan = _lightning_internals.ours(trainer.strategy)
    assert isinstance(plan, BootstrapPlan) and plan.process_group_backend == backend


@pytest.mark.unit
def test_an_entry_point_that_cannot_be_loaded_is_named(registry, monkeypatch, tmp_path):
    _write_entry_point(tmp_path, "no_such_module_here:Transport")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_base, "_entry_points_loaded", False)
    with pytest.raises(
        RuntimeError,
        match=r"The lightning_dist_hooks.transports entry point wrapped = "
        r"'no_such_module_here:Transport' cannot be loaded \(ModuleNotFoundError",
    ):
        transports.transport_named("gloo")


@pytest.mark.unit
def test_every_name_of_a_transport_creates_its_first_by_default():
    class Aliased(Transport):
        names = ("first", "second")

    assert Aliased().backend_for("Second", "second") == "first"
    assert Aliased().takes_part("cpu:second,cuda:nccl") and not Aliased().takes_part("gloo")
