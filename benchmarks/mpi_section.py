"""``--with-mpi``: runs ``benchmarks/mpi_allreduce.py`` (the MPI backend's own benchmark) under mpirun."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from benchmarks.common import REPO, job_environment, start, wait_all

SCRIPT = REPO / "benchmarks" / "mpi_allreduce.py"


def unavailable_reason() -> str:
    """Why the MPI section cannot run here, or "" when it can."""
    if shutil.which("mpirun") is None:
        return "mpirun not found"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py not installed"
    if not SCRIPT.exists():
        return f"{SCRIPT.name} not found"
    return ""


def run(quick: bool, workdir: Path) -> dict:
    reason = unavailable_reason()
    if reason:
        return {"skipped": reason}
    out = workdir / "mpi_allreduce.json"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # Loopback and shared memory only: no other network interface is touched.
    command = [
        "mpirun",
        *root,
        "--oversubscribe",
        "--mca",
        "oob_tcp_if_include",
        "lo",
        "--mca",
        "btl",
        "self,vader",
        "-n",
        "2",
        sys.executable,
        str(SCRIPT),
        "--json",
        str(out),
        *(["--quick"] if quick else []),
    ]
    log = workdir / "mpi_allreduce.log"
    # Its own session, so that a timeout kills the ranks too, not only mpirun.
    wait_all([start(command, job_environment(), log)], timeout=300 if quick else 900, log=log)
    return json.loads(out.read_text())
