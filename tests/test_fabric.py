"""``lightning_dist_hooks.Fabric`` (and its twin for ``lightning.fabric``): the Trainer's flags and checks, and real
2-rank runs under Lightning's launcher, torchrun, OpenMPI's mpirun (gloo and the MPI transport) and srun.

Each run trains with the user's own distributed sampler (``use_distributed_sampler=False``), all-reduces, and
checks that both ranks met through the per-launch ``file:///DIR/`` file and left the directory empty.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers import (
    BOTH,
    LIGHTNING,
    PYTORCH_LIGHTNING,
    REPO,
    JobResult,
    both_packages,
    job_environment,
    needs_mpi,
    needs_openmpi,
    openmpi_run,
    run_command,
    slurm_environment,
)

FABRIC_JOB = REPO / "tests" / "jobs" / "fabric_job.py"
TIMEOUT = 150


def fabric_command(package, out: Path, *flags: str) -> list[str]:
    return [sys.executable, str(FABRIC_JOB), "--package", package.name, "--out", str(out), *flags]


def assert_two_rank_run(result: JobResult, package, environment: str, backend: str, init_method_prefix: str) -> None:
    result.assert_ok()
    assert sorted(result.ranks) == [0, 1], result.output[-4000:]
    for rank, record in result.ranks.items():
        assert record["fabric"] == f"{package.ours.Fabric.__module__}.Fabric"
        assert (record["environment"], record["world_size"]) == (environment, 2)
        (call,) = record["setup_calls"]
        assert (call["backend"], call["rank"], call["world_size"]) == (backend, rank, 2)
        assert call["device_id"] is None  # the hook takes device_id; on CPU there is none to bind
        assert call["init_method"].startswith(init_method_prefix)
        assert record["seen"] == list(range(rank, 24, 2))  # the user's sampler, not an injected one
        assert record["samples_on_all_ranks"] == 24
    assert len({record["setup_calls"][0]["init_method"] for record in result.ranks.values()}) == 1
    result.same_on_all_ranks("weights_sha256")


def run(command: list[str], tmp_path: Path, env: dict | None = None) -> JobResult:
    return run_command(
        ["timeout", str(TIMEOUT), *command],
        cwd=tmp_path,
        out_dir=tmp_path / "out",
        timeout=TIMEOUT + 30,
        env=env or job_environment(),
    )


@pytest.mark.unit
@pytest.mark.compat
@both_packages
def test_flags_are_checked_at_construction_with_the_trainers_messages(package):
    with pytest.raises(ValueError) as from_fabric:
        package.ours.Fabric(accelerator="cpu", devices=2, strategy="ddp", torch_dist_init_method="ftp://host/x")
    with pytest.raises(ValueError) as from_trainer:
        package.ours.Trainer(accelerator="cpu", devices=2, strategy="ddp", torch_dist_init_method="ftp://host/x")
    assert str(from_fabric.value) == str(from_trainer.value) and "ftp://host/x" in str(from_fabric.value)
    with pytest.raises(TypeError, match=r"setup_distributed_backend='gloo' is not callable"):
        package.ours.Fabric(accelerator="cpu", devices=2, strategy="ddp", setup_distributed_backend="gloo")


@pytest.mark.unit
@both_packages
def test_flags_reach_the_strategy_and_the_fabric_stays_lightnings(package, tmp_path):
    fabric = package.ours.Fabric(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        torch_dist_backend="GLOO",
        torch_dist_init_method=f"file://{tmp_path}/rdzv",
    )
    assert isinstance(fabric, package.fabric.Fabric)
    # The file really used: inside this user's private directory (docs/security.md).
    assert (fabric.torch_dist_backend, fabric.torch_dist_init_method) == (
        "gloo",
        f"file://{tmp_path}/ldh-uid-{os.geteuid()}/rdzv",
    )
    assert isinstance(fabric.strategy, package.fabric.strategies.DDPStrategy)
    assert fabric.strategy.process_group_backend == "gloo"


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.parametrize("package", BOTH, ids=[package.name for package in BOTH])
def test_lightnings_launcher_with_a_per_launch_file(package, tmp_path, rendezvous_dir):
    command = fabric_command(
        package, tmp_path / "out", "--backend", "gloo", "--setup-hook", "--init-method", f"file://{rendezvous_dir}/"
    )
    result = run(command, tmp_path)
    assert_two_rank_run(
        result,
        package,
        "LightningEnvironment",
        "gloo",
        f"file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/ldh-rendezvous-LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN-",
    )
    assert list(rendezvous_dir.iterdir()) == []
    # Lightning's own bootstrap line, as a user without our flags sees it.
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2" in result.output
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.output


@pytest.mark.slow
def test_ddp_spawn_pickles_the_setup_hook_to_the_children(tmp_path, rendezvous_dir):
    command = fabric_command(
        LIGHTNING,
        tmp_path / "out",
        "--strategy",
        "ddp_spawn",
        "--backend",
        "gloo",
        "--setup-hook",
        "--init-method",
        f"file://{rendezvous_dir}/",
    )
    assert_two_rank_run(
        run(command, tmp_path),
        LIGHTNING,
        "LightningEnvironment",
        "gloo",
        f"file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/ldh-rendezvous-LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN-",
    )
    assert list(rendezvous_dir.iterdir()) == []


@pytest.mark.slow
def test_torchrun(tmp_path, rendezvous_dir):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *fabric_command(
            PYTORCH_LIGHTNING,
            tmp_path / "out",
            "--backend",
            "gloo",
            "--setup-hook",
            "--init-method",
            f"file://{rendezvous_dir}/",
        )[1:],
    ]
    assert_two_rank_run(
        run(command, tmp_path),
        PYTORCH_LIGHTNING,
        "TorchElasticEnvironment",
        "gloo",
        f"file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/ldh-rendezvous-TORCHELASTIC_RUN_ID-",
    )
    assert list(rendezvous_dir.iterdir()) == []


@pytest.mark.slow
@pytest.mark.mpi
@needs_openmpi
def test_openmpi_mpirun(tmp_path, rendezvous_dir):
    command = [
        *openmpi_run(),
        *fabric_command(
            LIGHTNING,
            tmp_path / "out",
            "--backend",
            "gloo",
            "--setup-hook",
            "--init-method",
            f"file://{rendezvous_dir}/",
        ),
    ]
    assert_two_rank_run(
        run(command, tmp_path),
        LIGHTNING,
        "OpenMPIEnvironment",
        "gloo",
        f"file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/ldh-rendezvous-PMIX_NAMESPACE-",
    )
    assert list(rendezvous_dir.iterdir()) == []


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@needs_mpi
def test_openmpi_mpirun_with_the_mpi_transport(tmp_path):
    command = [*openmpi_run(), *fabric_command(PYTORCH_LIGHTNING, tmp_path / "out", "--backend", "mpi", "--setup-hook")]
    result = run(command, tmp_path)
    assert_two_rank_run(result, PYTORCH_LIGHTNING, "OpenMPIEnvironment", "mpi4py", "mpi://")
    assert {record["process_group_backend"] for record in result.ranks.values()} == {"mpi4py"}


@pytest.mark.slow
@pytest.mark.cluster
def test_srun(slurm_cluster, tmp_path, rendezvous_dir):
    command = [
        "srun",
        "-N1",
        "--ntasks-per-node=2",
        "-J",
        "ldhtest",
        "--kill-on-bad-exit=1",
        *fabric_command(
            LIGHTNING,
            tmp_path / "out",
            "--backend",
            "gloo",
            "--setup-hook",
            "--init-method",
            f"file://{rendezvous_dir}/",
        ),
    ]
    assert_two_rank_run(
        run(command, tmp_path, env=slurm_environment()),
        LIGHTNING,
        "SLURMEnvironment",
        "gloo",
        f"file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/ldh-rendezvous-SLURM_JOB_ID-",
    )
    assert list(rendezvous_dir.iterdir()) == []
