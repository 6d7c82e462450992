"""A failing rank ends an MPI job at once, whatever the process group timeout (real OpenMPI ``mpirun`` jobs).

Each job runs ``Trainer(torch_dist_backend="mpi")`` with a 10-minute timeout and makes one rank fail; the job must
exit non-zero within ``ENDS_WITHIN_S`` of the failure, say which rank failed and on what, and leave no process.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from helpers import FIT_JOB, needs_mpi, openmpi_run, processes_mentioning, run_command

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

TIMEOUT_S = 600
ENDS_WITHIN_S = 30
JOB_LIMIT_S = 240  # start-up on a loaded 2-core machine included; far below the 600 s timeout


def run_failing_job(tmp_path: Path, *flags: str, ranks: int = 2):
    out_dir = tmp_path / "out"
    command = [
        "timeout",
        "-k",
        "10",
        str(JOB_LIMIT_S),
        *openmpi_run(ranks),
        sys.executable,
        str(FIT_JOB),
        "--out",
        str(out_dir),
        "--backend",
        "mpi",
        "--strategy",
        "ddp-instance",
        "--timeout",
        str(TIMEOUT_S),
        *flags,
    ]
    result = run_command(command, cwd=tmp_path, out_dir=out_dir, timeout=JOB_LIMIT_S + 30)
    ended = time.time()
    assert result.returncode not in (0, 124, 137), result.output[-6000:]  # failed, but not by our time limit
    assert processes_mentioning(str(out_dir)) == {}, "a rank or mpirun outlived the job"
    return result, ended


def assert_ended_soon_after_the_failure(output: str, ended: float) -> None:
    failed_at = re.search(r"injecting a failure at ([\d.]+)", output)
    assert failed_at, output[-6000:]
    assert ended - float(failed_at.group(1)) <= ENDS_WITHIN_S, output[-6000:]


@needs_mpi
def test_exception_in_training_step_ends_the_job_at_once(tmp_path):
    result, ended = run_failing_job(tmp_path, "--raise-at-step", "1", "--die-rank", "1")
    assert_ended_soon_after_the_failure(result.output, ended)
    assert (
        "[lightning_dist_hooks.mpi] rank 1: ended with an unhandled exception: ZeroDivisionError: injected "
        "failure in training_step on rank 1. Ending the MPI job with MPI_Abort"
    ) in result.output
    assert "did not complete within the process group timeout" not in result.output


@needs_mpi
def test_exception_the_script_swallows_after_lightning_tore_down_still_ends_the_job(tmp_path):
    result, ended = run_failing_job(tmp_path, "--raise-at-step", "1", "--die-rank", "1", "--swallow-errors")
    assert_ended_soon_after_the_failure(result.output, ended)
    assert "rank 1 swallowed ZeroDivisionError" in result.output
    assert (
        "[lightning_dist_hooks.mpi] rank 1: is exiting after a trainer stopped on ZeroDivisionError: injected "
        "failure in training_step on rank 1. Ending the MPI job with MPI_Abort"
    ) in result.output


@needs_mpi
def test_exception_in_configure_sampler_ends_the_job_at_once(tmp_path):
    result, ended = run_failing_job(tmp_path, "--sampler-hook", "raise")
    assert_ended_soon_after_the_failure(result.output, ended)
    assert re.search(
        r"\[lightning_dist_hooks.mpi\] rank 1: ended with an unhandled exception: SamplerHookError: "
        r"configure_sampler raised KeyError on rank 1 of 2",
        result.output,
    ), result.output[-6000:]


@needs_mpi
def test_exception_in_setup_distributed_backend_ends_the_job_at_once(tmp_path):
    # The failing rank raises before it initialises MPI, so no MPI_Abort: mpirun ends the job on its exit code.
    result, ended = run_failing_job(tmp_path, "--setup-hook", "raise")
    assert_ended_soon_after_the_failure(result.output, ended)
    assert "DistributedSetupError: setup_distributed_backend raised OSError on rank 1 of 2" in result.output


@needs_mpi
def test_more_mpi_ranks_than_the_trainer_expects_fails_at_construction(tmp_path):
    result, _ = run_failing_job(tmp_path, ranks=3)
    assert (
        "ValueError: Trainer(devices=2, num_nodes=1) makes a world of 2 processes, but the MPI launcher started 3"
    ) in result.output, result.output[-6000:]
