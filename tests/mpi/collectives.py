"""Every collective and point-to-point operation of the mpi4py backend against values computed locally, then
its reductions against gloo's (gloo_parity.py), in one job.

Usage (under mpirun, any number of ranks >= 2, MPI_TEST_PORT set for gloo's store): python collectives.py REPORT_DIR

Each rank reports (``_setup.RankReport``: REPORT_DIR/rank-R.txt) ``rank R: FAILED <check>: <why>`` for a wrong
result, ``rank R passed: <name>`` for each passed check and ``rank R: N checks passed``, then the gloo comparison's
lines; the exit code is 1 if any check failed or any result differs from gloo's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from _setup import RankReport, init_from_mpi_launch, mpi
from gloo_parity import compare_with_gloo
from torch.distributed import ReduceOp

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
NUMERIC_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG)
BITWISE_OPS = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


class Checks:
    def __init__(self, report: RankReport) -> None:
        self.report = report
        self.passed: list[str] = []
        self.failed: list[str] = []

    def equal(self, name: str, actual: object, expected: object) -> None:
        """Exact equality; tensors (also inside lists) must match in dtype, shape and every value."""
        self._record(name, _same(actual, expected), f"got {actual!r}, expected {expected!r}")

    def raises(self, name: str, error: type[Exception], text: str, action: Callable[[], object]) -> None:
        try:
            action()
        except error as raised:
            self._record(name, text in str(raised), f"message {str(raised)!r} lacks {text!r}")
            return
        self._record(name, False, f"no {error.__name__} raised")

    def _record(self, name: str, ok: bool, why: str) -> None:
        if ok:
            self.passed.append(name)
        else:
            self.failed.append(name)
            self.report.line(f"rank {self.report.rank}: FAILED {name}: {why}")


def _same(actual: object, expected: object) -> bool:
    if isinstance(expected, torch.Tensor):
        return isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype and torch.equal(actual, expected)
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(map(_same, actual, expected))
    return actual == expected


def rank_values(rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers (exact in every dtype, sums and products too) that differ between ranks."""
    if dtype == torch.bool:
        return torch.tensor([rank == 0, True, False, rank % 2 == 1])
    signed = [rank + 1, 2, rank % 2 + 1, 3 - rank % 3, int(rank > 0), -(rank % 2) - 1]
    values = signed if dtype.is_signed else [abs(value) for value in signed]
    return torch.tensor(values, dtype=torch.float64).to(dtype)


def expected_reduction(op: ReduceOp.RedOpType, dtype: torch.dtype, world: int) -> torch.Tensor:
    stacked = torch.stack([rank_values(rank, dtype).to(torch.int64) for rank in range(world)])
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        reduced = stacked.sum(0)
    elif op == ReduceOp.PRODUCT:
        reduced = stacked.prod(0)
    elif op == ReduceOp.MIN:
        reduced = stacked.min(0).values
    elif op == ReduceOp.MAX:
        reduced = stacked.max(0).values
    else:
        reduced = stacked[0]
        for row in stacked[1:]:
            reduced = {ReduceOp.BAND: reduced & row, ReduceOp.BOR: reduced | row, ReduceOp.BXOR: reduced ^ row}[op]
    if dtype == torch.bool:
        reduced = reduced % 2 if op == ReduceOp.BXOR else reduced
        result = reduced.bool()
    else:
        result = reduced.to(dtype)
    if op == ReduceOp.AVG:  # floats divide in their dtype; integers truncate like Lightning's gloo fallback
        return result.div_(world) if dtype.is_floating_point else result.copy_(result / world)
    return result


