"""GPU parity: the process group our path creates is bound to the rank's GPU exactly as Lightning binds it.

First, with no GPU needed: in this process, torch's ``init_process_group`` and ``torch.cuda.set_device`` are recorded
while Lightning's own strategy and ours (same class, same settings) create the group of a rank whose root device is
``cuda:0``; the recorded call makes a real one-rank gloo group so that everything after it runs as usual. Then, where
CUDA is available (skipped otherwise), real NCCL jobs: under torchrun with ``file:///DIR/``, the composite
``cpu:gloo,cuda:nccl``, Fabric, and the default flags against Lightning's Trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import FIT_JOB, PYTORCH_LIGHTNING, REPO, JobResult, both_packages, needs_mpi, openmpi_run, run_command

from lightning_dist_hooks import _lightning_internals
from lightning_dist_hooks.bootstrap_plan import BootstrapPlan, Flags
from lightning_dist_hooks.hooks import default_setup_distributed_backend
from lightning_dist_hooks.process_group.create import create_process_group
from lightning_dist_hooks.strategy import hook_strategy

# Part of the fast subset .ci/compat runs at the ends of the supported version ranges.
pytestmark = pytest.mark.compat

FABRIC_JOB = REPO / "tests" / "jobs" / "fabric_job.py"
CUDA_0 = torch.device("cuda", 0)
# What torch prints when a barrier must guess the device of a group created without device_id.
UNBOUND_BARRIER_WARNING = "using the device under current context"


@pytest.fixture
def recorded_torch(monkeypatch: pytest.MonkeyPatch):
    """Record ``init_process_group`` (backend and keywords) and ``torch.cuda.set_device``, in call order."""
    calls: list[tuple] = []
    real_init_process_group = dist.init_process_group

    def init_process_group(*args, **kwargs) -> None:
        backend = args[0] if args else kwargs.pop("backend")
        calls.append(("init_process_group", backend, kwargs))
        real_init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    # A CPU build of torch has no NCCL, and the flags' check refuses a backend the build lacks; nothing here runs it.
    real_is_backend_available = dist.is_backend_available
    monkeypatch.setattr(dist, "is_backend_available", lambda name: name == "nccl" or real_is_backend_available(name))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # Lightning's env:// writes both; monkeypatch restores them
    monkeypatch.setenv("MASTER_PORT", "29999")
    yield calls
    if dist.is_initialized():
        dist.destroy_process_group()


def _strategy(package, side: str, backend: str | None, device: torch.device):
    """A DDP strategy of the Trainer (``side="trainer"``) or of Fabric, for one rank on ``device``."""
    module = package.pl if side == "trainer" else package.fabric
    environment = package.fabric.plugins.environments.LightningEnvironment()  # both sides use Fabric's
    return module.strategies.DDPStrategy(
        parallel_devices=[device], cluster_environment=environment, process_group_backend=backend
    )


def _lightnings_call(package, side: str, backend: str, device: torch.device, calls: list) -> dict:
    strategy = _strategy(package, side, backend, device)
    strategy.setup_distributed() if side == "trainer" else strategy._setup_distributed()
    dist.destroy_process_group()
    ((_name, recorded_backend, keywords),) = [call for call in calls if call[0] == "init_process_group"]
    calls.clear()
    assert recorded_backend == backend
    return keywords


def _create_ours(
    package, side: str, backend: str, device: torch.device, rendezvous: Path, hook=default_setup_distributed_backend
) -> None:
    """Our path's group for the same rank: the strategy hooked by the flags, then the group created and destroyed."""
    strategy = _strategy(package, side, None, device)
    flags = Flags.checked(backend, f"file://{rendezvous}")
    flavour = _lightning_internals.flavour_of(strategy)
    assert flavour is not None
    plan = BootstrapPlan.for_strategy(flags, strategy, flavour, owner=side)
    hook_strategy(strategy, plan)
    _lightning_internals.set_world_ranks(strategy)
    create_process_group(strategy, plan, hook)
    dist.destroy_process_group()


