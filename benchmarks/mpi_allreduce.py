"""Allreduce latency/bandwidth and DDP step time: the mpi4py backend vs gloo vs raw mpi4py, in one MPI job.

Also, on the backend alone, the three ways a caller can complete an all-reduce: blocking, ``async_op=True`` then
``wait()``, and ``async_op=True`` then the work's future (DDP's route: nobody calls ``wait()``, the backend
completes the future); and, for the DDP step, how long backward waits at its end for bucket all-reduces still
in flight (ours vs gloo): the part of communication that did not overlap with backward.

Run on one machine (loopback only; drop --allow-run-as-root when not root)::

    mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo --mca btl self,vader -n 2 \\
        env GLOO_SOCKET_IFNAME=lo python benchmarks/mpi_allreduce.py

Every measurement alternates between the implementations in short rounds (in a rotating order) and reports
median times and the median of per-round ratios, each with its interquartile range, and the load average, so load
bursts on a shared machine hit both sides of a ratio alike. Times are the slowest rank's. ``--quick`` runs tiny
sizes and a few steps (a smoke test that the benchmark still works, not a measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from lightning_dist_hooks import mpi

MPI = mpi.init_mpi()  # initialise MPI as the backend would (its Open MPI defaults apply), before anything else

FULL_SIZES = [4 << 10 << 2 * step for step in range(8)]  # 4 KiB, 16 KiB, ..., 64 MiB
QUICK_SIZES = [4 << 10, 64 << 10]
SYNC_DIST_METRICS = 8  # values logged with sync_dist=True per step (loss, accuracy, learning rate, ...)
BYTES_PER_ROUND = 8 << 20  # each round moves about this much per implementation (2 to 100 calls): short rounds
OURS, GLOO, RAW, RAW_SAME_MEMORY = "mpi4py backend", "gloo", "raw mpi4py", "raw, torch memory"
BLOCKING, WAIT, FUTURE = "blocking", "async_op, wait()", "async_op, future (DDP's route)"
ROUTE_SIZES = [4 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _mpi_library() -> str:
    """The MPI library's first version line (Open MPI ends its string with a NUL, which would make the text binary)."""
    return MPI.Get_library_version().replace("\0", "").splitlines()[0]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few steps: checks the benchmark runs")
    parser.add_argument("--rounds", type=int, default=21, help="alternating rounds per measurement (median)")
    parser.add_argument("--ddp-steps", type=int, default=5, help="timed DDP steps per implementation and round")
    parser.add_argument("--ddp-hidden", type=int, default=640, help="MLP width (4 layers: ~5 MB of float32 params)")
    parser.add_argument("--ddp-batch", type=int, default=64, help="DDP batch size per rank")
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(kib) << 10 for kib in text.split(",")],
        help="allreduce sizes in KiB, comma-separated (default: 4 KiB to 64 MiB)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here (rank 0)")
    parser.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="rank 0 runs N busy-looping Python processes for the whole measurement (a loaded machine, reproducibly)",
    )
    return parser.parse_args()


# Spins until its parent, rank 0, is gone: no spinner outlives a rank that was killed (MPI_Abort, SIGKILL) before
# it could stop them. Checks the parent every ~10 ms of spinning. The label names it in process lists.
SPINNER_LABEL = "mpi_allreduce.py --background-load spinner"
_SPINNER = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


@contextlib.contextmanager
def background_load(processes: int) -> Iterator[None]:
    """Run ``processes`` busy loops (pure Python, pinned nowhere) while the block runs; stop them on any exit."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPINNER, SPINNER_LABEL]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


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


def slowest_each(comm, seconds: list[float]) -> list[float]:
    """Element by element, the slowest rank's value (every rank passes as many)."""
    values = np.array(seconds)
    comm.Allreduce(MPI.IN_PLACE, values, op=MPI.MAX)
    return values.tolist()


