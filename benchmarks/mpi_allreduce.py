"""Allreduce latency/bandwidth and DDP step time: the mpi4py backend vs gloo vs raw mpi4py, in one MPI job.

Run on one machine (loopback only; drop --allow-run-as-root when not root)::

    mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo --mca btl self,vader -n 2 \\
        env GLOO_SOCKET_IFNAME=lo python benchmarks/mpi_allreduce.py

Every measurement alternates between the implementations in short rounds (in a rotating order) and reports
median times and the median of per-round ratios, so load bursts on a shared machine hit both sides of a ratio
alike. Times are the slowest rank's. ``--quick`` runs tiny sizes and a few steps (a smoke test that the benchmark
still works, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lightning_dist_hooks import mpi

MPI = mpi.init_mpi()  # initialise MPI as the backend would (its Open MPI defaults apply), before anything else

FULL_SIZES = [4 << 10 << 2 * step for step in range(8)]  # 4 KiB, 16 KiB, ..., 64 MiB
QUICK_SIZES = [4 << 10, 64 << 10]
BYTES_PER_ROUND = 8 << 20  # each round moves about this much per implementation (2 to 100 calls): short rounds
OURS, GLOO, RAW, RAW_SAME_MEMORY = "mpi4py backend", "gloo", "raw mpi4py", "raw, torch memory"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few steps: checks the benchmark runs")
    parser.add_argument("--rounds", type=int, default=21, help="alternating rounds per measurement (median)")
    parser.add_argument("--ddp-steps", type=int, default=5, help="timed DDP steps per implementation and round")
    parser.add_argument("--ddp-hidden", type=int, default=640, help="MLP width (4 layers: ~5 MB of float32 params)")
    parser.add_argument("--ddp-batch", type=int, default=64, help="DDP batch size per rank")
    parser.add_argument("--json", type=Path, help="also write the results here (rank 0)")
    return parser.parse_args()


def init_groups(comm) -> dist.ProcessGroup:
    """gloo as the default group (over a loopback TCP store), the mpi4py backend as a group of all ranks."""
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(), world_size=comm.Get_size()
    )
    mpi.register()
    return dist.new_group(backend=mpi.BACKEND_NAME)


def slowest(comm, seconds: float) -> float:
    return comm.allreduce(seconds, op=MPI.MAX)


def timed_rounds(comm, runs: dict[str, Callable[[], None]], calls: int, rounds: int) -> dict[str, list[float]]:
    """Per round, the mean time per call of each implementation; every round runs each one ``calls`` times."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up: first-touch page faults, lazy allocations, connection set-up
        run()
    names = list(runs)
    for round_index in range(rounds):
        # Rotate the order every round: no implementation always runs first after the barrier or after gloo.
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            run = runs[name]
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                run()
            samples[name].append(slowest(comm, (time.perf_counter() - start) / calls))
    return samples


def summarize(samples: dict[str, list[float]]) -> dict:
    """Median time per implementation, and the median over rounds of each one's speed relative to ours.

    Ratios are taken within a round: on a shared machine, load bursts then hit both sides of a ratio alike.
    """
    ours = samples[OURS]
    return {
        "median_seconds": {name: statistics.median(values) for name, values in samples.items()},
        "ours_speed_relative_to": {
            name: statistics.median(other / mine for other, mine in zip(values, ours, strict=True))
            for name, values in samples.items()
            if name != OURS
        },
    }


def allreduce_runs(nbytes: int, ours: dist.ProcessGroup, comm) -> dict[str, Callable[[], None]]:
    elements = nbytes // 4
    ours_tensor = torch.ones(elements)
    gloo_tensor = torch.ones(elements)
    raw_array = np.ones(elements, dtype=np.float32)
    # numpy backs large arrays with transparent huge pages, torch's allocator does not by default; single-copy
    # transfers pin every page, so the memory alone can make a difference. Same memory as ours: the backend's cost.
    same_memory_array = torch.ones(elements).numpy()
    return {
        OURS: lambda: dist.all_reduce(ours_tensor, group=ours),
        GLOO: lambda: dist.all_reduce(gloo_tensor),
        RAW: lambda: comm.Allreduce(MPI.IN_PLACE, raw_array),
        RAW_SAME_MEMORY: lambda: comm.Allreduce(MPI.IN_PLACE, same_memory_array),
    }


