"""A training job whose backend is a transport registered by a call in this script (``wrapped_gloo.register()``):
each rank prints the backend its process group runs on; with ``--fail``, every rank raises in its first step."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

if TYPE_CHECKING:
    # mypy checks tests/ as one tree, where this file's neighbour is ``jobs.wrapped_gloo``; the job runs with
    # tests/jobs on sys.path, where it is ``wrapped_gloo``.
    from jobs.wrapped_gloo import register
else:
    from wrapped_gloo import register

from lightning_dist_hooks import Trainer


class OneStepModule(pl.LightningModule):
    def __init__(self, fail: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.fail = fail

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.fail:
            raise RuntimeError(f"injected on rank {self.global_rank}")
        print(f"rank {self.global_rank} trains over {dist.get_backend()}", flush=True)
        (inputs,) = batch
        return self.layer(inputs).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args()
    register()
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        torch_dist_backend=args.backend,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(OneStepModule(args.fail), DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=1))


if __name__ == "__main__":
    main()
