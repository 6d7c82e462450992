"""Bootstrap latency: from process start to a completed first barrier, per init method and world size.

Ranks are forked from this process after it imported ``torch.distributed`` once. Fresh interpreters would
each spend seconds of CPU importing torch, 32 of them on 2 cores, which would bury the rendezvous under import
time; on a cluster every rank imports in parallel on its own core, so that cost does not grow with world size.
What is left, and measured here, is what does grow: rendezvous through the store, gloo connecting every pair
of ranks, and the barrier.

Besides the init methods, two stores are passed to ``init_process_group(store=...)`` directly: torch's raw
``FileStore`` (what ``file://`` creates inside torch) and ``dir://``'s ``DirectoryStore`` (issue 21; loaded alone,
without Lightning), whose ranks also report how many filesystem operations they made.

``mpi://`` is not measured here: its ranks must be started by ``mpirun``, which cannot adopt forked processes.
``benchmarks/mpi_store.py`` measures it against the others under ``mpirun``; ``--with-mpi`` runs the MPI transport's
own benchmark (``mpi_allreduce.py``).

``python -m benchmarks.bootstrap`` (see :func:`main`) measures the same up to hundreds of ranks: each store with
gloo connecting every pair at start-up and with ``TORCH_GLOO_LAZY_INIT=1``, the operations per rank, and memory.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import torch.distributed as dist

from benchmarks.common import REPO, free_ports, in_ms, machine, package_module_alone, rotated, summary

# "FileStore" and "dir://" are stores passed to init_process_group(store=...): torch's raw FileStore, and dir://'s.
INIT_METHODS = ["env://", "tcp://", "file://", "FileStore", "dir://"]
TRIAL_TIMEOUT_S = 120
SCALE_TRIAL_TIMEOUT_S = 600


def task_count(world_sizes: list[int], repetitions: int) -> int:
    return len(world_sizes) * repetitions * len(INIT_METHODS)


def run(world_sizes: list[int], repetitions: int, workdir: Path, advance) -> dict:
    """Latency per init method and world size: medians over ``repetitions`` (methods alternate each time)."""
    seconds: dict[str, dict[int, list[float]]] = {method: {size: [] for size in world_sizes} for method in INIT_METHODS}
    for repetition in range(repetitions):
        for world_size in world_sizes:
            for method in rotated(INIT_METHODS, repetition + world_size):
                scratch = workdir / f"rdzv-{repetition}-{world_size}-{INIT_METHODS.index(method)}"
                url, environment = _rendezvous(method, scratch)
                seconds[method][world_size].append(time_to_first_barrier(method, url, environment, world_size).seconds)
                advance(1)
    return {
        "latency_ms": {
            method: {str(size): in_ms(summary(samples)) for size, samples in by_size.items()}
            for method, by_size in seconds.items()
        }
    }


def _directory_store() -> ModuleType:
    """dir://'s store module, loaded alone (it imports only the standard library and torch)."""
    return package_module_alone("init_methods/_shared_filesystem/directory_store.py")


def _rendezvous(method: str, rendezvous_file: Path) -> tuple[str, dict[str, str]]:
    """The ``init_method`` URL (for a store: the path it uses) and the environment variables the ranks need."""
    if method == "dir://":
        rendezvous_file.mkdir(mode=0o700)
        return str(rendezvous_file), {}
    if method == "FileStore":
        return str(rendezvous_file), {}
    if method == "file://":
        return f"file://{rendezvous_file}", {}
    port = free_ports(1)[0]
    if method == "env://":
        return "env://", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return f"tcp://127.0.0.1:{port}", {}


@dataclass
class Trial:
    """One bootstrap of ``world_size`` ranks: how long, and what each rank used."""

    seconds: float
    operations: list[int] = field(default_factory=list)  # per rank, dir:// only: filesystem operations
    private_mib: list[float] = field(default_factory=list)  # per rank, after its barrier: memory of its own
    memory_used_mib: float = 0.0  # the most of the machine's memory the trial took (MemAvailable's largest drop)


