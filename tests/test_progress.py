"""Rendezvous progress: who is still missing, reported while ranks wait, and nothing when all arrive at once."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import FIT_JOB, job_environment

from lightning_dist_hooks.process_group.progress import ReportSchedule, rendezvous_progress, waiting_message

FAST = ReportSchedule(first=(0.2, 0.5), every=0.5)


@pytest.mark.unit
def test_the_schedule_grows_then_repeats_every_minute():
    times = ReportSchedule().times()
    assert [next(times) for _ in range(5)] == [10, 30, 90, 150, 210]


@pytest.mark.unit
def test_rank_0_reports_the_missing_ranks_at_info_level_while_it_waits(caplog):
    caplog.set_level(logging.DEBUG, logger="lightning_dist_hooks.process_group.progress")
    arrived = []
    with rendezvous_progress(
        0,
        4,
        "file:///shared/rdzv/run42",
        timedelta(seconds=60),
        lambda: [rank for rank in (1, 2, 3) if rank not in arrived],
        FAST,
    ):
        time.sleep(0.35)
        arrived.append(2)
        time.sleep(0.35)
    lines = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert [(level, re.sub(r"\d+ s of", "N s of", message)) for level, message in lines] == [
        (logging.INFO, "rank 0: waiting for 3 of 4 ranks ([1, 2, 3]) through file:///shared/rdzv/run42, N s of 60 s"),
        (logging.INFO, "rank 0: waiting for 2 of 4 ranks ([1, 3]) through file:///shared/rdzv/run42, N s of 60 s"),
    ]


@pytest.mark.unit
def test_other_ranks_report_at_debug_level_and_say_when_the_rendezvous_cannot_tell(caplog):
    caplog.set_level(logging.DEBUG, logger="lightning_dist_hooks.process_group.progress")
    with rendezvous_progress(3, 4, "tcp://10.0.0.1:29500", timedelta(seconds=60), lambda: None, FAST):
        time.sleep(0.35)
    (record,) = caplog.records
    assert record.levelno == logging.DEBUG
    assert record.getMessage().startswith(
        "rank 3: waiting for the other ranks of 4 (this rendezvous does not tell which have arrived) through "
        "tcp://10.0.0.1:29500, 0 s of 60 s"
    )


@pytest.mark.unit
def test_nothing_is_reported_when_the_wait_ends_before_the_first_report(caplog):
    caplog.set_level(logging.DEBUG, logger="lightning_dist_hooks.process_group.progress")
    asked = []

    def ask() -> list[int]:
        asked.append(1)
        return [1]

    with rendezvous_progress(0, 2, "env://", timedelta(seconds=60), ask, FAST):
        pass
    time.sleep(0.4)
    assert caplog.records == [] and asked == []


@pytest.mark.unit
def test_once_every_rank_has_arrived_the_line_says_the_backend_is_connecting_them():
    message = waiting_message(0, 2, "env://", 12, timedelta(seconds=15), [])
    assert message == (
        "rank 0: all 2 ranks have arrived; waiting for the backend to connect them through env://, 12 s of 15 s"
    )


def _start_rank(rank: int, flags: list[str], tmp_path: Path, port: int) -> subprocess.Popen:
    # Two "nodes" of one device under Lightning's environment, started by hand as a cluster script would.
    env = job_environment(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2"
    )
    with open(tmp_path / f"rank{rank}.log", "w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, str(FIT_JOB), "--out", str(tmp_path / "out"), *flags],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _wait_for_lines(process: subprocess.Popen, log: Path, pattern: str, within_s: float) -> list[str]:
    """The lines of ``log`` that ``pattern`` finds, as soon as there are any; fails (showing the log) if ``process``
    ends or ``within_s`` passes first."""
    deadline = time.monotonic() + within_s
    while not (found := re.findall(pattern, log.read_text())):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.2)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["file", "dir"])
def test_a_rank_held_back_is_named_by_rank_0_while_it_waits(tmp_path, free_port, scheme):
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    flags = [
        "--devices",
        "1",
        "--num-nodes",
        "2",
        "--strategy",
        "ddp-instance",
        "--timeout",
        "60",
        "--backend",
        "gloo",
        "--epochs",
        "1",
        "--init-method",
        f"{scheme}://{rendezvous}/run",
    ]
    rank0 = _start_rank(0, flags, tmp_path, free_port)
    # Rank 1 starts late: rank 0 waits past its first report (10 s), not past the second (30 s). While it waits, the
    # path the line names is where the files really are (issue 30): inside the per-user directory, not the URL as
    # given, which a user checking the shared directory would look for in vain. The 10 s count from the start of the
    # wait, which Lightning's line announces: the start-up before it (importing torch and Lightning) took more than
    # 25 s on CI's 2 loaded cores.
    _wait_for_lines(rank0, tmp_path / "rank0.log", r"Initializing distributed: GLOBAL_RANK: 0", within_s=120)
    reports = _wait_for_lines(rank0, tmp_path / "rank0.log", r"rank 0: waiting for .*(?=\n)", within_s=25)
    report = re.fullmatch(rf"rank 0: waiting for .* through {scheme}://(/\S+), \d+ s of 60 s", reports[0])
    assert report, reports[0]
    printed = Path(report[1])
    assert printed == rendezvous / f"ldh-uid-{os.geteuid()}" / "run"
    assert printed.parent.is_dir() and printed.is_file(), sorted(rendezvous.rglob("*"))  # rank 0 made it: ls finds it
    assert not (rendezvous / "run").exists()
    rank1 = _start_rank(1, flags, tmp_path, free_port)
    assert [rank0.wait(timeout=120), rank1.wait(timeout=120)] == [0, 0]
    output = (tmp_path / "rank0.log").read_text()
    reports = re.findall(r"rank 0: waiting for .*", output)
    assert len(reports) == 1, output[-4000:]
    assert re.fullmatch(
        rf"rank 0: waiting for 1 of 2 ranks \(\[1\]\) through {scheme}://{rendezvous}/"
        rf"ldh-uid-{os.geteuid()}/run, 1\d s of 60 s",
        reports[0],
    )


@pytest.mark.slow
def test_ranks_that_arrive_together_print_no_progress(tmp_path, free_port):
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    flags = [
        "--devices",
        "1",
        "--num-nodes",
        "2",
        "--strategy",
        "ddp-instance",
        "--timeout",
        "60",
        "--backend",
        "gloo",
        "--epochs",
        "1",
        "--init-method",
        f"file://{rendezvous}/run",
    ]
    ranks = [_start_rank(rank, flags, tmp_path, free_port) for rank in (0, 1)]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    output = (tmp_path / "rank0.log").read_text()
    assert "All distributed processes registered" in output
    assert "waiting for" not in output, output[-4000:]
