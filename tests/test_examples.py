"""Each example runs as a user would run it, on 2 real CPU processes, and prints what it proves."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from helpers import REPO, job_environment, needs_mpi, openmpi_run, run_command, slurm_environment

pytestmark = pytest.mark.slow


def run_example(name: str, tmp_path, *args: str):
    command = [sys.executable, str(REPO / "examples" / name), *args]
    return run_command(command, cwd=tmp_path, out_dir=tmp_path / "none", timeout=240, env=job_environment())


def final_loss(output: str) -> float:
    """The ``final_loss=`` an example printed."""
    printed = re.search(r"final_loss=([\d.]+)", output)
    assert printed, output[-3000:]
    return float(printed.group(1))


def test_file_rendezvous_example_trains_equal_weights_and_cleans_up(tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir()
    result = run_example("ddp_file_rendezvous.py", tmp_path, "--rendezvous-dir", str(rendezvous_dir)).assert_ok()
    assert (
        f"ranks=2 backend=gloo init_method=file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/rendezvous "
        "weights_equal_on_all_ranks=True"
    ) in result.output
    assert final_loss(result.output) < 0.2
    assert list(rendezvous_dir.iterdir()) == []


def test_custom_setup_hook_example_builds_its_own_store(tmp_path):
    result = run_example("custom_setup_hook.py", tmp_path).assert_ok()
    for rank in (0, 1):
        assert f"rank {rank}: built the gloo group on a hand-made FileStore (given init_method=env://)" in result.output
    assert "all_reduce over 2 ranks gave 3" in result.output


def test_balanced_sampler_example_balances_classes_across_ranks(tmp_path):
    result = run_example("balanced_sampler.py", tmp_path).assert_ok()
    counts = re.search(r"class counts over 2 ranks: \[(\d+), (\d+)\] \(class 1 share ([\d.]+)", result.output)
    assert counts, result.output[-3000:]
    assert int(counts.group(1)) + int(counts.group(2)) == 2000  # 2 epochs x 1000 draws, split across the ranks
    assert 0.4 < float(counts.group(3)) < 0.6


def test_lightning_package_example_trains_with_the_unified_package(tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir()
    result = run_example("lightning_package.py", tmp_path, "--rendezvous-dir", str(rendezvous_dir)).assert_ok()
    assert re.search(
        rf"package=lightning ranks=2 backend=gloo init_method=file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/"
        r"ldh-rendezvous-\S+ weights_equal_on_all_ranks=True",
        result.output,
    ), result.output[-3000:]
    assert list(rendezvous_dir.iterdir()) == []


def test_fabric_example_uses_its_hook_its_sampler_and_a_per_launch_file(tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir()
    result = run_example("fabric_custom_sampler.py", tmp_path, "--rendezvous-dir", str(rendezvous_dir)).assert_ok()
    for rank in (0, 1):
        assert re.search(
            rf"rank {rank}: init_process_group\('gloo', 'file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/"
            r"ldh-rendezvous-\S+', world_size=2\)",
            result.output,
        ), result.output[-3000:]
    # 256 samples per epoch in all: each rank read its own half, through the sampler the example built.
    assert re.search(
        r"fabric ranks=2 backend=gloo .* samples_per_epoch=256 weights_equal_on_all_ranks=True", result.output
    )
    assert list(rendezvous_dir.iterdir()) == []


def test_lightning_cli_example_takes_our_flags_as_trainer_options(tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir()
    result = run_example(
        "lightning_cli.py",
        tmp_path,
        "fit",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.max_epochs=2",
        "--trainer.logger=false",
        "--trainer.torch_dist_backend=gloo",
        f"--trainer.torch_dist_init_method=file://{rendezvous_dir}/",
    ).assert_ok()
    assert re.search(
        rf"cli ranks=2 backend=gloo init_method=file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/"
        r"ldh-rendezvous-",
        result.output,
    )
    assert list(rendezvous_dir.iterdir()) == []


@pytest.mark.mpi
@needs_mpi
def test_mpirun_mpi_transport_example_trains_over_mpi_with_no_listening_socket(tmp_path):
    # As its docstring says: mpirun --mca btl self,vader -n 2 python examples/mpirun_mpi_transport.py (openmpi_run()
    # adds what root and 2 cores need, and keeps mpirun's own channel on loopback).
    command = ["timeout", "150", *openmpi_run(), sys.executable, str(REPO / "examples" / "mpirun_mpi_transport.py")]
    result = run_command(command, cwd=tmp_path, out_dir=tmp_path / "none", timeout=180).assert_ok()
    assert "ranks=2 backend=mpi4py init_method=mpi:// weights_equal_on_all_ranks=True" in result.output
    assert final_loss(result.output) < 0.2
    for rank in (0, 1):
        assert re.search(rf"^rank {rank} \(pid \d+\): listening TCP sockets: none$", result.output, re.MULTILINE), (
            result.output[-3000:]
        )


@pytest.mark.mpi
@needs_mpi
def test_mpirun_gloo_mpi_rendezvous_example_trains_with_gloo_meeting_over_mpi(tmp_path):
    # As its docstring says: mpirun --mca btl self,vader -n 2 python examples/mpirun_gloo_mpi_rendezvous.py
    example = REPO / "examples" / "mpirun_gloo_mpi_rendezvous.py"
    command = ["timeout", "150", *openmpi_run(), sys.executable, str(example)]
    result = run_command(command, cwd=tmp_path, out_dir=tmp_path / "none", timeout=180).assert_ok()
    assert "store: PrefixStore > PrefixStore > MpiStore" in result.output, result.output[-3000:]
    assert "ranks=2 backend=gloo init_method=mpi:// weights_equal_on_all_ranks=True" in result.output
    assert final_loss(result.output) < 0.2
    assert "yet ranks listen" not in result.output  # shared memory only: nothing for the job's warning


# A job's states once it has ended (squeue(1), JOB STATE CODES); before, it is PENDING, RUNNING, COMPLETING...
SLURM_END_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}
SLURM_JOB_TIMEOUT_S = 240


def submit_slurm_job(tmp_path, rendezvous_dir):
    """``sbatch examples/slurm_job.sbatch`` on the test SLURM, 1 node, 2 tasks, waited for: (the batch script's exit
    code, the job's output)."""
    log = tmp_path / "job.out"
    env = {
        **slurm_environment(),
        "RENDEZVOUS_DIR": str(rendezvous_dir),
        "PYTHON": sys.executable,
        "EXAMPLES_DIR": str(REPO / "examples"),
    }
    command = [
        "sbatch",
        "--nodes=1",
        "--ntasks-per-node=2",
        f"--output={log}",
        str(REPO / "examples" / "slurm_job.sbatch"),
    ]
    submitted = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    job = re.search(r"Submitted batch job (\d+)", submitted.stdout)
    assert submitted.returncode == 0 and job, submitted.stdout + submitted.stderr
    state, exit_code = wait_for_slurm_job(job.group(1), SLURM_JOB_TIMEOUT_S)
    output = log.read_text() if log.exists() else ""
    assert (state == "COMPLETED") == (exit_code == 0), (state, exit_code, output[-6000:])
    return exit_code, output


def wait_for_slurm_job(job_id: str, timeout_s: float) -> tuple[str, int]:
    """The job's end state and its batch script's exit code (128 + N when killed by signal N), asking SLURM every
    0.2 s (kept MinJobAge=60 s after the end). Not ``sbatch --wait``: it sleeps 2, 8, then 32 s between its polls,
    so a job of 11 s took it 42 s. A job still running after ``timeout_s`` is cancelled."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = subprocess.run(
            ["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True, timeout=30
        ).stdout
        state = re.search(r"\bJobState=(\S+)", record)
        if state and state.group(1) in SLURM_END_STATES:
            break
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
            raise AssertionError(f"SLURM job {job_id} did not end within {timeout_s} s: {record}")
        time.sleep(0.2)
    exit_codes = re.search(r"\bExitCode=(\d+):(\d+)", record)
    assert state and exit_codes, record
    exit_code, signal = map(int, exit_codes.groups())
    return state.group(1), 128 + signal if signal else exit_code


@pytest.mark.cluster
def test_slurm_job_runs_the_doctor_then_trains_through_a_dir_rendezvous(slurm_cluster, tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir(mode=0o700)
    returncode, output = submit_slurm_job(tmp_path, rendezvous_dir)
    assert returncode == 0, output[-6000:]
    assert "lightning-dist-hooks doctor: 2 ranks, backend gloo, init method dir://" in output
    assert re.search(r"^every check passed$", output, re.MULTILINE), output[-6000:]
    # Step 0 was the doctor, step 1 trains: each step meets in a rendezvous of its own, named after the job and step.
    assert re.search(
        rf"^ranks=2 backend=gloo init_method=dir://{rendezvous_dir}/ldh-uid-{os.geteuid()}/"
        r"ldh-rendezvous-SLURM_JOB_ID-\d+-SLURM_STEP_ID-1-\S+ weights_equal_on_all_ranks=True "
        r"final_loss=0\.\d+$",
        output,
        re.MULTILINE,
    ), output[-6000:]
    assert list(rendezvous_dir.iterdir()) == []


@pytest.mark.cluster
def test_slurm_job_stops_before_training_when_the_doctor_fails(slurm_cluster, tmp_path):
    # A rendezvous directory every user may write to, without the sticky bit: the doctor's `private` check fails.
    rendezvous_dir = tmp_path / "open"
    rendezvous_dir.mkdir()
    rendezvous_dir.chmod(0o777)
    returncode, output = submit_slurm_job(tmp_path, rendezvous_dir)
    assert returncode == 1, output[-6000:]
    assert f"FAIL  private: {rendezvous_dir} (owner" in output
    assert "slurm_job.sbatch: the doctor found a problem (above); not training" in output
    assert "ranks=2 backend=gloo" not in output and "Initializing distributed" not in output
    assert list(rendezvous_dir.iterdir()) == []