def make_mlp(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(256, hidden), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 10))


def ddp_step_runs(hidden: int, batch: int, ours: dist.ProcessGroup) -> tuple[dict[str, Callable[[], None]], int]:
    inputs, targets = torch.randn(batch, 256), torch.randint(0, 10, (batch,))

    def step_of(model: DistributedDataParallel, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        def step() -> None:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()

        return step

    runs = {}
    for name, group in ((OURS, ours), (GLOO, None)):
        model = DistributedDataParallel(make_mlp(hidden), process_group=group)
        runs[name] = step_of(model, torch.optim.SGD(model.parameters(), lr=0.01))
    parameter_bytes = sum(p.numel() * p.element_size() for p in make_mlp(hidden).parameters())
    return runs, parameter_bytes


def format_size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def report_allreduce(results: list[dict]) -> None:
    print(
        f"\nallreduce (float32, in place, SUM). {OURS} and {GLOO}: dist.all_reduce(torch tensor); {RAW}: "
        f"comm.Allreduce(IN_PLACE, numpy array); {RAW_SAME_MEMORY}: the same on a torch tensor's memory."
    )
    print("Median time per call and bandwidth (size / time); ours/x: median per-round ratio of x's time to ours")
    names = (OURS, GLOO, RAW, RAW_SAME_MEMORY)
    header = " | ".join(f"{name:>22}" for name in names)
    print(f"{'size':>8} | {header} | ours/gloo | ours/raw | ours/raw same mem")
    for row in results:
        cells = []
        for name in names:
            seconds = row["median_seconds"][name]
            cells.append(f"{seconds * 1e6:9.1f} us {row['bytes'] / seconds / 1e9:6.2f} GB/s")
        relative = row["ours_speed_relative_to"]
        ratios = f"{relative[GLOO]:8.2f}x | {relative[RAW]:7.2f}x | {relative[RAW_SAME_MEMORY]:16.2f}x"
        print(f"{format_size(row['bytes']):>8} | {' | '.join(cells)} | {ratios}")


def report_ddp(result: dict, parameter_bytes: int, batch: int) -> None:
    print(
        f"\nDDP training step (MLP, {parameter_bytes / 2**20:.1f} MiB of float32 parameters, batch {batch} per "
        "rank, SGD): median time per step"
    )
    for name, seconds in result["median_seconds"].items():
        print(f"{name:>16}: {seconds * 1e3:8.2f} ms")
    print(f"{'ours/gloo':>16}: {result['ours_speed_relative_to'][GLOO]:8.2f}x speed (median per-round ratio)")


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    # Ranks share the machine's cores: one intra-op thread each keeps them from fighting over cores.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.Get_size()))
    ours = init_groups(comm)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    rounds = 2 if args.quick else args.rounds

    allreduce = []
    for nbytes in sizes:
        calls = 2 if args.quick else max(2, min(100, BYTES_PER_ROUND // nbytes))
        samples = timed_rounds(comm, allreduce_runs(nbytes, ours, comm), calls, rounds)
        allreduce.append({"bytes": nbytes, **summarize(samples)})

    hidden = 64 if args.quick else args.ddp_hidden
    ddp_runs, parameter_bytes = ddp_step_runs(hidden, args.ddp_batch, ours)
    ddp = summarize(timed_rounds(comm, ddp_runs, 2 if args.quick else args.ddp_steps, rounds))
    del ddp_runs  # gloo hangs at exit if DDP's reducer outlives its process group

    if comm.Get_rank() == 0:
        print(
            f"{comm.Get_size()} ranks, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s) per rank, "
            f"torch {torch.__version__}, {MPI.Get_library_version().splitlines()[0]}"
        )
        report_allreduce(allreduce)
        report_ddp(ddp, parameter_bytes, args.ddp_batch)
        if args.json:
            results = {"allreduce": allreduce, "ddp_step": ddp, "ddp_parameter_bytes": parameter_bytes}
            args.json.write_text(json.dumps(results, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
