"""The same 2-rank fit under real launchers: Lightning's own, torchrun, OpenMPI and MPICH mpirun, srun and sbatch.

Each job is real processes, a real rendezvous and real all-reduces (gloo on 127.0.0.1), with both hooks
overridden. Every launcher runs ``file:///DIR/`` (the per-launch file) and ``tcp://127.0.0.1:PORT``, and
``env://`` where it provides an address. Lightning's own launcher runs only ``file:///DIR/`` here (``ddp`` and
``ddp_spawn``): its ``env://`` and ``tcp://`` runs are tests/test_process_group.py's.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers import FIT_JOB, JobResult, needs_openmpi, openmpi_run, run_command, slurm_environment

pytestmark = pytest.mark.slow

LAUNCH_TIMEOUT = 150
FIT_FLAGS = ["--backend", "gloo", "--setup-hook", "record", "--sampler-hook", "super", "--epochs", "1"]


def assert_two_rank_fit(result: JobResult, environment: str, init_method: str, rendezvous_dir: Path) -> None:
    """Both ranks trained under ``environment`` through ``init_method``, agree on the weights, left no files."""
    result.assert_ok()
    assert sorted(result.ranks) == [0, 1], result.output[-4000:]
    for rank, record in result.ranks.items():
        assert record["environment"] == environment
        assert (record["world_size"], record["local_rank"], record["node_rank"]) == (2, rank, 0)
        (call,) = record["setup_calls"]
        assert (call["rank"], call["world_size"], call["backend"]) == (rank, 2, "gloo")
        if init_method.startswith("file://"):
            # Inside the per-user directory (issue 9).
            assert call["init_method"].startswith(f"{init_method}ldh-uid-{os.geteuid()}/ldh-rendezvous-")
            assert call["rendezvous_file_mode"] == "0o600"
        else:
            assert call["init_method"] == init_method
        assert record["sampler_calls"] == ["validate", "train"]
    result.same_on_all_ranks("weights_sha256")
    assert {record["setup_calls"][0]["init_method"] for record in result.ranks.values()} == {call["init_method"]}
    assert list(rendezvous_dir.iterdir()) == [], "the rendezvous directory must be empty after a clean run"


def init_method_url(kind: str, rendezvous_dir: Path, port: int) -> str:
    return {"env": "env://", "tcp": f"tcp://127.0.0.1:{port}", "file-dir": f"file://{rendezvous_dir}/"}[kind]


def fit_command(out_dir: Path, init_method: str) -> list[str]:
    return [sys.executable, str(FIT_JOB), "--out", str(out_dir), "--init-method", init_method, *FIT_FLAGS]


@pytest.mark.parametrize(
    ("strategy", "package"),
    [("ddp", "pytorch_lightning"), ("ddp_spawn", "pytorch_lightning"), ("ddp_spawn", "lightning")],
    ids=["ddp", "ddp_spawn", "ddp_spawn-lightning"],
)
def test_lightning_launcher_with_a_per_launch_file(tmp_path, rendezvous_dir, strategy, package):
    # ddp_spawn pickles the trainer, its strategy and data connector to the children: with both packages.
    init_method = f"file://{rendezvous_dir}/"
    command = [*fit_command(tmp_path / "out", init_method), "--strategy", strategy, "--package", package]
    result = run_command(
        ["timeout", str(LAUNCH_TIMEOUT), *command], cwd=tmp_path, out_dir=tmp_path / "out", timeout=LAUNCH_TIMEOUT + 30
    )
    assert_two_rank_fit(result, "LightningEnvironment", init_method, rendezvous_dir)
    # ddp: the children took the token from the parent's environment; ddp_spawn: from the pickled strategy.
    assert "LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN" in result.ranks[0]["setup_calls"][0]["init_method"]


@pytest.mark.compat
@pytest.mark.parametrize("kind", ["env", "tcp", "file-dir"])
def test_torchrun(tmp_path, rendezvous_dir, free_port, kind):
    init_method = init_method_url(kind, rendezvous_dir, free_port)
    command = [
        "timeout",
        str(LAUNCH_TIMEOUT),
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *fit_command(tmp_path / "out", init_method)[1:],
    ]
    result = run_command(command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=LAUNCH_TIMEOUT + 30)
    assert_two_rank_fit(result, "TorchElasticEnvironment", init_method, rendezvous_dir)


@pytest.mark.mpi
@needs_openmpi
@pytest.mark.parametrize("kind", ["env", "tcp", "file-dir"])
def test_openmpi_mpirun(tmp_path, rendezvous_dir, free_port, kind):
    # env://: no MASTER_ADDR/MASTER_PORT given; the address (one node) and the port (from PMIX_NAMESPACE) are derived.
    init_method = init_method_url(kind, rendezvous_dir, free_port)
    command = ["timeout", str(LAUNCH_TIMEOUT), *openmpi_run(), *fit_command(tmp_path / "out", init_method)]
    result = run_command(command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=LAUNCH_TIMEOUT + 30)
    assert_two_rank_fit(result, "OpenMPIEnvironment", init_method, rendezvous_dir)


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun.mpich") is None, reason="MPICH's mpirun.mpich is not installed")
@pytest.mark.parametrize("kind", ["env", "file-dir"])
def test_mpich_mpirun(tmp_path, rendezvous_dir, free_port, kind):
    # Hydra names no launch: file:///DIR/ takes the enclosing allocation's job id, here an emulated PBS job's.
    # env:// gets its port from MASTER_PORT and derives the address (all ranks on one node).
    init_method = init_method_url(kind, rendezvous_dir, free_port)
    extra = {"env": ["-genv", "MASTER_PORT", str(free_port)], "file-dir": ["-genv", "PBS_JOBID", "5150.pbs-emulated"]}
    command = [
        "timeout",
        str(LAUNCH_TIMEOUT),
        "mpirun.mpich",
        "-n",
        "2",
        "-genv",
        "GLOO_SOCKET_IFNAME",
        "lo",
        *extra[kind],
        *fit_command(tmp_path / "out", init_method),
    ]
    result = run_command(command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=LAUNCH_TIMEOUT + 30)
    assert_two_rank_fit(result, "HydraEnvironment", init_method, rendezvous_dir)


@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["env", "tcp", "file-dir"])
def test_srun(slurm_cluster, tmp_path, rendezvous_dir, free_port, kind):
    init_method = init_method_url(kind, rendezvous_dir, free_port)
    command = [
        "timeout",
        str(LAUNCH_TIMEOUT),
        "srun",
        "-N1",
        "--ntasks-per-node=2",
        "-J",
        "ldhtest",
        "--kill-on-bad-exit=1",
        *fit_command(tmp_path / "out", init_method),
    ]
    env = {**slurm_environment(), "MASTER_PORT": str(free_port)}
    result = run_command(command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=LAUNCH_TIMEOUT + 30, env=env)
    assert_two_rank_fit(result, "SLURMEnvironment", init_method, rendezvous_dir)


@pytest.mark.cluster
def test_sbatch_wait_with_a_per_job_file(slurm_cluster, tmp_path, rendezvous_dir):
    init_method = f"file://{rendezvous_dir}/"
    script = tmp_path / "job.sbatch"
    script.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                "#SBATCH --job-name=ldhtest",
                "#SBATCH --nodes=1",
                "#SBATCH --ntasks-per-node=2",
                f"#SBATCH --output={tmp_path}/slurm-%j.out",
                f"srun --kill-on-bad-exit=1 {' '.join(fit_command(tmp_path / 'out', init_method))}",
                "",
            ]
        )
    )
    command = ["timeout", str(LAUNCH_TIMEOUT), "sbatch", "--wait", str(script)]
    result = run_command(
        command, cwd=tmp_path, out_dir=tmp_path / "out", timeout=LAUNCH_TIMEOUT + 30, env=slurm_environment()
    )
    result.output += "".join(log.read_text()[-6000:] for log in tmp_path.glob("slurm-*.out"))
    assert_two_rank_fit(result, "SLURMEnvironment", init_method, rendezvous_dir)
    # Named after the SLURM job and its step: what a requeue (new SLURM_RESTART_COUNT) would change.
    assert "SLURM_JOB_ID-" in result.ranks[0]["setup_calls"][0]["init_method"]
    assert "SLURM_STEP_ID-0" in result.ranks[0]["setup_calls"][0]["init_method"]
