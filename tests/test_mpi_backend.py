"""The mpi4py torch.distributed backend (``lightning_dist_hooks.mpi``): unit tests, then real ``mpirun -n 2`` jobs.

The job scripts live in tests/mpi/. Jobs need Open MPI's mpirun and mpi4py and are skipped without them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    MPI_JOBS,
    REPO,
    MpiJob,
    mpi_job_environment,
    needs_mpi,
    needs_transport_torch,
    processes_mentioning,
    run_mpi_job,
)

from lightning_dist_hooks import mpi

JOB_TIMEOUT_S = 240  # start-up alone (importing torch and Lightning twice on 2 cores) can take 30 s
WATCHDOG_TIMEOUT_S = 5
# Time from rank 0 entering the skipped collective to mpirun's exit: the timeout, at most one watchdog period,
# and MPI_Abort tearing the job down.
WATCHDOG_MARGIN_S = 15


def run_mpi(script: str | Path, *args: str, report_dir: Path | None = None, pause_dir: Path | None = None) -> MpiJob:
    """Run ``script`` (a name in tests/mpi/, or a path) under ``mpirun -n 2``; stdout and stderr together in
    ``.output``."""
    return run_mpi_job(script, *args, timeout_s=JOB_TIMEOUT_S, report_dir=report_dir, pause_dir=pause_dir)


# --- without MPI ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.compat
@needs_transport_torch
def test_register_adds_backend_and_init_method_without_starting_mpi_and_import_adds_nothing() -> None:
    code = """
import sys
import _setup  # imports lightning_dist_hooks.mpi alone
import torch.distributed as dist
from torch.distributed.rendezvous import _rendezvous_handlers
from lightning_dist_hooks import mpi
print("mpi4py" in dist.Backend.backend_list, "mpi" in _rendezvous_handlers)
mpi.register()
mpi.register()
print(repr(dist.Backend("mpi4py")), "mpi4py" in dist.Backend.backend_list, "mpi" in _rendezvous_handlers,
      mpi.mpi_init_method(), mpi.backend_for_mpi(), "mpi4py.MPI" in sys.modules)
