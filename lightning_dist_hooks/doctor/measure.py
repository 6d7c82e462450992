"""A correct sum and a rough speed of the default process group: tiny, a second or two at most."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_LATENCY_ROUNDS = 20
_BANDWIDTH_ROUNDS = 5
_BANDWIDTH_ELEMENTS = 1 << 20  # 4 MiB of float32


def measure_allreduce(device: torch.device) -> dict[str, Any]:
    """Sum a known tensor over all ranks, then time small (latency) and 4 MiB (bandwidth) all-reduces."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    values = torch.arange(1024, dtype=torch.float32, device=device) + rank
    dist.all_reduce(values)
    expected = torch.arange(1024, dtype=torch.float32, device=device) * world_size + sum(range(world_size))
    correct = bool(torch.equal(values, expected))

    small = torch.zeros(1, device=device)
    latency_s = _median_time(lambda: dist.all_reduce(small), _LATENCY_ROUNDS)
    large = torch.ones(_BANDWIDTH_ELEMENTS, device=device)
    large_s = _median_time(lambda: dist.all_reduce(large), _BANDWIDTH_ROUNDS)
    size = large.numel() * large.element_size()
    return {
        "correct": correct,
        "latency_ms": latency_s * 1e3,
        "bandwidth_gb_s": size / large_s / 1e9,
        "bandwidth_bytes": size,
    }


def _median_time(operation: Callable[[], object], rounds: int) -> float:
    operation()  # warm-up: the first call sets up connections and buffers
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        operation()
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # CUDA collectives return before they finish
        times.append(time.perf_counter() - started)
    return statistics.median(times)
