"""Bootstrap latency: from process start to a completed first barrier, per init method and world size.

Ranks are forked from this process after it imported ``torch.distributed`` once. Fresh interpreters would
each spend seconds of CPU importing torch, 32 of them on 2 cores, which would bury the rendezvous under import
time; on a cluster every rank imports in parallel on its own core, so that cost does not grow with world size.
What is left, and measured here, is what does grow: rendezvous through the store, gloo connecting every pair
of ranks, and the barrier.

The MPI backend (``lightning_dist_hooks.mpi``, ``mpi://``) is not measured here: its ranks must be started by
``mpirun``, which cannot adopt forked processes. ``--with-mpi`` runs its own benchmark (``mpi_allreduce.py``).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from benchmarks.common import free_ports, in_ms, rotated, summary

INIT_METHODS = ["env://", "tcp://", "file://"]
TRIAL_TIMEOUT_S = 120


def task_count(world_sizes: list[int], repetitions: int) -> int:
    return len(world_sizes) * repetitions * len(INIT_METHODS)


def run(world_sizes: list[int], repetitions: int, workdir: Path, advance) -> dict:
    """Latency per init method and world size: medians over ``repetitions`` (methods alternate each time)."""
    seconds: dict[str, dict[int, list[float]]] = {method: {size: [] for size in world_sizes} for method in INIT_METHODS}
    for repetition in range(repetitions):
        for world_size in world_sizes:
            for method in rotated(INIT_METHODS, repetition + world_size):
                url, environment = _rendezvous(method, workdir / f"rdzv-{repetition}-{world_size}")
                seconds[method][world_size].append(time_to_first_barrier(url, environment, world_size))
                advance(1)
    return {"latency_ms": {method: {str(size): in_ms(summary(samples)) for size, samples in by_size.items()}
                           for method, by_size in seconds.items()}}


def _rendezvous(method: str, rendezvous_file: Path) -> tuple[str, dict[str, str]]:
    """The ``init_method`` URL and the environment variables the ranks need for it."""
    if method == "file://":
        return f"file://{rendezvous_file}", {}
    port = free_ports(1)[0]
    if method == "env://":
        return "env://", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return f"tcp://127.0.0.1:{port}", {}


def time_to_first_barrier(init_method: str, environment: dict[str, str], world_size: int) -> float:
    """Seconds from forking the first rank until the last rank has passed its first barrier."""
    context = multiprocessing.get_context("fork")
    finished = context.Array("d", world_size, lock=False)  # each rank writes its own slot: no lock needed
    # CLOCK_MONOTONIC (time.monotonic on Linux) is one clock for all processes of the machine.
    started = time.monotonic()
    ranks = [context.Process(target=_rank, args=(init_method, environment, rank, world_size, finished))
             for rank in range(world_size)]
    for process in ranks:
        process.start()
    deadline = started + TRIAL_TIMEOUT_S
    for process in ranks:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join(timeout=10)
    if any(process.exitcode != 0 for process in ranks):
        raise RuntimeError(f"{init_method} with {world_size} ranks failed or exceeded {TRIAL_TIMEOUT_S} s "
                           f"(exit codes {[process.exitcode for process in ranks]})")
    return max(finished) - started


def _rank(init_method: str, environment: dict[str, str], rank: int, world_size: int, finished) -> None:
    os.environ.update(environment, GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=TRIAL_TIMEOUT_S))
    dist.barrier()
    finished[rank] = time.monotonic()
    dist.destroy_process_group()