def check_allreduce(checks: Checks, world: int) -> None:
    for dtype in (*FLOAT_DTYPES, *INT_DTYPES, torch.bool):
        ops = NUMERIC_OPS if dtype.is_floating_point else NUMERIC_OPS + BITWISE_OPS
        for op in ops:
            tensor = rank_values(dist.get_rank(), dtype)
            dist.all_reduce(tensor, op=op)
            checks.equal(f"allreduce {op.name} {dtype}", tensor, expected_reduction(op, dtype, world))
    band_on_floats = lambda: dist.all_reduce(torch.ones(2), op=ReduceOp.BAND)  # noqa: E731
    checks.raises("allreduce BAND float32 rejected", ValueError, "non-integral", band_on_floats)

    for dtype in (torch.int8, torch.uint8, torch.int16):  # overflow wraps around as in torch (MPI may saturate)
        big = torch.iinfo(dtype).max // 2 + 1
        tensor = torch.tensor([big, big], dtype=torch.int64).to(dtype)
        dist.all_reduce(tensor)
        checks.equal(f"allreduce SUM {dtype} wraps around", tensor, torch.tensor([big * world] * 2).to(dtype))

    matrix = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (dist.get_rank() + 1)
    transposed = matrix.t()  # not contiguous: staged through a copy
    dist.all_reduce(transposed)
    checks.equal("allreduce non-contiguous", matrix, torch.arange(12.0).reshape(3, 4) * sum(range(1, world + 1)))

    empty = torch.empty(0)
    dist.all_reduce(empty)
    checks.equal("allreduce empty tensor", empty.numel(), 0)

    tensor = rank_values(dist.get_rank(), torch.float32)
    work = dist.all_reduce(tensor, async_op=True)
    checks.equal("async allreduce wait() returns True", work.wait(), True)
    checks.equal("async allreduce", tensor, expected_reduction(ReduceOp.SUM, torch.float32, world))

    tensor = rank_values(dist.get_rank(), torch.bfloat16)
    future = dist.all_reduce(tensor, op=ReduceOp.MAX, async_op=True).get_future()
    result = future.wait()  # completed by the progress thread: no Work.wait() on this path
    checks.equal("async allreduce future", result[0], expected_reduction(ReduceOp.MAX, torch.bfloat16, world))

    tensors = [rank_values(dist.get_rank(), torch.float64), rank_values(dist.get_rank(), torch.float64)[:2]]
    dist.all_reduce_coalesced(tensors, op=ReduceOp.MIN)
    expected = expected_reduction(ReduceOp.MIN, torch.float64, world)
    checks.equal("allreduce_coalesced", tensors, [expected, expected[:2]])


def check_broadcast(checks: Checks, world: int) -> None:
    root = world - 1
    for dtype in (torch.float32, torch.bfloat16, torch.bool, torch.int64):
        tensor = rank_values(dist.get_rank(), dtype)
        dist.broadcast(tensor, src=root)
        checks.equal(f"broadcast {dtype}", tensor, rank_values(root, dtype))
    matrix = torch.full((4, 3), float(dist.get_rank()))
    dist.broadcast(matrix.t(), src=root)
    checks.equal("broadcast non-contiguous", matrix, torch.full((4, 3), float(root)))
    objects = [{"from": dist.get_rank()}, "x"] if dist.get_rank() == root else [None, None]
    dist.broadcast_object_list(objects, src=root)
    checks.equal("broadcast_object_list", objects, [{"from": root}, "x"])


def check_gathers(checks: Checks, world: int) -> None:
    rank = dist.get_rank()
    everyone = [rank_values(r, torch.float16) for r in range(world)]
    outputs = [torch.empty(6, dtype=torch.float16) for _ in range(world)]
    dist.all_gather(outputs, rank_values(rank, torch.float16))
    checks.equal("all_gather list", outputs, everyone)

    output = torch.empty(world * 6, dtype=torch.int64)
    dist.all_gather_into_tensor(output, rank_values(rank, torch.int64))
    checks.equal("all_gather_into_tensor", output, torch.cat([rank_values(r, torch.int64) for r in range(world)]))

    stacked = torch.empty(world, 6, dtype=torch.int64).t()  # non-contiguous output
    dist.all_gather_into_tensor(stacked.t(), rank_values(rank, torch.int64))
    expected = torch.stack([rank_values(r, torch.int64) for r in range(world)])
    checks.equal("all_gather_into_tensor non-contiguous", stacked.t(), expected)

    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, ("rank", rank))
    checks.equal("all_gather_object", gathered, [("rank", r) for r in range(world)])

    root = 1
    gather_list = [torch.empty(6) for _ in range(world)] if rank == root else None
    dist.gather(rank_values(rank, torch.float32), gather_list, dst=root)
    if rank == root:
        checks.equal("gather", gather_list, [rank_values(r, torch.float32) for r in range(world)])

    received = torch.empty(4, dtype=torch.bool)
    scatter_list = [rank_values(r, torch.bool) for r in range(world)] if rank == root else None
    dist.scatter(received, scatter_list, src=root)
    checks.equal("scatter", received, rank_values(rank, torch.bool))

    objects: list[object] = [None]
    dist.scatter_object_list(objects, [f"for {r}" for r in range(world)] if rank == 0 else None, src=0)
    checks.equal("scatter_object_list", objects, [f"for {rank}"])