def time_to_first_barrier(
    method: str, target: str, environment: dict[str, str], world_size: int, timeout_s: float = TRIAL_TIMEOUT_S
) -> Trial:
    """Seconds from forking the first rank until the last rank has passed its first barrier, and what they used."""
    context = multiprocessing.get_context("fork")
    # Each rank writes its own slots: no lock needed.
    finished = context.Array("d", world_size, lock=False)
    operations = context.Array("q", world_size, lock=False)
    private_kib = context.Array("q", world_size, lock=False)
    if method == "dir://":
        _directory_store()  # loaded once here, inherited by every fork
    available_before = _memory_available_kib()
    lowest = available_before
    # CLOCK_MONOTONIC (time.monotonic on Linux) is one clock for all processes of the machine.
    started = time.monotonic()
    ranks = [
        context.Process(
            target=_rank,
            args=(method, target, environment, rank, world_size, timeout_s, finished, operations, private_kib),
        )
        for rank in range(world_size)
    ]
    for process in ranks:
        process.start()
    deadline = started + timeout_s
    for process in ranks:
        while process.is_alive() and time.monotonic() < deadline:
            process.join(timeout=0.05)
            lowest = min(lowest, _memory_available_kib())
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join(timeout=10)
    if any(process.exitcode != 0 for process in ranks):
        raise RuntimeError(
            f"{method} with {world_size} ranks failed or exceeded {timeout_s:.0f} s "
            f"(exit codes {sorted({process.exitcode for process in ranks}, key=str)})"
        )
    return Trial(
        max(finished) - started,
        list(operations) if method == "dir://" else [],
        [kib / 1024 for kib in private_kib],
        (available_before - lowest) / 1024,
    )


def _memory_available_kib() -> int:
    with open("/proc/meminfo") as meminfo:
        return int(next(line for line in meminfo if line.startswith("MemAvailable")).split()[1])


def _private_kib() -> int:
    """This process's own memory: pages no other process shares (a forked rank shares the rest with its parent)."""
    with open("/proc/self/smaps_rollup") as rollup:
        return sum(int(line.split()[1]) for line in rollup if line.startswith(("Private_Clean", "Private_Dirty")))


def _rank(
    method: str,
    target: str,
    environment: dict[str, str],
    rank: int,
    world_size: int,
    timeout_s: float,
    finished,
    operations,
    private_kib,
) -> None:
    os.environ.update(environment, GLOO_SOCKET_IFNAME="lo")
    timeout = timedelta(seconds=timeout_s)
    store = None
    if method == "dir://":
        store = _directory_store().DirectoryStore(
            os.open(target, os.O_RDONLY | os.O_DIRECTORY), Path(target), timeout, world_size
        )
    elif method == "FileStore":
        store = dist.FileStore(target, world_size)
    if store is None:
        dist.init_process_group("gloo", init_method=target, rank=rank, world_size=world_size, timeout=timeout)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    dist.barrier()
    finished[rank] = time.monotonic()
    private_kib[rank] = _private_kib()
    if method == "dir://":
        assert store is not None
        operations[rank] = store.operations.total()
    # Every rank stays until all have passed the barrier: with gloo's lazy connection set-up a rank still connects
    # through the store after a faster one has left, and env://'s store lives in rank 0.
    deadline = time.monotonic() + timeout_s
    while not all(finished) and time.monotonic() < deadline:
        time.sleep(0.01)
    dist.destroy_process_group()


# --- python -m benchmarks.bootstrap: up to hundreds of ranks ---------------------------------------------------------

SCALE_METHODS = ["env://", "FileStore", "dir://"]
SCALE_RESULTS = REPO / "benchmarks" / "results" / "rendezvous_scale.json"
# A trial runs only if the memory the last one took, scaled to the new world size, leaves this much of what the
# machine has available: other work shares it, and the kernel's OOM killer would pick among all of it.
MEMORY_MARGIN = 0.5