@pytest.mark.slow  # the rendezvous file's janitor is a process
@both_packages
@pytest.mark.parametrize("side", ["trainer", "fabric"])
@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo,cuda:nccl"])
def test_a_cuda_rank_binds_its_group_to_its_gpu_as_lightning_does(package, side, backend, recorded_torch, tmp_path):
    lightnings = _lightnings_call(package, side, backend, CUDA_0, recorded_torch)
    _create_ours(package, side, backend, CUDA_0, tmp_path / "rendezvous")
    # The GPU is made current before the group exists, as Lightning's accelerator does before Lightning creates it.
    assert [call[0] for call in recorded_torch] == ["set_device", "init_process_group"]
    assert recorded_torch[0][1] == CUDA_0
    _, ours_backend, ours = recorded_torch[1]
    # Lightning 2.5.5 and newer bind the group to the GPU; older releases pass no device_id, and neither do we.
    binds = _lightning_internals.binds_groups_to_devices(_strategy(package, side, backend, CUDA_0))
    assert lightnings.get("device_id") == ours["device_id"] == (CUDA_0 if binds else None)
    assert ours_backend == backend and ours["timeout"] == lightnings["timeout"]


@pytest.mark.slow  # the rendezvous file's janitor is a process
@both_packages
def test_a_cpu_rank_passes_no_device_as_lightning_does(package, recorded_torch, tmp_path):
    cpu = torch.device("cpu")
    lightnings = _lightnings_call(package, "trainer", "gloo", cpu, recorded_torch)
    _create_ours(package, "trainer", "gloo", cpu, tmp_path / "rendezvous")
    assert [call[0] for call in recorded_torch] == ["init_process_group"]
    assert lightnings.get("device_id") is None and recorded_torch[0][2]["device_id"] is None


@pytest.mark.slow  # the rendezvous file's janitor is a process
def test_a_hook_taking_device_id_gets_the_gpu_and_a_five_argument_hook_still_runs(recorded_torch, tmp_path):
    received: dict[str, object] = {}

    def hook_with_device(backend, init_method, rank, world_size, timeout, device_id=None):
        received["with device_id"] = device_id
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
        )

    def five_argument_hook(backend, init_method, rank, world_size, timeout):
        received["five arguments"] = rank
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)

    _create_ours(PYTORCH_LIGHTNING, "trainer", "gloo", CUDA_0, tmp_path / "first", hook_with_device)
    _create_ours(PYTORCH_LIGHTNING, "trainer", "gloo", CUDA_0, tmp_path / "second", five_argument_hook)
    # The device Lightning itself would pass: none before Lightning 2.5.5.
    expected = (
        CUDA_0
        if _lightning_internals.binds_groups_to_devices(_strategy(PYTORCH_LIGHTNING, "trainer", "gloo", CUDA_0))
        else None
    )
    assert received == {"with device_id": expected, "five arguments": 0}
    keywords = [call[2] for call in recorded_torch if call[0] == "init_process_group"]
    assert keywords[0]["device_id"] == expected and "device_id" not in keywords[1]


# --- on a real GPU ---------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")
GPU_JOB_TIMEOUT_S = 300


def _torchrun(script: Path, out_dir: Path, *flags: str) -> JobResult:
    """One rank per GPU of this machine under torchrun, on loopback."""
    gpus = str(torch.cuda.device_count())
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        gpus,
        str(script),
        "--accelerator",
        "gpu",
        "--devices",
        gpus,
        "--out",
        str(out_dir),
        *flags,
    ]
    return run_command(command, cwd=out_dir.parent, out_dir=out_dir, timeout=GPU_JOB_TIMEOUT_S).assert_ok()


@pytest.mark.slow
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_nccl_through_a_rendezvous_directory_under_torchrun_binds_each_rank_to_its_gpu(
    backend, tmp_path, rendezvous_dir
):
    job = _torchrun(FIT_JOB, tmp_path / "out", "--backend", backend, "--init-method", f"file://{rendezvous_dir}/")
    records = list(job.ranks.values())
    assert sorted(job.ranks) == list(range(torch.cuda.device_count()))
    for record in records:
        assert record["bound_device"] == f"cuda:{record['local_rank']}"
        assert record["process_group_backend"] == backend
    job.same_on_all_ranks("weights_sha256")
    assert UNBOUND_BARRIER_WARNING not in job.output
    assert list(rendezvous_dir.iterdir()) == []


