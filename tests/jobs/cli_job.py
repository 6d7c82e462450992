"""LightningCLI with this project's Trainer as ``trainer_class``: every option from the command line or a YAML file.

``--package`` (first, before the subcommand) picks the Lightning package. Each rank writes what it saw to
``--model.out``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

PACKAGES = {
    "pytorch_lightning": ("pytorch_lightning", "lightning_dist_hooks"),
    "lightning": ("lightning.pytorch", "lightning_dist_hooks.lightning"),
}
# sys.argv stays as it is: Lightning's ddp launcher starts the other ranks with it.
PACKAGE, CLI_ARGS = (
    (sys.argv[2], sys.argv[3:]) if sys.argv[1:2] == ["--package"] else ("pytorch_lightning", sys.argv[1:])
)
if TYPE_CHECKING:  # either package, typed as pytorch_lightning's (lightning.pytorch's classes are the same)
    import pytorch_lightning as pl

    import lightning_dist_hooks as ours
else:
    pl = importlib.import_module(PACKAGES[PACKAGE][0])
    ours = importlib.import_module(PACKAGES[PACKAGE][1])
LightningCLI = importlib.import_module(f"{PACKAGES[PACKAGE][0]}.cli").LightningCLI


class CliModel(pl.LightningModule):
    def __init__(self, out: str = "out") -> None:
        super().__init__()
        self.out = out
        self.layer = torch.nn.Linear(4, 1)
        self.setup_calls: list[dict] = []

    def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout):
        self.setup_calls.append(
            {"backend": backend, "init_method": init_method, "rank": rank, "world_size": world_size}
        )
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(3)
        x = torch.randn(16, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)

    def teardown(self, stage: str) -> None:
        record = {
            "rank": self.global_rank,
            "world_size": self.trainer.world_size,
            "setup_calls": self.setup_calls,
            "process_group_backend": dist.get_backend() if dist.is_initialized() else None,
            "trainer": f"{type(self.trainer).__module__}.{type(self.trainer).__qualname__}",
            "max_epochs": self.trainer.max_epochs,
            "weights_sha256": hashlib.sha256(
                b"".join(p.detach().numpy().tobytes() for p in self.parameters())
            ).hexdigest(),
        }
        Path(self.out).mkdir(parents=True, exist_ok=True)
        Path(self.out, f"rank{self.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    LightningCLI(
        CliModel,
        trainer_class=ours.Trainer,
        seed_everything_default=7,
        args=CLI_ARGS,
        trainer_defaults={"enable_progress_bar": False, "enable_model_summary": False},
    )