def timed_rounds(comm, runs: Mapping[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, list[float]]:
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


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """First quartile, median, third quartile."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    first, median, third = statistics.quantiles(values, n=4, method="inclusive")
    return first, median, third


def summarize(
    samples: dict[str, list[float]], reference: str = OURS, ratio_key: str = "ours_speed_relative_to"
) -> dict:
    """Median time per implementation and its interquartile range, and the median over rounds of each other one's
    time relative to ``reference``'s (for the default, ours: our speed relative to it) with its interquartile range.

    Ratios are taken within a round: on a shared machine, load bursts then hit both sides of a ratio alike.
    """
    reference_times = samples[reference]
    ratios = {
        name: quartiles([time_ / reference_time for time_, reference_time in zip(values, reference_times, strict=True)])
        for name, values in samples.items()
        if name != reference
    }
    return {
        "median_seconds": {name: statistics.median(values) for name, values in samples.items()},
        "iqr_seconds": {name: [quartiles(values)[0], quartiles(values)[2]] for name, values in samples.items()},
        ratio_key: {name: middle for name, (_, middle, _) in ratios.items()},
        f"{ratio_key}_iqr": {name: [first, third] for name, (first, _, third) in ratios.items()},
    }


def allreduce_runs(nbytes: int, ours: dist.ProcessGroup, comm) -> dict[str, Callable[[], None]]:
    elements = nbytes // 4
    ours_tensor = torch.ones(elements)
    gloo_tensor = torch.ones(elements)
    raw_array = np.ones(elements, dtype=np.float32)
    # Raw MPI on the very memory ours reduces (the tensor's own buffer), so that the ratio to it is the backend's own
    # cost and nothing of where a second allocation lands. (The numpy column is raw MPI on numpy's own allocation.)
    same_memory_array = ours_tensor.numpy()
    return {
        OURS: lambda: dist.all_reduce(ours_tensor, group=ours),
        GLOO: lambda: dist.all_reduce(gloo_tensor),
        RAW: lambda: comm.Allreduce(MPI.IN_PLACE, raw_array),
        RAW_SAME_MEMORY: lambda: comm.Allreduce(MPI.IN_PLACE, same_memory_array),
    }


def route_runs(nbytes: int, ours: dist.ProcessGroup) -> dict[str, Callable[[], None]]:
    """One all-reduce on the backend, completed by each route; each route has its own tensor."""
    tensors = {route: torch.ones(nbytes // 4) for route in (BLOCKING, WAIT, FUTURE)}
    return {
        BLOCKING: lambda: dist.all_reduce(tensors[BLOCKING], group=ours),
        WAIT: lambda: dist.all_reduce(tensors[WAIT], group=ours, async_op=True).wait(),
        FUTURE: lambda: dist.all_reduce(tensors[FUTURE], group=ours, async_op=True).get_future().wait(),
    }


def sync_dist_runs(ours: dist.ProcessGroup, world_size: int) -> dict[str, Callable[[], None]]:
    """One training step's worth of ``self.log(name, value, sync_dist=True)``: ``SYNC_DIST_METRICS`` scalars.

    Each is what Lightning's ``_sync_ddp`` does per logged value: a barrier, then an all-reduce of the scalar;
    "mean" is ReduceOp.AVG where the backend has it, and SUM followed by a division on gloo.
    """
    values = [float(index) for index in range(SYNC_DIST_METRICS)]

    def ours_step() -> None:
        for value in values:
            metric = torch.tensor(value)
            dist.barrier(group=ours)
            dist.all_reduce(metric, op=dist.ReduceOp.AVG, group=ours)

    def gloo_step() -> None:
        for value in values:
            metric = torch.tensor(value)
            dist.barrier()
            dist.all_reduce(metric, op=dist.ReduceOp.SUM)
            metric.div_(world_size)

    return {OURS: ours_step, GLOO: gloo_step}


def make_mlp(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(256, hidden), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 10))


class BackwardTailProbe:
    """Records how long each backward waits, after its last gradient bucket was ready, for the bucket all-reduces.

    DDP's built-in all-reduce hook replaced by the same in Python (``default_hooks.allreduce_hook``), wrapped to
    note when each bucket was handed to the process group; the wait is the end of ``backward()`` minus the time
    the last bucket was handed over. With full overlap only the last bucket's all-reduce is left to wait for.
    """

    def __init__(self) -> None:
        self.last_bucket_at = 0.0
        self.waits: list[float] = []

    # No annotations: DDP checks them against the classes, and this module's are strings (``annotations``).
    def hook(self, group, bucket):
        self.last_bucket_at = time.perf_counter()
        return default_hooks.allreduce_hook(group, bucket)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        self.waits.append(time.perf_counter() - self.last_bucket_at)


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


def backward_tail_runs(
    hidden: int, batch: int, ours: dist.ProcessGroup
) -> tuple[dict[str, Callable[[], None]], dict[str, BackwardTailProbe]]:
    """DDP steps whose backward records its wait for outstanding buckets (``BackwardTailProbe``)."""
    inputs, targets = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
    runs: dict[str, Callable[[], None]] = {}
    probes: dict[str, BackwardTailProbe] = {}
    for name, group in ((OURS, ours), (GLOO, None)):
        model = DistributedDataParallel(make_mlp(hidden), process_group=group)
        probe = probes[name] = BackwardTailProbe()
        model.register_comm_hook(group, probe.hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(model=model, optimizer=optimizer, probe=probe) -> None:
            optimizer.zero_grad()
            probe.backward(torch.nn.functional.cross_entropy(model(inputs), targets))
            optimizer.step()

        runs[name] = step
    return runs, probes


def _loads(load: tuple[float, float, float]) -> str:
    return "/".join(f"{value:.1f}" for value in load)


def format_size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _time_with_iqr(seconds: float, iqr: list[float]) -> str:
    scale, unit = (1e6, "us") if seconds < 1e-2 else (1e3, "ms")
    return f"{seconds * scale:.1f} {unit} [{iqr[0] * scale:.1f}-{iqr[1] * scale:.1f}]"


def _ratio_with_iqr(row: dict, name: str) -> str:
    low, high = row["ours_speed_relative_to_iqr"][name]
    return f"{row['ours_speed_relative_to'][name]:.2f}x [{low:.2f}-{high:.2f}]"


def report_allreduce(results: list[dict]) -> None:
    print(
        f"\nallreduce (float32, in place, SUM). {OURS} and {GLOO}: dist.all_reduce(torch tensor); {RAW}: "
        f"comm.Allreduce(IN_PLACE, numpy array); {RAW_SAME_MEMORY}: the same on the memory of the tensor ours reduces."
    )
    print("Median time per call [interquartile range]; ours/x: median [IQR] of per-round ratios of x's time to ours")
    names = (OURS, GLOO, RAW, RAW_SAME_MEMORY)
    print(f"| size | {' | '.join(names)} | ours/gloo | ours/raw | ours/raw same memory |")
    print(f"|---:|{'---:|' * (len(names) + 3)}")
    for row in results:
        cells = [_time_with_iqr(row["median_seconds"][name], row["iqr_seconds"][name]) for name in names]
        ratios = [_ratio_with_iqr(row, name) for name in (GLOO, RAW, RAW_SAME_MEMORY)]
        print(f"| {format_size(row['bytes'])} | {' | '.join(cells)} | {' | '.join(ratios)} |")


def report_routes(results: list[dict]) -> None:
    print(
        f"\nCompletion routes of an all-reduce on the {OURS} (float32, in place, SUM): {BLOCKING} is "
        f"dist.all_reduce(t); {WAIT} is dist.all_reduce(t, async_op=True).wait(); {FUTURE} is "
        "dist.all_reduce(t, async_op=True).get_future().wait()."
    )
    print("Median time per call [IQR]; x/blocking: median [IQR] of per-round ratios of the route's time to blocking's")
    routes = (BLOCKING, WAIT, FUTURE)
    print(f"| size | {' | '.join(routes)} | wait()/blocking | future/blocking |")
    print(f"|---:|{'---:|' * (len(routes) + 2)}")
    for row in results:
        cells = [_time_with_iqr(row["median_seconds"][route], row["iqr_seconds"][route]) for route in routes]
        ratios = []
        for route in (WAIT, FUTURE):
            low, high = row["time_relative_to_blocking_iqr"][route]
            ratios.append(f"{row['time_relative_to_blocking'][route]:.2f}x [{low:.2f}-{high:.2f}]")
        print(f"| {format_size(row['bytes'])} | {' | '.join(cells)} | {' | '.join(ratios)} |")


def report_backward_tail(tail: dict) -> None:
    print(
        "\nDDP backward's wait after its last bucket was ready (communication not overlapped with backward; "
        f"default all-reduce hook in Python, {tail['steps']} steps each): median [IQR]"
    )
    for name, seconds in tail["median_seconds"].items():
        print(f"{name:>16}: {_time_with_iqr(seconds, tail['iqr_seconds'][name])}")


def report_steps(title: str, result: dict) -> None:
    print(f"\n{title}: median time per step [interquartile range]")
    for name, seconds in result["median_seconds"].items():
        print(f"{name:>16}: {_time_with_iqr(seconds, result['iqr_seconds'][name])}")
    print(f"{'ours/gloo':>16}: {_ratio_with_iqr(result, GLOO)} speed (median [IQR] of per-round ratios)")


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    # Ranks share the machine's cores: one intra-op thread each keeps them from fighting over cores.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.Get_size()))
    ours = init_groups(comm)
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    rounds = 2 if args.quick else args.rounds

    with background_load(args.background_load if comm.Get_rank() == 0 else 0):
        comm.Barrier()  # every rank measures under the load
        load_before = os.getloadavg()
        allreduce = []
        for nbytes in sizes:
            calls = 2 if args.quick else max(2, min(100, BYTES_PER_ROUND // nbytes))
            samples = timed_rounds(comm, allreduce_runs(nbytes, ours, comm), calls, rounds)
            allreduce.append({"bytes": nbytes, **summarize(samples)})

        routes = []
        for nbytes in QUICK_SIZES if args.quick else args.sizes or ROUTE_SIZES:
            calls = 2 if args.quick else max(2, min(100, BYTES_PER_ROUND // nbytes))
            samples = timed_rounds(comm, route_runs(nbytes, ours), calls, rounds)
            routes.append({"bytes": nbytes, **summarize(samples, BLOCKING, "time_relative_to_blocking")})

        sync_dist_samples = timed_rounds(comm, sync_dist_runs(ours, comm.Get_size()), 2 if args.quick else 20, rounds)
        sync_dist = summarize(sync_dist_samples)

        hidden = 64 if args.quick else args.ddp_hidden
        ddp_runs, parameter_bytes = ddp_step_runs(hidden, args.ddp_batch, ours)
        ddp = summarize(timed_rounds(comm, ddp_runs, 2 if args.quick else args.ddp_steps, rounds))
        tail_runs, tail_probes = backward_tail_runs(hidden, args.ddp_batch, ours)
        timed_rounds(comm, tail_runs, 2 if args.quick else args.ddp_steps, rounds)
        tail_waits = {name: slowest_each(comm, probe.waits[1:]) for name, probe in tail_probes.items()}  # [0]: warm-up
        tail = {
            "steps": len(tail_waits[OURS]),
            "median_seconds": {name: statistics.median(waits) for name, waits in tail_waits.items()},
            "iqr_seconds": {name: [quartiles(waits)[0], quartiles(waits)[2]] for name, waits in tail_waits.items()},
        }
        del ddp_runs, tail_runs  # gloo hangs at exit if DDP's reducer outlives its process group
        load_after = os.getloadavg()

    if comm.Get_rank() == 0:
        print(
            f"{comm.Get_size()} ranks, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s) per rank, "
            f"torch {torch.__version__}, {_mpi_library()}; load average (1, 5, 15 min) "
            f"{_loads(load_before)} before, {_loads(load_after)} after; {args.background_load} busy-looping background "
            "process(es)"
        )
        report_allreduce(allreduce)
        report_routes(routes)
        report_steps(
            f"Lightning's sync_dist pattern ({SYNC_DIST_METRICS} scalars per step, each a barrier and an all-reduce)",
            sync_dist,
        )
        report_steps(
            f"DDP training step (MLP, {parameter_bytes / 2**20:.1f} MiB of float32 parameters, batch "
            f"{args.ddp_batch} per rank, SGD)",
            ddp,
        )
        report_backward_tail(tail)
        if args.json:
            results = {
                "load_average_before": load_before,
                "load_average_after": load_after,
                "background_load_processes": args.background_load,
                "allreduce": allreduce,
                "completion_routes": routes,
                "sync_dist_step": sync_dist,
                "sync_dist_metrics": SYNC_DIST_METRICS,
                "ddp_step": ddp,
                "ddp_parameter_bytes": parameter_bytes,
                "ddp_backward_tail": tail,
            }
            args.json.write_text(json.dumps(results, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
