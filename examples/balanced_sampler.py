"""A class-balanced sampler made distributed through ``configure_sampler``.

    python examples/balanced_sampler.py

The data set has 90% class 0 and 10% class 1. ``WeightedRandomSampler`` would balance it on one process,
but Lightning cannot split a random sampler across ranks by itself. ``configure_sampler`` returns a sampler
that draws the same balanced sequence on every rank (same seed and epoch) and gives each rank every
world_size-th draw, so ranks never repeat each other's samples within an epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.trainer.states import RunningStage
from torch.utils.data import DataLoader, Sampler, TensorDataset

from lightning_dist_hooks import LightningModule, Trainer


class DistributedWeightedSampler(Sampler[int]):
    """Draw ``num_samples`` indices with replacement by ``weights``; this rank keeps every ``world_size``-th."""

    def __init__(self, weights: torch.Tensor, num_samples: int, rank: int, world_size: int, seed: int = 0) -> None:
        self.weights, self.rank, self.world_size, self.seed = weights, rank, world_size, seed
        self.per_rank = num_samples // world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this every epoch
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        draws = torch.multinomial(self.weights, self.per_rank * self.world_size, replacement=True, generator=generator)
        return iter(draws[self.rank :: self.world_size].tolist())

    def __len__(self) -> int:
        return self.per_rank


class Classifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.labels_seen: Counter = Counter()

    def configure_sampler(self, dataloader: DataLoader, stage: RunningStage) -> Sampler | None:
        if stage != RunningStage.TRAINING:
            return super().configure_sampler(dataloader, stage)  # Lightning's usual choice elsewhere
        dataset = dataloader.dataset
        assert isinstance(dataset, TensorDataset)  # train_dataloader's
        labels = dataset.tensors[1]
        class_weight = 1.0 / torch.bincount(labels).float()
        return DistributedWeightedSampler(
            class_weight[labels], num_samples=len(labels), rank=self.global_rank, world_size=self.trainer.world_size
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.labels_seen.update(y.tolist())
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        labels = (torch.rand(1000, generator=generator) < 0.1).long()
        x = torch.randn(1000, 2, generator=generator) + labels.unsqueeze(1) * 2.0
        return DataLoader(TensorDataset(x, labels), batch_size=50)

    def on_fit_end(self) -> None:
        counts = torch.tensor([self.labels_seen[0], self.labels_seen[1]])
        dist.all_reduce(counts)
        if self.global_rank == 0:
            share = counts[1].item() / counts.sum().item()
            print(
                f"class counts over {self.trainer.world_size} ranks: {counts.tolist()} "
                f"(class 1 share {share:.2f}, 0.10 in the data)",
                flush=True,
            )


def main() -> None:
    pl.seed_everything(0)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier())


if __name__ == "__main__":
    main()
