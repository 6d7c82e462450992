"""Train on 2 CPU processes that meet through a file instead of a TCP port: gloo + ``file://``.

    python examples/ddp_file_rendezvous.py                      # rendezvous file in a fresh temp dir
    python examples/ddp_file_rendezvous.py --rendezvous-dir /shared/scratch/me

On a cluster, point ``--rendezvous-dir`` at a filesystem every node shares. No rank opens a TCP
store listener; the file is private to you (mode 0600) and removed when the run ends.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist_hooks import Trainer


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, sync_dist=True, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(512, 8, generator=generator)
        y = x @ torch.linspace(-1, 1, 8).unsqueeze(1)
        return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

    def on_fit_end(self) -> None:
        # Every rank contributes its weights; equal weights on all ranks mean gradients really were all-reduced.
        flat = torch.cat([p.detach().flatten() for p in self.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(self.trainer.world_size)]
        dist.all_gather(gathered, flat)
        if self.global_rank == 0:
            trainer = self.trainer
            assert isinstance(trainer, Trainer)  # this project's Trainer, which adds torch_dist_init_method
            same = all(torch.equal(gathered[0], other) for other in gathered[1:])
            print(
                f"ranks={self.trainer.world_size} backend={dist.get_backend()} "
                f"init_method={trainer.torch_dist_init_method} weights_equal_on_all_ranks={same} "
                f"final_loss={self.trainer.callback_metrics['loss'].item():.4f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rendezvous-dir", help="a directory every rank can reach (default: a new temp dir)")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    # Lightning re-runs this script for ranks 1..N-1 with the parent's environment, so an environment
    # variable set here is how all ranks agree on one directory.
    rendezvous_dir = args.rendezvous_dir or os.environ.setdefault("EXAMPLE_RENDEZVOUS_DIR", tempfile.mkdtemp())
    pl.seed_everything(0)
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        torch_dist_backend="gloo",
        torch_dist_init_method=f"file://{os.path.abspath(rendezvous_dir)}/rendezvous",
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression())


if __name__ == "__main__":
    main()
