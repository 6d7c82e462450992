"""Fail fast, never hang: ranks that never arrive, ranks that die, hooks that raise, leftover rendezvous files.

Every test runs real processes and asserts the exit code, a time bound and the message, and that no process and
no rendezvous file is left. Bad input that fails in ``Trainer(...)`` is tests/test_validation.py's.

Time bounds are measured around the whole job, so they include starting Python and importing torch and Lightning
on every rank: ``STARTUP_S`` allows for that on a loaded 2-core CI machine. A hang would take the process-group
timeout (15 s here) many times over, or Lightning's default of 30 minutes.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    FIT_JOB,
    OPENMPI_MPIRUN,
    JobResult,
    Rank,
    job_environment,
    openmpi_run,
    processes_mentioning,
    run_command,
    slurm_environment,
)

from lightning_dist_hooks.init_methods import FileInitMethod
from lightning_dist_hooks.init_methods._shared_filesystem.janitor import Janitor

pytestmark = pytest.mark.slow  # real jobs, and the janitor's own process

TIMEOUT_S = 15
STARTUP_S = 45
# A long process-group timeout, for failures that must end the job without waiting for it.
LONG_TIMEOUT_S = 300


def job_flags(timeout_s: float) -> list[str]:
    """A gloo job under a DDPStrategy instance, with a process-group timeout of ``timeout_s``."""
    return ["--strategy", "ddp-instance", "--timeout", f"{timeout_s:g}", "--backend", "gloo"]


SHORT_FLAGS = job_flags(TIMEOUT_S)
LONG_TIMEOUT_FLAGS = job_flags(LONG_TIMEOUT_S)


def flux_task(rank: int, size: int, job_id: str) -> dict[str, str]:
    """``job_environment`` for one task of a single-node Flux job, as ``flux run`` sets it: a test starts each rank
    itself, when it chooses."""
    return job_environment(
        FLUX_TASK_RANK=str(rank),
        FLUX_TASK_LOCAL_ID=str(rank),
        FLUX_JOB_SIZE=str(size),
        FLUX_JOB_NNODES="1",
        FLUX_JOB_ID=job_id,
        PMI_RANK=str(rank),
        PMI_SIZE=str(size),
    )


def timed(run, *args, **kwargs) -> tuple[JobResult, float]:
    started = time.monotonic()
    result = run(*args, **kwargs)
    return result, time.monotonic() - started


def wait_until_gone(tmp_path: Path, rendezvous_dir: Path | None = None, within_s: float = 10) -> None:
    """Assert that no process mentions ``tmp_path`` (ranks, janitors) and ``rendezvous_dir`` is empty, polling
    briefly: a launcher's last SIGKILL and the janitors' removals land just after the launcher itself exits."""
    deadline = time.monotonic() + within_s
    while True:
        alive = processes_mentioning(str(tmp_path))
        leftovers = sorted(rendezvous_dir.iterdir()) if rendezvous_dir else []
        if not alive and not leftovers:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind after {within_s} s: processes {alive}, files {leftovers}")
        time.sleep(0.2)


@pytest.mark.parametrize("kind", ["file", "dir", "tcp", "env"])
def test_a_rank_that_never_arrives_times_out_naming_the_missing_rank(
    run_job, tmp_path, rendezvous_dir, free_port, kind
):
    # Two nodes of one device each, under Lightning's own launcher: the second node is never started.
    init_method = {
        "file": f"file://{rendezvous_dir}/rendezvous",
        "dir": f"dir://{rendezvous_dir}/rendezvous",
        "tcp": f"tcp://127.0.0.1:{free_port}",
        "env": "env://",
    }[kind]
    # file:// and dir:// name the file really used, inside the per-user directory (issue 30), not the URL as given.
    used = {
        "file": f"file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/rendezvous",
        "dir": f"dir://{rendezvous_dir}/ldh-uid-{os.geteuid()}/rendezvous",
    }.get(kind, init_method)
    result, elapsed = timed(run_job, *SHORT_FLAGS, "--devices", "1", "--num-nodes", "2", "--init-method", init_method)
    assert result.returncode != 0
    assert (
        f"DistributedSetupError: rank 0 of 2 timed out after {TIMEOUT_S} s waiting for the rendezvous through "
        f"{used}; ranks that never arrived: [1]"
    ) in result.output, result.output[-4000:]
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + STARTUP_S
    wait_until_gone(tmp_path, rendezvous_dir)


def test_a_rendezvous_stuck_inside_torch_past_its_timeout_ends_the_rank_naming_it(run_job, tmp_path):
    # torch 2.13's TCPStore client waits forever, whatever the timeout, when rank 0's port is held by a process
    # that never accepts (a stale or foreign listener). Rank 1 of a 2-rank Flux job, as Flux starts it.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        url = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        result, elapsed = timed(run_job, *SHORT_FLAGS, "--init-method", url, env=flux_task(1, 2, "f42stuck"))
    assert result.returncode == 1, result.output[-4000:]
    assert (
        f"rank 1 of 2: the rendezvous through {url} has not returned 10 s after its {TIMEOUT_S} s timeout: it is "
        "stuck inside torch"
    ) in result.output, result.output[-4000:]
    assert TIMEOUT_S + 10 <= elapsed < TIMEOUT_S + 10 + STARTUP_S
    wait_until_gone(tmp_path)


def test_a_rendezvous_file_cut_short_mid_record_ends_the_waiting_rank_naming_it(tmp_path, rendezvous_dir):
    # A rank killed while appending a record leaves the log cut short (the file stops growing mid-record), and
    # torch's FileStore, reading that record, loops forever holding its lock. Here rank 1 "dies" so: the test appends
    # a record header announcing 64 bytes and writes 3, under FileStore's lock, while rank 0 waits for rank 1.
    url = f"file://{rendezvous_dir}/rdzv"
    path = rendezvous_dir / f"ldh-uid-{os.geteuid()}" / "rdzv"
    started = time.monotonic()
    with open(tmp_path / "rank0.log", "w") as log:
        rank_0 = subprocess.Popen(
            [sys.executable, str(FIT_JOB), "--out", str(tmp_path / "out"), *SHORT_FLAGS, "--init-method", url],
            cwd=tmp_path,
            env=flux_task(0, 2, "f42cut"),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            while not (path.exists() and path.stat().st_size > 0):  # rank 0's FileStore has written its first record
                assert rank_0.poll() is None and time.monotonic() - started < STARTUP_S, (
                    tmp_path / "rank0.log"
                ).read_text()
                time.sleep(0.05)
            with open(path, "ab") as store:
                fcntl.flock(store, fcntl.LOCK_EX)
                store.write(struct.pack("=I", 64) + b"cut")
            returncode = rank_0.wait(timeout=TIMEOUT_S + 10 + STARTUP_S)
        finally:
            rank_0.kill()
    output = (tmp_path / "rank0.log").read_text()
    assert returncode == 1, output[-4000:]
    # Rank 1 never claimed its place: the deadline names it, as torch's own timeout error would have.
    assert (
        f"rank 0 of 2 timed out after {TIMEOUT_S} s waiting for the rendezvous through file://{path}; ranks that "
        "never arrived: [1]. torch had not returned 10 s later"
    ) in output, output[-4000:]
    wait_until_gone(tmp_path, rendezvous_dir)


def test_a_rank_arriving_late_does_not_push_back_the_timeout_for_one_that_never_arrives(tmp_path, rendezvous_dir):
    # gloo waits for the ranks one after another, each wait with the whole timeout: rank 0 waits for rank 1, which
    # arrives after 10 s, then 30 s more for rank 2, which never does. Its deadline (the timeout plus 10 s) ends it
    # first, with the timeout's message. Rank 1 is left waiting on a rendezvous whose file the janitor removed when
    # rank 0 ended (a launcher would stop it at once; none runs here): its own deadline ends it.
    timeout_s = 30
    url = f"file://{rendezvous_dir}/late"
    flags = [*job_flags(timeout_s), "--devices", "3", "--init-method", url]
    logs = [tmp_path / f"rank{rank}.log" for rank in (0, 1)]

    def start(rank: int) -> subprocess.Popen:
        with open(logs[rank], "w") as log:
            return subprocess.Popen(
                [sys.executable, str(FIT_JOB), "--out", str(tmp_path / "out"), *flags],
                cwd=tmp_path,
                env=flux_task(rank, 3, "f42late"),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    rank_0 = start(0)
    ranks = [rank_0]
    try:
        # Rank 0's first progress line comes 10 s into its wait: rank 1 starts only then.
        while "rank 0: waiting for 2 of 3 ranks ([1, 2])" not in logs[0].read_text():
            assert rank_0.poll() is None, logs[0].read_text()[-4000:]
            time.sleep(0.1)
        ranks.append(start(1))
        returncode_0 = rank_0.wait(timeout=timeout_s + 10 + STARTUP_S)
        returncode_1 = ranks[1].wait(timeout=timeout_s + STARTUP_S)
    finally:
        for rank in ranks:
            rank.kill()
    output_0, output_1 = (log.read_text() for log in logs)
    path = rendezvous_dir / f"ldh-uid-{os.geteuid()}" / "late"
    assert returncode_0 == 1, output_0[-4000:]
    # Said by the deadline, 10 s after rank 0's own timeout: torch would have waited 30 s after rank 1 arrived.
    assert (
        f"rank 0 of 3 timed out after {timeout_s} s waiting for the rendezvous through file://{path}; ranks that "
        "never arrived: [2]. torch had not returned 10 s later"
    ) in output_0, output_0[-4000:]
    assert returncode_1 == 1, output_1[-4000:]
    assert f"rank 1 of 3: the rendezvous through file://{path} has not returned 10 s after its" in output_1, output_1[
        -4000:
    ]
    wait_until_gone(tmp_path, rendezvous_dir)


LAUNCHERS = {
    "lightning": lambda command: command,
    "torchrun": lambda command: [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *command[1:],
    ],
    "openmpi": lambda command: [*openmpi_run(), *command],
    # srun leaves the other tasks running when one fails unless told otherwise.
    "srun": lambda command: ["srun", "-N1", "--ntasks-per-node=2", "-J", "ldhfault", "--kill-on-bad-exit=1", *command],
}


# What says that rank 1 died. Lightning's launcher logs nothing visible before its SIGKILL, but rank 0 (the launching
# process) reports first: its next all-reduce fails as soon as the dead rank's sockets close. The other launchers
# stop rank 0 themselves (SIGTERM) and name the rank that failed.
DEATH_REPORTS = {
    "lightning": r"\[rank0\]: RuntimeError: .*Connection (closed|reset) by peer",
    "torchrun": r"rank\s*: 1 \(local_rank: 1\)\s+exitcode\s*: 1 ",
    "openmpi": r"The first process to do so was:\s+Process name: \[\[\d+,\d+\],1\]\s+Exit code:\s+1",
    "srun": r"task 1: Exited with exit code 1",
}


@pytest.mark.parametrize(
    "launcher", [pytest.param("lightning"), pytest.param("torchrun"), pytest.param("openmpi", marks=pytest.mark.mpi)]
)
def test_a_rank_that_dies_mid_fit_ends_the_job_and_leaves_nothing(tmp_path, rendezvous_dir, launcher):
    if launcher == "openmpi" and OPENMPI_MPIRUN is None:
        pytest.skip("OpenMPI's mpirun is not installed (.ci/install)")
    assert_a_dead_rank_ends_the_job(tmp_path, rendezvous_dir, launcher, job_environment())


# The test SLURM as a fixture of its own test (not asked for at run time): the fixture names what a test shares
# with others on this machine (tests/conftest.py, SHARED_BY_FIXTURE).
@pytest.mark.cluster
def test_a_rank_that_dies_mid_fit_ends_the_job_and_leaves_nothing_under_srun(slurm_cluster, tmp_path, rendezvous_dir):
    assert_a_dead_rank_ends_the_job(tmp_path, rendezvous_dir, "srun", slurm_environment())


def assert_a_dead_rank_ends_the_job(tmp_path: Path, rendezvous_dir: Path, launcher: str, env: dict[str, str]) -> None:
    command = LAUNCHERS[launcher](
        [
            sys.executable,
            str(FIT_JOB),
            "--out",
            str(tmp_path / "out"),
            # A long timeout: the job must end because rank 1 died, not because a peer gave up waiting for it,
            # nor because rank 1 started later than a short timeout on a loaded machine.
            *LONG_TIMEOUT_FLAGS,
            "--init-method",
            f"file://{rendezvous_dir}/",
            "--die-at-step",
            "3",
            "--die-rank",
            "1",
        ]
    )
    result, elapsed = timed(
        run_command, ["timeout", "150", *command], cwd=tmp_path, out_dir=tmp_path / "out", timeout=180, env=env
    )
    assert result.returncode not in (0, 124), result.output[-4000:]  # 124: the outer `timeout` had to stop it
    assert elapsed < STARTUP_S + 15, f"took {elapsed:.0f} s"
    assert result.ranks == {}, "no rank may finish the fit"
    assert re.search(DEATH_REPORTS[launcher], result.output), result.output[-4000:]
    wait_until_gone(tmp_path, rendezvous_dir)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            "--setup-hook",
            (
                "DistributedSetupError: setup_distributed_backend raised OSError on rank 1 of 2 "
                "(backend='gloo', init_method='env://'): site bootstrap service unreachable"
            ),
        ),
        (
            "--sampler-hook",
            (
                "SamplerHookError: configure_sampler raised KeyError on rank 1 of 2 for the validate "
                "dataloader: 'no weights for this dataset'"
            ),
        ),
    ],
    ids=["setup_distributed_backend", "configure_sampler"],
)
def test_an_exception_in_a_hook_on_one_rank_ends_every_rank_promptly(run_job, tmp_path, flag, message):
    # A long timeout: the job must end because rank 1 failed, not because rank 0 gave up waiting for it.
    result, elapsed = timed(run_job, flag, "raise", "--strategy", "ddp-instance", "--timeout", str(LONG_TIMEOUT_S))
    assert result.returncode != 0
    assert message in result.output, result.output[-4000:]
    assert elapsed < STARTUP_S + 15, f"took {elapsed:.0f} s"
    wait_until_gone(tmp_path)


@pytest.mark.parametrize("requested", ["rendezvous", ""], ids=["explicit-path", "per-launch"])
def test_a_file_rendezvous_where_flock_fails_ends_every_rank_naming_dir(
    run_job, tmp_path, rendezvous_dir, flock_shim, requested
):
    # A filesystem mounted without locking (NFS 'nolock', Lustre without -o flock): the LD_PRELOAD shim makes flock()
    # fail with ENOLCK under the rendezvous directory. Each rank probes flock in its private directory before torch's
    # FileStore takes one, and stops naming dir://, the scheme for such a filesystem (issue 30). A long timeout: the
    # job must end at once, not when the rendezvous times out.
    env = job_environment(LD_PRELOAD=str(flock_shim), LDH_NOLOCK_DIR=str(rendezvous_dir))
    url = f"file://{rendezvous_dir}/{requested}"
    result, elapsed = timed(
        run_job,
        "--strategy",
        "ddp-instance",
        "--timeout",
        str(LONG_TIMEOUT_S),
        "--backend",
        "gloo",
        "--devices",
        "2",
        "--init-method",
        url,
        env=env,
    )
    assert result.returncode == 1, result.output[-4000:]
    assert result.ranks == {}, "no rank may train"
    private = rendezvous_dir / f"ldh-uid-{os.geteuid()}"
    directory = re.escape(str(rendezvous_dir))
    assert re.search(
        rf"RuntimeError: torch_dist_init_method='file://{directory}/\S*': the filesystem of "
        rf"{re.escape(str(private))} refuses file locks \(flock: No locks available\), which torch's "
        rf"FileStore takes on the rendezvous file\. Use torch_dist_init_method='dir://{directory}/"
        rf"{requested}' instead",
        result.output,
    ), result.output[-4000:]
    assert "DistStoreError" not in result.output, "torch's own bare error is never reached"
    assert elapsed < STARTUP_S
    wait_until_gone(tmp_path, rendezvous_dir)  # every rank and janitor ended; no probe, claim or directory left


def test_a_stale_rendezvous_file_at_an_explicit_path_stops_the_next_run_naming_it(run_job, tmp_path, rendezvous_dir):
    # What a run killed together with its janitors (a crashed node) leaves: the file and every rank's claim.
    requested = rendezvous_dir / "rendezvous"
    path = rendezvous_dir / f"ldh-uid-{os.geteuid()}" / "rendezvous"  # inside the per-user directory (issue 9)
    for rank in (0, 1):
        FileInitMethod().prepare(f"file://{requested}", Rank(rank))
    stale = sorted(path.parent.iterdir())
    result, elapsed = timed(run_job, *SHORT_FLAGS, "--init-method", f"file://{requested}")
    assert result.returncode != 0
    assert (
        f"found {path}.rank0.claim and {path} left by an earlier run with the same job identity that did not "
        f"finish cleanly"
    ) in result.output, result.output[-4000:]
    assert f"remove {path} and {path}.rank*.claim, then start again" in result.output
    assert elapsed < TIMEOUT_S + STARTUP_S
    assert sorted(path.parent.iterdir()) == stale, "another run's files are never deleted automatically"
    wait_until_gone(tmp_path)


def _janitor_for(directory: Path) -> Janitor:
    return Janitor(
        os.open(directory, os.O_RDONLY | os.O_DIRECTORY),
        os.open(directory.parent, os.O_RDONLY | os.O_DIRECTORY),
        directory.name,
    )


def test_the_janitor_removes_the_files_when_its_rank_ends_without_cleaning_up(tmp_path):
    files = [tmp_path / "rendezvous", tmp_path / "rendezvous.rank0.claim"]
    janitor = _janitor_for(tmp_path)
    for path in files:
        path.touch()
        janitor.watch(path.name, os.open(path, os.O_RDONLY))
    os.close(janitor._socket_fd)  # what the kernel does when the rank dies, however it dies
    assert janitor.process.wait(timeout=10) == 0
    assert not [path for path in files if path.exists()]


def test_a_janitor_whose_rank_cleaned_up_touches_nothing(tmp_path):
    # Files of the same name that exist after a rank cleaned up belong to a later run: they must stay.
    later_run = tmp_path / "rendezvous"
    later_run.touch()
    janitor = _janitor_for(tmp_path)
    janitor.watch(later_run.name, os.open(later_run, os.O_RDONLY))
    janitor.dismiss()
    assert janitor.process.returncode == 0 and later_run.exists()