def check_reductions_to_parts(checks: Checks, world: int) -> None:
    rank = dist.get_rank()
    root = world - 1
    for op, dtype in ((ReduceOp.SUM, torch.float32), (ReduceOp.MAX, torch.bfloat16), (ReduceOp.AVG, torch.int64)):
        tensor = rank_values(rank, dtype)
        dist.reduce(tensor, dst=root, op=op)
        expected = expected_reduction(op, dtype, world) if rank == root else rank_values(rank, dtype)
        checks.equal(f"reduce {op.name} {dtype}", tensor, expected)

    # Rank r contributes (r + 1) * (i + 1) to part i: part i sums to (i + 1) * world * (world + 1) / 2.
    triangle = world * (world + 1) // 2
    for dtype in (torch.float32, torch.float16, torch.int32):
        parts = [torch.full((3,), (rank + 1) * (part + 1), dtype=dtype) for part in range(world)]
        output = torch.empty(3, dtype=dtype)
        dist.reduce_scatter(output, parts)
        checks.equal(f"reduce_scatter {dtype}", output, torch.full((3,), (rank + 1) * triangle, dtype=dtype))

    whole = torch.cat([torch.full((2,), float((rank + 1) * (part + 1))) for part in range(world)]).to(torch.bfloat16)
    output = torch.empty(2, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(output, whole, op=ReduceOp.AVG)
    expected = torch.full((2,), float((rank + 1) * triangle), dtype=torch.bfloat16).div_(world)
    checks.equal("reduce_scatter_tensor AVG bfloat16", output, expected)


def check_all_to_all(checks: Checks, world: int) -> None:
    rank = dist.get_rank()
    # Element i of rank r's input goes to rank i and equals 10 * r + i.
    output = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(output, torch.tensor([10 * rank + i for i in range(world)]))
    checks.equal("all_to_all_single even", output, torch.tensor([10 * r + rank for r in range(world)]))

    # Rank r sends (d + 1) rows to rank d, each row filled with 100 * r + d.
    input_splits = [d + 1 for d in range(world)]
    send = torch.cat([torch.full((d + 1, 2), 100.0 * rank + d) for d in range(world)])
    output_splits = [rank + 1] * world
    received = torch.empty(sum(output_splits), 2)
    dist.all_to_all_single(received, send, output_splits, input_splits)
    expected = torch.cat([torch.full((rank + 1, 2), 100.0 * r + rank) for r in range(world)])
    checks.equal("all_to_all_single uneven", received, expected)

    outputs = [torch.empty(r + 1) for r in range(world)]
    dist.all_to_all(outputs, [torch.full((rank + 1,), float(10 * rank + d)) for d in range(world)])
    checks.equal("all_to_all list", outputs, [torch.full((r + 1,), float(10 * r + rank)) for r in range(world)])


def check_point_to_point(checks: Checks, world: int) -> None:
    rank = dist.get_rank()
    right, left = (rank + 1) % world, (rank - 1) % world
    send = torch.full((5,), float(rank))
    received = torch.empty(5)
    requests = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, send, right, tag=3), dist.P2POp(dist.irecv, received, left, tag=3)]
    )
    for request in requests:
        request.wait()
    checks.equal("batch_isend_irecv ring", received, torch.full((5,), float(left)))

    if rank == 0:
        for source in range(1, world):
            tensor = torch.empty(3, dtype=torch.bfloat16)
            sender = dist.recv(tensor, tag=7)  # any source
            expected = torch.full((3,), float(sender), dtype=torch.bfloat16)
            checks.equal(f"recv any source #{source} payload", tensor, expected)
    else:
        dist.send(torch.full((3,), float(rank), dtype=torch.bfloat16), dst=0, tag=7)

    if rank == 1:
        matrix = torch.arange(6.0).reshape(2, 3)
        dist.send(matrix.t(), dst=0)  # non-contiguous send
    elif rank == 0:
        received = torch.empty(3, 2)
        dist.recv(received, src=1)
        checks.equal("send/recv non-contiguous", received, torch.arange(6.0).reshape(2, 3).t())
    checks.raises("negative tag rejected", ValueError, "tags must lie in", lambda: dist.isend(send, right, tag=-1))


