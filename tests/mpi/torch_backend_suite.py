"""torch's own backend tests, ``DistributedTest._DistTestBase`` from the installed torch wheel, run on the MPI
transport (``mpi4py``) the way torch's CI ran them on its native MPI backend: every rank of one ``mpirun`` job runs
every selected test, in the same order, on one default process group created at start-up.

Usage (under mpirun -n 3):
    python torch_backend_suite.py MODE REPORT_DIR [--timeout S] [--select PATTERN ...] [--not-run NAME ...]

MODE picks the skip set torch's decorators apply (they read ``BACKEND``): ``mpi`` runs what torch ran on its MPI
backend, ``gloo`` the CPU tests torch runs on gloo and never ran on MPI. In both, the default group and every group a
test makes are the transport's. ``--select`` PATTERNs (regular expressions, any matches) narrow the tests (none:
all); ``--not-run`` names tests reported as ``not run`` without running them (those that would end the job, such as
a barrier that must time out: an MPI operation cannot).

Each rank writes one JSON line per test to REPORT_DIR/rank-R.txt (``_setup.RankReport``):
``{"test", "outcome": "passed"|"failed"|"skipped"|"not run", "detail", "seconds"}``. A test that runs past the
timeout ends the rank with exit code 1 after printing every thread's stack, which names the test (and so ends the
job: mpirun ends the others): no hang outlives the timeout.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("mode", choices=["mpi", "gloo"])
parser.add_argument("report_dir")
parser.add_argument("--timeout", type=float, default=60.0, help="seconds one test may take")
parser.add_argument("--barrier-timeout", type=float, default=40.0, help="the least seconds torch's file barrier waits")
parser.add_argument("--select", nargs="*", default=[], help="regular expressions: run the tests any matches")
parser.add_argument("--not-run", nargs="*", default=[], help="tests to report as not run")
arguments = parser.parse_args()
mode, report_dir = arguments.mode, arguments.report_dir
# torch's test module reads these at import: its skip decorators read BACKEND, its file barrier TEMP_DIR.
os.environ["BACKEND"] = mode
os.environ.setdefault("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", ""))
# One directory for all ranks (torch's barrier is a directory of files): beside the report, which all ranks share.
temp_dir = Path(report_dir) / "torch-temp"
temp_dir.mkdir(exist_ok=True)
os.environ["TEMP_DIR"] = str(temp_dir)
(temp_dir / "barrier").mkdir(exist_ok=True)
(temp_dir / "test_dir").mkdir(exist_ok=True)
tempfile.tempdir = str(temp_dir)

import torch.distributed as dist  # noqa: E402 - after BACKEND is set
from _setup import RankReport, init_from_mpi_launch, mpi  # noqa: E402
from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402 - torch's, which compares tensors
from torch.testing._internal.distributed import distributed_test  # noqa: E402 - reads BACKEND at import

# torch names the backends whose profiler events its tests check; the transport records its events as torch's
# backends do ("<backend>:<operation>"), so it joins those lists.
for supported in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                  "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):  # fmt: skip
    getattr(distributed_test, supported).append(mpi.BACKEND_NAME)

# A test that asks for a group of its BACKEND (new_group(backend="gloo")) gets the transport's: the point is to run
# each body on the transport, and torch's MPI mode made every group with the default group's backend.
_torchs_new_group = dist.new_group


def new_group_of_the_transport(*args: Any, **kwargs: Any) -> Any:
    if kwargs.get("backend") in (mode, dist.Backend(mode)):
        kwargs["backend"] = mpi.BACKEND_NAME
    return _torchs_new_group(*args, **kwargs)


dist.new_group = new_group_of_the_transport

rank, world_size = init_from_mpi_launch(mpi.BACKEND_NAME)
SKIP_REASONS_BY_EXIT_CODE = {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}


class TorchBackendTests(TestCase, distributed_test.DistributedTest._DistTestBase):
    """torch's bodies with what torch's runner gives each test: its rank and the world size."""

    rank = rank
    world_size = world_size

    def _barrier(self, *args: Any, **kwargs: Any) -> None:
        # torch's file barrier (its test harness, not the transport: files polled under a lock) gives up after 10 s,
        # sized for torch's CI machines. Where 3 ranks share 2 cores with other jobs, one rank can reach it more than
        # 10 s after the others; that rank then goes on to the next test alone, and every later test of the job
        # waits on peers that are elsewhere. The floor stays below the per-test timeout, so a real hang is still
        # torch's "barrier timeout" inside the test that hangs.
        kwargs["timeout"] = max(kwargs.get("timeout", 10), arguments.barrier_timeout)
        super()._barrier(*args, **kwargs)


def selected_tests() -> list[str]:
    names = sorted(name for name in dir(TorchBackendTests) if name.startswith("test_"))
    if not arguments.select:
        return names
    return [name for name in names if any(re.search(pattern, name) for pattern in arguments.select)]


class OneLinePerTest(unittest.TestResult):
    """Reports each test's outcome as it ends; arms the per-test timeout as each starts."""

    def __init__(self, report: RankReport) -> None:
        super().__init__()
        self._report = report
        self._started = 0.0
        self._outcome: tuple[str, str] = ("passed", "")

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        super().startTest(test)
        self._started, self._outcome = time.monotonic(), ("passed", "")
        faulthandler.dump_traceback_later(arguments.timeout, exit=True)

    def addError(self, test: unittest.TestCase, err: tuple) -> None:  # noqa: N802 - unittest's name
        # torch's multi-process runner reads some skips from the exit code of the test's process (a test that needs
        # GPUs calls sys.exit(TEST_SKIPS[...].exit_code)); here the test runs in the rank itself.
        error = err[1]
        if isinstance(error, SystemExit) and error.code in SKIP_REASONS_BY_EXIT_CODE:
            self.addSkip(test, SKIP_REASONS_BY_EXIT_CODE[error.code])
            return
        super().addError(test, err)
        self._outcome = ("failed", self.errors[-1][1])

    def addFailure(self, test: unittest.TestCase, err: tuple) -> None:  # noqa: N802 - unittest's name
        super().addFailure(test, err)
        self._outcome = ("failed", self.failures[-1][1])

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802 - unittest's name
        super().addSkip(test, reason)
        self._outcome = ("skipped", reason)

    def stopTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        faulthandler.cancel_dump_traceback_later()
        outcome, detail = self._outcome
        seconds = round(time.monotonic() - self._started, 3)
        self._report.line(json.dumps({"test": test._testMethodName, "outcome": outcome, "detail": detail[-3000:],
                                      "seconds": seconds}))  # fmt: skip
        super().stopTest(test)


report = RankReport(report_dir, rank)
to_run = [name for name in selected_tests() if name not in arguments.not_run]
for name in sorted(set(selected_tests()) & set(arguments.not_run)):
    report.line(json.dumps({"test": name, "outcome": "not run", "detail": "", "seconds": 0}))
unittest.TestSuite(TorchBackendTests(name) for name in to_run).run(OneLinePerTest(report))
dist.destroy_process_group()
