"""Fabric on 2 CPU processes with the flags, a ``setup_distributed_backend`` of your own and your own sampler.

    python examples/fabric_custom_sampler.py --rendezvous-dir /shared/scratch/me/

Fabric already lets a loader keep its sampler: ``setup_dataloaders(loader, use_distributed_sampler=False)``. Build
your distributed sampler from ``fabric.global_rank`` and ``fabric.world_size`` after ``fabric.launch()``.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler, TensorDataset

from lightning_dist_hooks import Fabric  # lightning_dist_hooks.lightning.Fabric for `import lightning as L`


def setup_distributed_backend(backend, init_method, rank, world_size, timeout, device_id=None):
    """The LightningModule hook's signature; here it only says what it got, then does the default."""
    print(f"rank {rank}: init_process_group({backend!r}, {init_method!r}, world_size={world_size})", flush=True)
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
    )  # None on CPU; the rank's GPU with CUDA, as Lightning binds it


class EveryNth(Sampler):
    """Rank r of n reads samples r, r + n, r + 2n, ...: a split of your own instead of Fabric's DistributedSampler."""

    def __init__(self, size: int, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, size, world_size))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def train(fabric: Fabric) -> None:
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = torch.nn.Linear(8, 1)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = DataLoader(dataset, batch_size=32, sampler=EveryNth(len(dataset), fabric.global_rank, fabric.world_size))
    loader = fabric.setup_dataloaders(loader, use_distributed_sampler=False)
    for _ in range(2):
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    samples = fabric.all_reduce(torch.tensor(len(loader.sampler)), reduce_op="sum")
    weights = fabric.all_gather(torch.cat([p.detach().flatten() for p in model.parameters()]))
    if fabric.global_rank == 0:
        same = all(torch.equal(weights[0], other) for other in weights[1:])
        print(
            f"fabric ranks={fabric.world_size} backend={dist.get_backend()} "
            f"init_method={fabric.torch_dist_init_method} samples_per_epoch={int(samples)} "
            f"weights_equal_on_all_ranks={same}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rendezvous-dir", help="a directory every rank can reach (default: a new temp dir)")
    args = parser.parse_args()
    rendezvous_dir = args.rendezvous_dir or os.environ.setdefault("EXAMPLE_RENDEZVOUS_DIR", tempfile.mkdtemp())
    fabric = Fabric(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        torch_dist_backend="gloo",
        torch_dist_init_method=f"file://{os.path.abspath(rendezvous_dir)}/",
        setup_distributed_backend=setup_distributed_backend,
    )
    fabric.seed_everything(0)
    fabric.launch(train)


if __name__ == "__main__":
    main()
