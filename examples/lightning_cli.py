"""LightningCLI with ``trainer_class=lightning_dist_hooks.Trainer``: our flags are ``--trainer.*`` options like any
other.

    python examples/lightning_cli.py fit --trainer.accelerator=cpu --trainer.devices=2 --trainer.strategy=ddp \\
        --trainer.max_epochs=2 --trainer.torch_dist_backend=gloo --trainer.torch_dist_init_method=file:///shared/me/
    python examples/lightning_cli.py fit --print_config      # every option, ours included, with its default
    python examples/lightning_cli.py fit --config run.yaml   # or the same options in a YAML file

Needs ``pip install ".[cli]"`` from a clone (or ``pip install "jsonargparse[signatures]>=4.39.0"``). With
``import lightning as L``, use ``lightning.pytorch.cli`` and ``lightning_dist_hooks.lightning.Trainer``.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist_hooks import Trainer


class Regression(pl.LightningModule):
    def __init__(self, learning_rate: float = 0.05) -> None:
        super().__init__()
        self.learning_rate = learning_rate
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.learning_rate)

    def train_dataloader(self):
        x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32, shuffle=True)

    def on_fit_end(self) -> None:
        if self.global_rank == 0:
            trainer = self.trainer
            assert isinstance(trainer, Trainer)  # this project's Trainer, which adds torch_dist_init_method
            print(
                f"cli ranks={self.trainer.world_size} backend={dist.get_backend()} "
                f"init_method={trainer.torch_dist_init_method}",
                flush=True,
            )


if __name__ == "__main__":
    LightningCLI(Regression, trainer_class=Trainer, save_config_callback=None)
