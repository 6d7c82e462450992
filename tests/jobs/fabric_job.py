"""A small Fabric training run with this project's Fabric, launched as real processes by the tests.

``--package`` picks the Lightning package. The loader keeps its own distributed sampler
(``setup_dataloaders(..., use_distributed_sampler=False)``); each rank writes what it saw to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler, TensorDataset

PACKAGES = {"pytorch_lightning": "lightning_dist_hooks", "lightning": "lightning_dist_hooks.lightning"}
DATASET_SIZE = 24
setup_calls: list[dict] = []


def recording_setup_distributed_backend(backend, init_method, rank, world_size, timeout, device_id=None):
    """Module-level, so that ``ddp_spawn`` can pickle it by reference."""
    setup_calls.append(
        {
            "backend": backend,
            "init_method": init_method,
            "rank": rank,
            "world_size": world_size,
            "device_id": None if device_id is None else str(device_id),
        }
    )
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
    )


class StridedSampler(Sampler):
    """A user's own distributed split: rank r of n takes r, r + n, r + 2n, ..."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, DATASET_SIZE, world_size))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _bound_device() -> str | None:
    """The device the default process group was bound to at creation (``init_process_group(device_id=...)``)."""
    bound = dist.distributed_c10d._get_default_group().bound_device_id
    return None if bound is None else str(bound)


def train(fabric, out: str) -> None:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(DATASET_SIZE, 4, generator=generator)
    dataset = TensorDataset(torch.arange(DATASET_SIZE), x, x.sum(dim=1, keepdim=True))
    fabric.seed_everything(7)
    model = torch.nn.Linear(4, 1)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = DataLoader(dataset, batch_size=4, sampler=StridedSampler(fabric.global_rank, fabric.world_size))
    loader = fabric.setup_dataloaders(loader, use_distributed_sampler=False)
    seen = []
    for indices, inputs, targets in loader:
        seen.extend(indices.tolist())
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    record = {
        "rank": fabric.global_rank,
        "world_size": fabric.world_size,
        "environment": type(fabric.strategy.cluster_environment).__name__,
        "fabric": f"{type(fabric).__module__}.{type(fabric).__qualname__}",
        "setup_calls": setup_calls,
        "process_group_backend": dist.get_backend(),
        "seen": seen,
        "samples_on_all_ranks": int(fabric.all_reduce(torch.tensor(len(seen)), reduce_op="sum").item()),
        "weights_sha256": hashlib.sha256(
            b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
        ).hexdigest(),
        "bound_device": _bound_device(),
        "pid": os.getpid(),
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"rank{fabric.global_rank}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", choices=sorted(PACKAGES), default="pytorch_lightning")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--backend")
    parser.add_argument("--init-method")
    parser.add_argument("--setup-hook", action="store_true", help="pass recording_setup_distributed_backend")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    ours = importlib.import_module(PACKAGES[args.package])
    fabric = ours.Fabric(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=args.strategy,
        torch_dist_backend=args.backend,
        torch_dist_init_method=args.init_method,
        setup_distributed_backend=recording_setup_distributed_backend if args.setup_hook else None,
    )
    fabric.launch(train, args.out)


if __name__ == "__main__":
    main()
