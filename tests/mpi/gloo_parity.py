"""Reductions of the mpi4py backend (dense and sparse), and DDP with a sparse embedding and FSDP training on it, are
bitwise equal to gloo's.

Run by collectives.py (the same job). Reductions run on random data for every dtype and op. gloo is the default
group, over ``tcp://127.0.0.1:$MPI_TEST_PORT``; the mpi4py backend runs as ``new_group(backend="mpi4py")`` over
the same ranks. Reports ``MISMATCH ...`` per difference and
``rank R: N comparisons (F FSDP parameters, S sparse), M bitwise equal``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _setup import RankReport, init_from_mpi_launch, mpi
from torch.distributed import ReduceOp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

ELEMENTS = 4096
FLOAT_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG)
INTEGER_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
# Exponent ranges keep products finite: float16 tops out at 65504.
FLOAT_EXPONENTS = {
    torch.float16: (-10, 7),
    torch.bfloat16: (-40, 40),
    torch.float32: (-40, 40),
    torch.float64: (-40, 40),
}
INTEGER_DTYPES = (torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool)  # gloo has no int16 reductions


def random_tensor(dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Values spread over many magnitudes, so that sums and products round."""
    if dtype in FLOAT_EXPONENTS:
        low, high = FLOAT_EXPONENTS[dtype]
        scale = torch.pow(2.0, torch.randint(low, high, (ELEMENTS,), generator=generator).double())
        return (torch.randn(ELEMENTS, generator=generator, dtype=torch.float64) * scale).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (ELEMENTS,), generator=generator).bool()
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (ELEMENTS,), generator=generator, dtype=torch.int64).to(dtype)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    # gloo sums bools as bytes and may store 2 for True; compare booleans by value, everything else by bytes.
    return tensor if tensor.dtype == torch.bool else tensor.contiguous().view(torch.uint8)


def train_fsdp(version: int, group: dist.ProcessGroup) -> list[torch.Tensor]:
    """Three SGD steps of a small MLP sharded with FSDP ``version`` (1 or 2) over ``group``; the full parameters."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model: torch.nn.Module = layers
    if version == 2:
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in (layers[0], layers[2], layers):
            fully_shard(layer, mesh=mesh)
    else:
        model = FullyShardedDataParallel(layers, process_group=group, device_id=torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(3):
        model(torch.randn(8, 16, generator=data)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    if version == 2:
        return [tensor.full_tensor() for tensor in model.state_dict().values()]
    with FullyShardedDataParallel.summon_full_params(model):
        return [parameter.detach().clone() for parameter in model.parameters()]


def train_ddp_sparse_embedding(group: dist.ProcessGroup) -> list[torch.Tensor]:
    """Three SGD steps of DDP over ``group`` with ``nn.Embedding(sparse=True)``, whose gradients DDP all-reduces
    as sparse tensors; the parameters."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8, sparse=True), torch.nn.Linear(8, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(3):
        ddp(torch.randint(0, 50, (16,), generator=data)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [parameter.detach().clone() for parameter in model.parameters()]


def compare_with_gloo(report: RankReport) -> bool:
    """Return whether every compared result is bitwise equal; needs no process group initialised yet."""
    rank, world = init_from_mpi_launch("gloo")
    mpi.register()  # the transport is registered when first asked for, not at import
    ours = dist.new_group(backend="mpi4py")
    generator = torch.Generator().manual_seed(1000 + rank)
    compared: list[str] = []
    mismatches: list[str] = []

    def compare(name: str, from_ours: torch.Tensor, from_gloo: torch.Tensor) -> None:
        compared.append(name)
        if not torch.equal(bits(from_ours), bits(from_gloo)):
            differ = (bits(from_ours) != bits(from_gloo)).sum().item()
            mismatches.append(name)
            report.line(f"rank {rank}: MISMATCH {name}: {differ} differing bytes")

    cases: list[tuple[torch.dtype, tuple[ReduceOp.RedOpType, ...]]] = [(dtype, FLOAT_OPS) for dtype in FLOAT_EXPONENTS]
    cases += [(dtype, INTEGER_OPS) for dtype in INTEGER_DTYPES]
    for dtype, ops in cases:
        for op in ops:
            data = random_tensor(dtype, generator)
            from_ours, from_gloo = data.clone(), data.clone()
            dist.all_reduce(from_ours, op=op, group=ours)
            dist.all_reduce(from_gloo, op=op)
            compare(f"allreduce {op.name} {dtype}", from_ours, from_gloo)

    # gloo rejects AVG on integers; Lightning then sums and divides with copy_: ours must give that result.
    data = random_tensor(torch.int64, generator) // 4
    from_ours, from_gloo = data.clone(), data.clone()
    dist.all_reduce(from_ours, op=ReduceOp.AVG, group=ours)
    dist.all_reduce(from_gloo, op=ReduceOp.SUM)
    compare("allreduce AVG int64 vs Lightning's gloo fallback", from_ours, from_gloo.copy_(from_gloo / world))

    for dtype in FLOAT_EXPONENTS:
        data = random_tensor(dtype, generator)[: ELEMENTS - ELEMENTS % world]
        outputs = [torch.empty(data.numel() // world, dtype=dtype) for _ in range(2)]
        dist.reduce_scatter_tensor(outputs[0], data, group=ours)
        dist.reduce_scatter_tensor(outputs[1], data.clone())
        compare(f"reduce_scatter_tensor SUM {dtype}", *outputs)

    # Sparse COO tensors, a different number of entries on each rank, overlapping indices: gloo sums them.
    for dtype in (torch.float32, torch.float64):
        entries = 5 + 7 * rank
        indices = torch.randint(0, 64, (2, entries), generator=generator)
        data = torch.sparse_coo_tensor(indices, random_tensor(dtype, generator)[:entries], (64, 64))
        from_ours, from_gloo = data.clone(), data.clone()
        dist.all_reduce(from_ours, group=ours)
        dist.all_reduce(from_gloo)
        compare(f"sparse allreduce SUM {dtype}", from_ours.to_dense(), from_gloo.coalesce().to_dense())

    gloo = dist.group.WORLD
    assert gloo is not None
    ours_trained, gloo_trained = train_ddp_sparse_embedding(ours), train_ddp_sparse_embedding(gloo)
    for index, (mine, theirs) in enumerate(zip(ours_trained, gloo_trained, strict=True)):
        compare(f"DDP sparse embedding parameter {index}", mine, theirs)

    for version in (1, 2):
        ours_trained, gloo_trained = train_fsdp(version, ours), train_fsdp(version, gloo)
        for index, (mine, theirs) in enumerate(zip(ours_trained, gloo_trained, strict=True)):
            compare(f"FSDP{version} parameter {index}", mine, theirs)

    dist.barrier()
    dist.destroy_process_group()
    fsdp = sum(name.startswith("FSDP") for name in compared)
    sparse = sum("sparse" in name for name in compared)
    equal = len(compared) - len(mismatches)
    report.line(f"rank {rank}: {len(compared)} comparisons ({fsdp} FSDP parameters, {sparse} sparse), {equal} bitwise "
                "equal")  # fmt: skip
    return not mismatches