@pytest.mark.slow
@pytest.mark.gpu
@needs_cuda
def test_fabric_with_nccl_binds_each_rank_to_its_gpu_and_hands_the_hook_its_device(tmp_path, rendezvous_dir):
    job = _torchrun(
        FABRIC_JOB, tmp_path / "out", "--backend", "nccl", "--init-method", f"file://{rendezvous_dir}/", "--setup-hook"
    )
    assert sorted(job.ranks) == list(range(torch.cuda.device_count()))
    for rank, record in job.ranks.items():
        assert record["bound_device"] == f"cuda:{rank}"
        assert record["setup_calls"][0]["device_id"] == f"cuda:{rank}"
    assert UNBOUND_BARRIER_WARNING not in job.output
    assert list(rendezvous_dir.iterdir()) == []


@pytest.mark.slow
@pytest.mark.gpu
@needs_cuda
def test_default_flags_on_a_gpu_train_what_lightnings_trainer_trains(tmp_path):
    devices = str(torch.cuda.device_count())
    jobs = {}
    for trainer in ("pl", "ldh"):
        out_dir = tmp_path / trainer
        command = [
            sys.executable,
            str(FIT_JOB),
            "--trainer",
            trainer,
            "--accelerator",
            "gpu",
            "--devices",
            devices,
            "--out",
            str(out_dir),
        ]
        jobs[trainer] = run_command(command, cwd=tmp_path, out_dir=out_dir, timeout=GPU_JOB_TIMEOUT_S).assert_ok()
    theirs, ours = jobs["pl"], jobs["ldh"]
    assert sorted(ours.ranks) == sorted(theirs.ranks)
    for rank in ours.ranks:
        assert ours.ranks[rank]["weights_sha256"] == theirs.ranks[rank]["weights_sha256"]
        assert ours.ranks[rank]["bound_device"] == theirs.ranks[rank]["bound_device"] == f"cuda:{rank}"
    assert UNBOUND_BARRIER_WARNING not in ours.output


@pytest.mark.unit
@pytest.mark.parametrize(("release", "binds"), [("2.4.0", False), ("2.5.4", False), ("2.5.5", True), ("2.6.6", True)])
def test_our_group_is_bound_to_a_device_only_where_the_installed_lightning_binds_its_own(monkeypatch, release, binds):
    monkeypatch.setattr(_lightning_internals, "installed_version", lambda distribution: release)
    strategy = _strategy(PYTORCH_LIGHTNING, "trainer", "gloo", CUDA_0)
    assert _lightning_internals.binds_groups_to_devices(strategy) is binds


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.mpi
@needs_cuda
@needs_mpi
@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_nccl_through_mpi_trains_as_through_a_file_with_no_tcp_store(backend, tmp_path, rendezvous_dir):
    # One rank per GPU under mpirun: NCCL's unique id travels in the MPI store, never in a TCP store.
    gpus = str(torch.cuda.device_count())
    jobs = {}
    for name, init_method in (("file", f"file://{rendezvous_dir}/"), ("mpi", "mpi://")):
        out_dir = tmp_path / name
        command = [
            *openmpi_run(int(gpus)),
            sys.executable,
            str(FIT_JOB),
            "--accelerator",
            "gpu",
            "--devices",
            gpus,
            "--backend",
            backend,
            "--init-method",
            init_method,
            "--out",
            str(out_dir),
        ]
        jobs[name] = run_command(command, cwd=tmp_path, out_dir=out_dir, timeout=GPU_JOB_TIMEOUT_S).assert_ok()
    assert jobs["mpi"].same_on_all_ranks("weights_sha256") == jobs["file"].same_on_all_ranks("weights_sha256")
    for rank, record in jobs["mpi"].ranks.items():
        assert record["bound_device"] == f"cuda:{record['local_rank']}"
        assert record["process_group_backend"] == backend
        assert record["store"][-1] == "MpiStore" and "TCPStore" not in record["store"], record["store"]
        assert len(record["listening_tcp_ports"]) == len(jobs["file"].ranks[rank]["listening_tcp_ports"])