def check_groups_and_errors(checks: Checks, world: int) -> None:
    rank = dist.get_rank()
    evens = list(range(0, world, 2))
    group = dist.new_group(evens)  # every rank calls new_group; only members build a communicator
    if rank in evens:
        tensor = torch.tensor([float(rank)])
        dist.all_reduce(tensor, group=group)
        checks.equal("subgroup allreduce", tensor, torch.tensor([float(sum(evens))]))
        checks.equal("subgroup rank", dist.get_rank(group), evens.index(rank))
    last = dist.new_group([world - 1])
    if rank == world - 1:
        tensor = torch.tensor([5.0])
        dist.all_reduce(tensor, group=last)
        checks.equal("single-rank subgroup allreduce", tensor, torch.tensor([5.0]))

    assert dist.group.WORLD is not None
    reduced = funcol.all_reduce(rank_values(rank, torch.float32), "sum", dist.group.WORLD)
    checks.equal("functional all_reduce", reduced.wait(), expected_reduction(ReduceOp.SUM, torch.float32, world))

    work = dist.barrier(async_op=True)
    checks.equal("async barrier", work.wait(), True)
    dist.barrier()

    on_meta = torch.empty(4, device="meta")  # CPU-only torch has no CUDA tensor; any non-CPU device is refused
    checks.raises("non-CPU tensor rejected", RuntimeError, "CPU tensors only", lambda: dist.all_reduce(on_meta))
    checks.equal("backend name", dist.get_backend(), "mpi4py")