"""
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=MPI_JOBS,
        env=mpi_job_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["False", "False", "'mpi4py'", "True", "True", "mpi://", "mpi4py", "False"]


@pytest.mark.unit
def test_a_reduce_op_hashes_to_its_op_code() -> None:
    # The blocking allreduce looks up its MPI reduction by hash(opts.reduceOp): distinct ops need distinct hashes.
    dist = torch.distributed
    ops = [op for name, op in dist.ReduceOp.RedOpType.__members__.items() if name != "PREMUL_SUM"]
    for op in [*ops, dist._make_nccl_premul_sum(2.0)]:  # PREMUL_SUM exists only with its factor
        # Any: torch's stubs give ReduceOp no ``op`` and take no RedOpType member, which torch's collectives set
        # (pybind11 converts it).
        options: Any = dist.AllreduceOptions()
        options.reduceOp = op
        assert hash(options.reduceOp) == options.reduceOp.op.value
    assert len(ops) + 1 == len(dist.ReduceOp.RedOpType.__members__)


@pytest.mark.unit
def test_missing_mpi4py_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", None)
    assert not mpi.is_available()
    hint = 'pip install "mpi4py>=4.0,<5" (from a clone of lightning-dist-hooks: pip install ".[mpi]")'
    with pytest.raises(ImportError, match=re.escape(hint)):
        mpi.init_mpi()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            mpi.MpiLaunch(rank=3, world_size=8, local_rank=1, local_world_size=4),
        ),
        ({"PMI_RANK": "2", "PMI_SIZE": "3"}, mpi.MpiLaunch(rank=2, world_size=3, local_rank=0, local_world_size=1)),
        ({"RANK": "0", "WORLD_SIZE": "2"}, None),
    ],
    ids=["open-mpi", "hydra-without-local-values", "torchrun"],
)
def test_detect_mpi_launch(environ: dict[str, str], expected: mpi.MpiLaunch | None) -> None:
    assert mpi.detect_mpi_launch(environ) == expected
    assert mpi.launched_by_mpi(environ) == (expected is not None)


# --- mpirun jobs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectivesJob:
    """What collectives.py reported: each rank's lines from its own file, and the job's merged output for messages."""

    returncode: int
    output: str
    reports: dict[int, list[str]]

    def passed(self, rank: int) -> set[str]:
        """The names of the checks ``rank`` reports as passed."""
        prefix = f"rank {rank} passed: "
        return {line[len(prefix) :] for line in self.reports[rank] if line.startswith(prefix)}


@pytest.fixture(scope="module")
def collectives_job(tmp_path_factory: pytest.TempPathFactory) -> CollectivesJob:
    """One job for collectives.py: every collective against expected values, then reductions against gloo."""
    report_dir = tmp_path_factory.mktemp("collectives-reports")
    job = run_mpi("collectives.py", str(report_dir), report_dir=report_dir)
    return CollectivesJob(job.returncode, job.output, job.reports)


CHECKS_ON_EVERY_RANK = (
    "allreduce AVG torch.bfloat16",
    "allreduce BXOR torch.bool",
    "allreduce SUM torch.int8 wraps around",
    "async allreduce future",
    "reduce_scatter_tensor AVG bfloat16",
    "all_to_all_single uneven",
    "non-CPU tensor rejected",
    "mpi:// refuses a rank that disagrees with MPI",
)
CHECKS_ON_RANK_0 = ("recv any source #1 payload", "subgroup allreduce")  # the receiver; the even ranks' group


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@needs_mpi
def test_every_collective_gives_the_expected_values(collectives_job: CollectivesJob) -> None:
    output = collectives_job.output[-8000:]
    assert set(collectives_job.reports) == {0, 1}, output
    for rank, lines in collectives_job.reports.items():
        assert not [line for line in lines if "FAILED" in line], output
        passed = collectives_job.passed(rank)
        assert f"rank {rank}: {len(passed)} checks passed" in lines, output
        expected = [*CHECKS_ON_EVERY_RANK, *(CHECKS_ON_RANK_0 if rank == 0 else ())]
        for name in expected:
            assert any(name in check for check in passed), f"rank {rank} lacks {name!r}"
    assert collectives_job.returncode == 0, output


ROUTE_OPERATIONS = (
    "allreduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_to_all",
    "barrier",
    "isend_irecv",
)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@needs_mpi
@pytest.mark.parametrize("route", ["wait", "future"])
@pytest.mark.parametrize("operation", ROUTE_OPERATIONS)
def test_every_operation_completes_by_wait_and_by_its_future_on_both_ranks(
    collectives_job: CollectivesJob, operation: str, route: str
) -> None:
    # Each at 32 bytes (run on the caller's thread) and 1 MiB (run by the group's queue thread).
    assert set(collectives_job.reports) == {0, 1}, collectives_job.output[-8000:]
    for rank, lines in collectives_job.reports.items():
        assert not [line for line in lines if f"FAILED route {operation} " in line], collectives_job.output[-8000:]
        assert {f"route {operation} small {route}", f"route {operation} queued {route}"} <= collectives_job.passed(rank)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@needs_mpi
def test_collectives_keep_their_issue_order_across_the_queue(collectives_job: CollectivesJob) -> None:
    output = collectives_job.output[-8000:]
    assert set(collectives_job.reports) == {0, 1}, output
    for rank in collectives_job.reports:
        assert "route issue order behind queued collectives" in collectives_job.passed(rank), output


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
def test_reductions_sparse_ones_and_ddp_and_fsdp_training_are_bitwise_equal_to_gloo(
    collectives_job: CollectivesJob,
) -> None:
    output = collectives_job.output[-8000:]
    assert set(collectives_job.reports) == {0, 1}, output
    for rank, lines in collectives_job.reports.items():
        assert not [line for line in lines if "MISMATCH" in line], output
        results = [re.fullmatch(rf"rank {rank}: (\d+) comparisons \((\d+) FSDP parameters, (\d+) sparse\), "
                                r"(\d+) bitwise equal", line) for line in lines]  # fmt: skip
        ((total, fsdp, sparse, equal),) = [tuple(map(int, found.groups())) for found in results if found]
        assert total == equal > 60
        assert fsdp == 8  # weight and bias of two layers, for FSDP1 and FSDP2
        assert sparse == 5  # two sparse all-reduces; DDP's embedding weight and its linear layer's weight and bias


def _train_and_inspect_sockets(backend: str, tmp_path: Path) -> tuple[dict[str, torch.Tensor], dict[int, set[int]]]:
    """Run ddp_train.py; while it is paused mid-training, record each rank's listening TCP ports."""
    pause_dir = tmp_path / f"pause-{backend}"
    pause_dir.mkdir()
    out_file = tmp_path / f"{backend}.pt"
    job = run_mpi("ddp_train.py", backend, str(out_file), "--pause-dir", str(pause_dir), pause_dir=pause_dir)
    assert job.returncode == 0, job.output[-8000:]
    return torch.load(out_file), job.listening


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@needs_mpi
def test_ddp_trains_bitwise_like_gloo_without_listening_sockets(tmp_path: Path) -> None:
    ours, ours_listening = _train_and_inspect_sockets("mpi4py", tmp_path)
    gloo, gloo_listening = _train_and_inspect_sockets("gloo", tmp_path)
    assert ours_listening == {0: set(), 1: set()}
    assert gloo_listening[0], "the socket inspection must see gloo's TCP store listening on rank 0"
    assert ours.keys() == gloo.keys()
    for name in ours:
        assert torch.equal(ours[name], gloo[name]), f"{name} differs between mpi4py and gloo"


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize(("mode", "shape"), [("blocking", "[4]"), ("future", "[4]"), ("queued", "[262144]")])
def test_watchdog_aborts_a_collective_another_rank_skipped(mode: str, shape: str) -> None:
    job = run_mpi("timeout_job.py", mode, str(WATCHDOG_TIMEOUT_S))
    ended = time.time()
    assert job.returncode != 0, job.output[-6000:]
    waiting_since = re.search(r"waiting since ([\d.]+)", job.output)
    assert waiting_since, job.output[-6000:]
    assert WATCHDOG_TIMEOUT_S <= ended - float(waiting_since.group(1)) <= WATCHDOG_TIMEOUT_S + WATCHDOG_MARGIN_S
    assert (
        f"rank 0: allreduce(SUM) of float32{shape} on the default process group did not complete within the process "
        f"group timeout ({WATCHDOG_TIMEOUT_S} s)" in job.output
    )
    assert "MPI_Abort" in job.output
    assert "completed although rank 1 skipped it" not in job.output


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize(("mode", "shape"), [("blocking", r"\[4\]"), ("queued", r"\[262144\]")])
def test_an_mpi_error_ends_the_job_at_once_saying_so(mode: str, shape: str) -> None:
    job = run_mpi("mpi_error_job.py", mode)
    ended = time.time()
    assert job.returncode != 0, job.output[-6000:]
    started = re.search(r"broadcasting since ([\d.]+)", job.output)
    assert started, job.output[-6000:]
    assert ended - float(started.group(1)) <= WATCHDOG_MARGIN_S  # the 600 s timeout plays no part
    assert re.search(
        rf"rank \d: broadcast from rank 7 of float32{shape} on the default process group failed with an "
        r"MPI error \(.*MPI_ERR_ROOT",
        job.output,
    ), job.output[-6000:]
    assert "from an invalid root returned" not in job.output


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@needs_mpi
def test_lightning_trainer_fits_on_the_mpi4py_backend_and_its_profiler_shows_the_communication(tmp_path: Path) -> None:
    job = run_mpi("lightning_fit.py", str(tmp_path), "--profile")
    assert job.returncode == 0, job.output[-8000:]
    for rank in (0, 1):
        # Lightning's PyTorchProfiler writes each rank's Chrome trace as STAGE-FILENAME-RANK-ACTION.ID.pt.trace.json
        (trace,) = tmp_path.glob(f"*-profile-{rank}-*.pt.trace.json")
        events = {event["name"] for event in json.loads(trace.read_text())["traceEvents"] if "name" in event}
        # DDP's gradient buckets and sync_dist (all_reduce), DDP's start-up (broadcast), Lightning's barriers
        assert {"mpi4py:all_reduce", "mpi4py:broadcast", "mpi4py:barrier"} <= events, sorted(events)[:50]
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for record in records:
        assert record["backend"] == "mpi4py"
        assert record["int_mean"] == 2  # int64 AVG of 1 and 4 truncates, as after Lightning's gloo fallback
        assert record["float_sum"] == 3.0
        assert record["broadcast"] == {"from": 1}
        assert record["all_gather"] == [[0], [1]]
    assert records[0]["parameters"] == records[1]["parameters"]
    assert records[0]["logged_train_loss"] == records[1]["logged_train_loss"]


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
def test_benchmark_quick_run(tmp_path: Path) -> None:
    results_file = tmp_path / "results.json"
    job = run_mpi(
        REPO / "benchmarks" / "mpi_allreduce.py", "--quick", "--background-load", "1", "--json", str(results_file)
    )
    assert job.returncode == 0, job.output[-8000:]
    assert not processes_mentioning("mpi_allreduce.py --background-load spinner")
    assert "1 busy-looping background process(es)" in job.output
    assert "DDP training step" in job.output
    results = json.loads(results_file.read_text())
    assert [row["bytes"] for row in results["allreduce"]] == [4 << 10, 64 << 10]
    for row in results["allreduce"]:
        assert set(row["median_seconds"]) == {"mpi4py backend", "gloo", "raw mpi4py", "raw, torch memory"}
        assert all(seconds > 0 for seconds in row["median_seconds"].values())
    assert set(results["ddp_step"]["median_seconds"]) == {"mpi4py backend", "gloo"}
    assert set(results["sync_dist_step"]["median_seconds"]) == {"mpi4py backend", "gloo"}
    routes = {"blocking", "async_op, wait()", "async_op, future (DDP's route)"}
    assert [row["bytes"] for row in results["completion_routes"]] == [4 << 10, 64 << 10]
    for row in results["completion_routes"]:
        assert set(row["median_seconds"]) == routes
        assert set(row["time_relative_to_blocking"]) == routes - {"blocking"}
        assert all(ratio > 0 for ratio in row["time_relative_to_blocking"].values())
    assert "Completion routes of an all-reduce" in job.output
    tail = results["ddp_backward_tail"]
    assert tail["steps"] == 2 * 2  # rounds x steps per round in --quick, the warm-up step left out
    assert set(tail["median_seconds"]) == {"mpi4py backend", "gloo"}
    assert "DDP backward's wait after its last bucket was ready" in job.output
    timed_rows = [*results["allreduce"], *results["completion_routes"], results["sync_dist_step"], results["ddp_step"]]
    for row in [*timed_rows, tail]:
        for name, (first_quartile, third_quartile) in row["iqr_seconds"].items():
            assert 0 < first_quartile <= row["median_seconds"][name] <= third_quartile
    assert len(results["load_average_before"]) == len(results["load_average_after"]) == 3
    assert results["background_load_processes"] == 1
    assert "Lightning's sync_dist pattern" in job.output
