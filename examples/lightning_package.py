"""The same 2-process gloo + ``file://`` run, written against the unified ``lightning`` package
(``import lightning as L``).

    python examples/lightning_package.py --rendezvous-dir /shared/scratch/me/

``file:///DIR/`` (with the trailing slash) makes one rendezvous file per launch inside DIR, named after the launch,
so many runs can share one directory. Needs ``pip install ".[lightning]"`` from a clone (``pip install lightning``).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist_hooks.lightning import Trainer  # instead of: from lightning import Trainer


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32, shuffle=True)

    def on_fit_end(self) -> None:
        flat = torch.cat([p.detach().flatten() for p in self.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(self.trainer.world_size)]
        dist.all_gather(gathered, flat)
        if self.global_rank == 0:
            trainer = self.trainer
            assert isinstance(trainer, Trainer)  # this project's Trainer, which adds torch_dist_init_method
            same = all(torch.equal(gathered[0], other) for other in gathered[1:])
            print(
                f"package=lightning ranks={self.trainer.world_size} backend={dist.get_backend()} "
                f"init_method={trainer.torch_dist_init_method} weights_equal_on_all_ranks={same}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rendezvous-dir", help="a directory every rank can reach (default: a new temp dir)")
    args = parser.parse_args()
    # Lightning re-runs this script for rank 1 with the parent's environment: both ranks get the same directory.
    rendezvous_dir = args.rendezvous_dir or os.environ.setdefault("EXAMPLE_RENDEZVOUS_DIR", tempfile.mkdtemp())
    L.seed_everything(0)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        torch_dist_backend="gloo",
        torch_dist_init_method=f"file://{os.path.abspath(rendezvous_dir)}/",
    )
    trainer.fit(Regression())


if __name__ == "__main__":
    main()
