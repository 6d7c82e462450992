"""The model, data and Trainer settings every timed fit uses, so that all variants do exactly the same work."""

from __future__ import annotations

import itertools
import time

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES, HIDDEN, CLASSES, BATCH_SIZE = 64, 256, 10, 64
SEED = 0


def make_mlp() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )


def make_dataset(batches_per_rank: int, world_size: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(SEED)
    samples = batches_per_rank * BATCH_SIZE * world_size
    return TensorDataset(
        torch.randn(samples, FEATURES, generator=generator), torch.randint(0, CLASSES, (samples,), generator=generator)
    )


def trainer_kwargs(steps: int) -> dict:
    """Identical for pytorch_lightning.Trainer and ours: nothing that logs, checkpoints or prints per step."""
    return {
        "accelerator": "cpu",
        "devices": 2,
        "strategy": "ddp",
        "max_steps": steps,
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }


class Classifier(pl.LightningModule):
    def __init__(self, batches_per_rank: int) -> None:
        super().__init__()
        self.net = make_mlp()
        self.batches_per_rank = batches_per_rank

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return torch.nn.functional.cross_entropy(self.net(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(make_dataset(self.batches_per_rank, 2), batch_size=BATCH_SIZE, shuffle=True)


class HookedClassifier(Classifier):
    """Both hooks overridden with what the defaults do, so only the cost of going through them differs."""

    def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout):
        torch.distributed.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
        )

    def configure_sampler(self, dataloader, stage):
        return DistributedSampler(dataloader.dataset, shuffle=True, seed=SEED)


class StepClock(pl.Callback):
    """Per-step time as the interval between consecutive batch starts: the whole loop, data fetch included.

    N batches give N - 1 steps; the raw DDP loop is timed the same way (``step_worker.run_raw_ddp``).
    """

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())

    @property
    def step_seconds(self) -> list[float]:
        return [later - earlier for earlier, later in itertools.pairwise(self.starts)]
