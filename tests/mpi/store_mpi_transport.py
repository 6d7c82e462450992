"""The MPI transport meeting through ``mpi://``: no socket and no file of the store's own, then gloo subgroups and a
DeviceMesh on its store.

Usage (under mpirun -n 2, TMPDIR and the working directory fresh): python store_mpi_transport.py REPORT_DIR PAUSE_DIR

Each rank initialises MPI, then snapshots its open file descriptors (``/proc/self/fd``) and every path under the
temporary directory and the working directory; it initialises the default group (``mpi4py`` + ``mpi://``), uses
its store (set, get of the other rank's key, add), snapshots again, writes PAUSE_DIR/rank<R>.pid and waits for
PAUSE_DIR/resume (``_setup.pause_for_inspection``; the test reads the rank's listening sockets meanwhile). Then it
all-reduces on a gloo group made with ``new_group`` and on a 1-D ``DeviceMesh``. It reports one JSON line
(``_setup.RankReport``) with what it saw.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from _setup import RankReport, barrier, mpi, pause_for_inspection
from torch.distributed.device_mesh import init_device_mesh


def open_files() -> dict[str, str]:
    """File descriptor -> what it refers to (``pipe:[...]``, ``socket:[...]``, a path), for this process."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the descriptor listdir itself used, closed since
    return found


def paths_under(*roots: str) -> list[str]:
    return sorted(str(path) for root in roots for path in Path(root).rglob("*"))


def main() -> None:
    report_dir, pause_dir = sys.argv[1], Path(sys.argv[2])
    roots = (tempfile.gettempdir(), os.getcwd())
    mpi.init_mpi()
    barrier()  # every rank's MPI_Init done: Open MPI's session files are all there
    files_before, paths_before = open_files(), paths_under(*roots)

    dist.init_process_group(mpi.BACKEND_NAME, init_method=mpi.mpi_init_method(), timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"from-rank-{rank}", f"hello from {rank}")
    other = store.get(f"from-rank-{1 - rank}").decode()
    added = store.add("counter", rank + 1)
    barrier()
    counter = int(store.get("counter"))
    barrier()
    files_after, paths_after = open_files(), paths_under(*roots)
    pause_for_inspection(pause_dir, rank)

    gloo = dist.new_group([0, 1], backend="gloo")
    on_gloo = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
    dist.all_reduce(on_gloo, group=gloo)
    mesh = init_device_mesh("cpu", (2,))
    on_mesh = torch.tensor([rank + 1, 100 * (rank + 1)])
    dist.all_reduce(on_mesh, group=mesh.get_group())
    on_default = torch.tensor([rank + 1.0])
    dist.all_reduce(on_default)
    record = {
        "rank": rank,
        "roots": roots,
        "files_before": files_before,
        "files_opened": {fd: target for fd, target in files_after.items() if files_before.get(fd) != target},
        "files_closed": sorted(set(files_before) - set(files_after)),
        "paths_before": paths_before,
        "paths_added": sorted(set(paths_after) - set(paths_before)),
        "paths_removed": sorted(set(paths_before) - set(paths_after)),
        "store": {"other": other, "added": added, "counter": counter},
        "default_backend": dist.get_backend(),
        "gloo_backend": dist.get_backend(gloo),
        "gloo_all_reduce": on_gloo.tolist(),
        "mesh_backend": dist.get_backend(mesh.get_group()),
        "mesh_size": mesh.size(),
        "mesh_all_reduce": on_mesh.tolist(),
        "default_all_reduce": on_default.tolist(),
    }
    RankReport(report_dir, rank).line(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