def scale(world_sizes: list[int], repetitions: int, workdir: Path, lazy: bool) -> dict:
    """Every store at every world size, ``repetitions`` times (the stores alternate), eager and lazy gloo."""
    results: dict = {"methods": {}, "skipped": {}}
    modes = ["eager", "lazy"] if lazy else ["eager"]
    used_per_rank: dict[str, float] = {}
    for world_size in world_sizes:
        _warm_up(world_size, workdir, used_per_rank.get("FileStore", 0.0))
        for repetition in range(repetitions):
            for mode in modes:
                for method in rotated(SCALE_METHODS, repetition + world_size):
                    label = method if mode == "eager" else f"{method} lazy"
                    entry = results["methods"].setdefault(label, {})
                    projected = used_per_rank.get(label, 0.0) * world_size
                    if projected > MEMORY_MARGIN * _memory_available_kib() / 1024:
                        results["skipped"][f"{label} {world_size}"] = (
                            f"would take about {projected:.0f} MiB (the last size's use per rank, scaled), more than "
                            f"{MEMORY_MARGIN:.0%} of the {_memory_available_kib() / 1024:.0f} MiB available"
                        )
                        continue
                    environment = {"TORCH_GLOO_LAZY_INIT": "1"} if mode == "lazy" else {}
                    target, variables = _rendezvous(
                        method, workdir / f"scale-{world_size}-{repetition}-{mode}-{SCALE_METHODS.index(method)}"
                    )
                    try:
                        trial = time_to_first_barrier(
                            method, target, {**variables, **environment}, world_size, SCALE_TRIAL_TIMEOUT_S
                        )
                    except RuntimeError as error:
                        results["skipped"][f"{label} {world_size}"] = str(error)
                        print(f"{label:14} {world_size:4} ranks: {error}", flush=True)
                        continue
                    used_per_rank[label] = max(used_per_rank.get(label, 0.0), trial.memory_used_mib / world_size)
                    samples = entry.setdefault(
                        str(world_size), {"seconds": [], "operations": [], "private_mib": [], "memory_used_mib": []}
                    )
                    samples["seconds"].append(trial.seconds)
                    samples["memory_used_mib"].append(trial.memory_used_mib)
                    samples["private_mib"].append(statistics.median(trial.private_mib))
                    if trial.operations:
                        samples["operations"].append(
                            {"median": statistics.median(trial.operations), "max": max(trial.operations)}
                        )
                    print(
                        f"{label:14} {world_size:4} ranks: {trial.seconds:7.2f} s, machine memory "
                        f"{trial.memory_used_mib:7.0f} MiB, median private "
                        f"{statistics.median(trial.private_mib):5.1f} MiB/rank"
                        + (
                            f", ops/rank median {statistics.median(trial.operations):.0f} max {max(trial.operations)}"
                            if trial.operations
                            else ""
                        ),
                        flush=True,
                    )
    return results


def _warm_up(world_size: int, workdir: Path, used_per_rank_mib: float) -> None:
    """One unmeasured eager ``FileStore`` trial at ``world_size``, so that every measured trial follows one of its size.

    The first trial at a new size found the kernel without the socket state the previous, smaller size left: at 512
    ranks it took 30-32 s where the trials right after it took 24-26 s, whichever store each used (seen while
    measuring issue 21). Without this, the store that happened to come first at a size paid for it.
    """
    if used_per_rank_mib * world_size > MEMORY_MARGIN * _memory_available_kib() / 1024:
        return  # the measured trials of this size are skipped for the same reason
    target, variables = _rendezvous("FileStore", workdir / f"scale-{world_size}-warm-up")
    try:
        time_to_first_barrier("FileStore", target, variables, world_size, SCALE_TRIAL_TIMEOUT_S)
    except RuntimeError as error:
        print(f"warm-up        {world_size:4} ranks: {error}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.bootstrap [--world-sizes 2,...,512] [--repetitions 2] [--no-lazy] [--out FILE]``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bootstrap", description=main.__doc__)
    parser.add_argument("--world-sizes", default="2,8,32,128,256,512")
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--no-lazy", action="store_true", help="only gloo's default, eager connection set-up")
    parser.add_argument("--out", type=Path, default=SCALE_RESULTS)
    args = parser.parse_args(argv)
    described = machine()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ldh-bench-scale-") as scratch:
        results = scale(
            [int(size) for size in args.world_sizes.split(",")], args.repetitions, Path(scratch), lazy=not args.no_lazy
        )
    described["load_after"] = os.getloadavg()
    results.update(
        machine=described,
        seconds=time.monotonic() - started,
        date=time.strftime("%Y-%m-%d %H:%M %Z"),
        command=" ".join(["python -m benchmarks.bootstrap", *(argv if argv is not None else sys.argv[1:])]),
        lazy_init_available="TORCH_GLOO_LAZY_INIT" in _gloo_header(),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    from benchmarks import scale_report

    scale_report.plot(results, args.out.with_suffix(".png"))


def _gloo_header() -> str:
    """ProcessGroupGloo.hpp of this torch: whether it knows ``TORCH_GLOO_LAZY_INIT``, read rather than assumed."""
    header = Path(dist.__file__).parent.parent / "include" / "torch" / "csrc" / "distributed" / "c10d"
    path = header / "ProcessGroupGloo.hpp"
    return path.read_text() if path.exists() else ""


if __name__ == "__main__":
    main()