# Below the backend's eager limit a non-blocking collective runs on the caller's thread; above it, on the group's
# queue thread. Every operation is checked at both sizes (elements per rank's piece, float32).
ROUTE_SIZES = {"small": 8, "queued": (1 << 20) // 4}  # 32 bytes; 1 MiB
ROUTES = ("wait", "future")


def _complete(work: dist.Work, route: str) -> None:
    """Complete ``work`` by ``route``: its ``wait()``, or only its future (as DDP does; nobody calls ``wait()``)."""
    if route == "wait":
        assert work.wait() is True
    else:
        work.get_future().wait()


def _ramp(rank: int, count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values that differ between ranks and along the tensor, exact in float32 at every size used here."""
    return (torch.arange(count, dtype=torch.float64) % 97 + 100 * (rank + 1)).to(dtype)


def route_operations(
    rank: int, world: int, count: int
) -> dict[str, Callable[[Callable[[dist.Work], None]], list[tuple[Any, Any]]]]:
    """Every collective and point-to-point operation issued with ``async_op=True``, as a function that issues it,
    completes it with ``complete`` and returns (actual, expected) pairs."""
    right, left = (rank + 1) % world, (rank - 1) % world
    everyone = [_ramp(r, count) for r in range(world)]
    total = torch.stack(everyone).sum(0)

    def allreduce(complete):
        tensor = _ramp(rank, count)
        complete(dist.all_reduce(tensor, async_op=True))
        return [(tensor, total)]

    def broadcast(complete):
        tensor = _ramp(rank, count)
        complete(dist.broadcast(tensor, src=world - 1, async_op=True))
        return [(tensor, everyone[-1])]

    def all_gather(complete):
        outputs = [torch.empty(count) for _ in range(world)]
        complete(dist.all_gather(outputs, _ramp(rank, count), async_op=True))
        return [(outputs, everyone)]

    def all_gather_into_tensor(complete):
        output = torch.empty(world * count)
        complete(dist.all_gather_into_tensor(output, _ramp(rank, count), async_op=True))
        return [(output, torch.cat(everyone))]

    def gather(complete):
        outputs = [torch.empty(count) for _ in range(world)] if rank == 0 else None
        complete(dist.gather(_ramp(rank, count), outputs, dst=0, async_op=True))
        return [(outputs, everyone)] if rank == 0 else []

    def scatter(complete):
        output = torch.empty(count)
        complete(dist.scatter(output, everyone if rank == 0 else None, src=0, async_op=True))
        return [(output, everyone[rank])]

    def reduce(complete):
        tensor = _ramp(rank, count)
        complete(dist.reduce(tensor, dst=0, async_op=True))
        return [(tensor, total if rank == 0 else _ramp(rank, count))]

    def reduce_scatter(complete):
        output = torch.empty(count)
        complete(dist.reduce_scatter(output, [_ramp(rank, count) * (d + 1) for d in range(world)], async_op=True))
        return [(output, total * (rank + 1))]

    def reduce_scatter_tensor(complete):
        output = torch.empty(count)
        whole = torch.cat([_ramp(rank, count) * (d + 1) for d in range(world)])
        complete(dist.reduce_scatter_tensor(output, whole, async_op=True))
        return [(output, total * (rank + 1))]

    def all_to_all_single(complete):
        output = torch.empty(world * count)
        send = torch.cat([_ramp(rank, count) + d for d in range(world)])
        complete(dist.all_to_all_single(output, send, async_op=True))
        return [(output, torch.cat([_ramp(r, count) + rank for r in range(world)]))]

    def all_to_all(complete):
        outputs = [torch.empty(count) for _ in range(world)]
        complete(dist.all_to_all(outputs, [_ramp(rank, count) + d for d in range(world)], async_op=True))
        return [(outputs, [_ramp(r, count) + rank for r in range(world)])]

    def barrier(complete):
        complete(dist.barrier(async_op=True))
        return []

    def isend_irecv(complete):
        received = torch.empty(count)
        works = [dist.isend(_ramp(rank, count), right), dist.irecv(received, left)]
        for work in works:
            complete(work)
        return [(received, everyone[left])]

    return {
        operation.__name__: operation
        for operation in (
            allreduce,
            broadcast,
            all_gather,
            all_gather_into_tensor,
            gather,
            scatter,
            reduce,
            reduce_scatter,
            reduce_scatter_tensor,
            all_to_all_single,
            all_to_all,
            barrier,
            isend_irecv,
        )
    }


def check_completion_routes(checks: Checks, world: int) -> None:
    rank = dist.get_rank()
    for size_name, count in ROUTE_SIZES.items():
        for name, operation in route_operations(rank, world, count).items():
            for route in ROUTES:
                pairs = operation(functools.partial(_complete, route=route))
                checks.equal(f"route {name} {size_name} {route}", [a for a, _ in pairs], [e for _, e in pairs])

    # Issue order holds across the queue: queued collectives, then a small async one and a blocking one issued
    # behind them, completed in reverse order; each result must be its own collective's.
    count = ROUTE_SIZES["queued"]
    first, second = _ramp(rank, count), _ramp(rank, count) * 2
    small, blocking = torch.full((4,), float(rank)), torch.full((2,), float(rank + 1))
    works = [
        dist.all_reduce(first, async_op=True),
        dist.all_reduce(second, op=ReduceOp.MAX, async_op=True),
        dist.all_reduce(small, async_op=True),
    ]
    dist.all_reduce(blocking)
    for work, route in zip(reversed(works), ("future", "wait", "future"), strict=True):
        _complete(work, route)
    expected_second = torch.stack([_ramp(r, count) * 2 for r in range(world)]).max(0).values
    checks.equal(
        "route issue order behind queued collectives",
        [first, second, small, blocking],
        [
            torch.stack([_ramp(r, count) for r in range(world)]).sum(0),
            expected_second,
            torch.full((4,), float(sum(range(world)))),
            torch.full((2,), float(sum(range(1, world + 1)))),
        ],
    )


def check_rendezvous_refuses_wrong_rank(checks: Checks) -> None:
    launch = mpi.detect_mpi_launch()
    assert launch is not None, "run under mpirun"
    wrong_rank = launch.world_size + launch.rank
    checks.raises(
        "mpi:// refuses a rank that disagrees with MPI",
        ValueError,
        "disagrees with MPI",
        lambda: dist.init_process_group(
            "mpi4py", init_method=mpi.mpi_init_method(), rank=wrong_rank, world_size=launch.world_size
        ),
    )


def main() -> None:
    launch = mpi.detect_mpi_launch()
    assert launch is not None, "run under mpirun"
    report = RankReport(sys.argv[1], launch.rank)
    checks = Checks(report)
    check_rendezvous_refuses_wrong_rank(checks)
    rank, world = init_from_mpi_launch("mpi4py")
    for check in (
        check_allreduce,
        check_broadcast,
        check_gathers,
        check_reductions_to_parts,
        check_all_to_all,
        check_point_to_point,
        check_groups_and_errors,
        check_completion_routes,
    ):
        check(checks, world)
    dist.barrier()
    dist.destroy_process_group()
    for name in checks.passed:
        report.line(f"rank {rank} passed: {name}")
    report.line(f"rank {rank}: {len(checks.passed)} checks passed")
    equal_to_gloo = compare_with_gloo(report)
    sys.exit(1 if checks.failed or not equal_to_gloo else 0)


if __name__ == "__main__":
    main()
