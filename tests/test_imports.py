"""Importing the package, or any module of it (as ``--doctest-modules`` does), changes nothing outside it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import job_environment

# Part of the fast subset .ci/compat runs at the ends of the supported version ranges.
pytestmark = [pytest.mark.compat, pytest.mark.slow]

# Runs in a fresh interpreter, in an empty directory: the state of the process before and after the imports
# (torch's backends and rendezvous schemes, the environment, threads, files, whether MPI was initialised).
_IMPORT_EVERYTHING = """
import json, os, pkgutil, sys, threading
import pytorch_lightning  # its own import starts a native thread: only what ours adds on top counts
import torch.distributed as dist
from torch.distributed.rendezvous import _rendezvous_handlers

def state():
    return {"backends": sorted(dist.Backend.backend_list), "schemes": sorted(_rendezvous_handlers),
            "environ": dict(os.environ), "threads": threading.active_count(), "files": sorted(os.listdir(".")),
            "native_threads": len(os.listdir("/proc/self/task")), "mpi_started": "mpi4py.MPI" in sys.modules}

before = state()
import lightning_dist_hooks
modules = [info.name for info in pkgutil.walk_packages(lightning_dist_hooks.__path__, "lightning_dist_hooks.")]
for name in modules:
    __import__(name)
after = state()
print(json.dumps({"modules": modules,
                  "changed": {key: [before[key], after[key]] for key in before if before[key] != after[key]}}))
"""


def test_importing_every_module_registers_nothing_starts_nothing_and_sets_nothing(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERYTHING],
        cwd=tmp_path,
        env=job_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout.splitlines()[-1])
    expected = {"lightning_dist_hooks.init_methods._shared_filesystem.janitor", "lightning_dist_hooks.mpi._engine"}
    assert expected <= set(report["modules"])
    assert report["changed"] == {}
