"""Build the process group yourself: ``setup_distributed_backend`` with a hand-made store.

    python examples/custom_setup_hook.py

Sites with their own bootstrap (a key-value service, a job-specific file, a network interface that must
be chosen first) override one method. Here the hook picks the network interface gloo may use and builds a
``FileStore`` by hand instead of handing ``init_method`` to torch.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist_hooks import Trainer


class SiteSpecificBootstrap(pl.LightningModule):
    def __init__(self, store_path: str) -> None:
        super().__init__()
        self.store_path = store_path
        self.layer = torch.nn.Linear(4, 1)

    def setup_distributed_backend(
        self, backend: str, init_method: str, rank: int, world_size: int, timeout: timedelta
    ) -> None:
        # gloo must talk over an interface the cluster allows; loopback is right for this one-machine demo.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = dist.FileStore(self.store_path, world_size)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        # Sub-groups can be made right here, after the default group exists.
        self.even_ranks = dist.new_group(ranks=list(range(0, world_size, 2)))
        print(
            f"rank {rank}: built the {backend} group on a hand-made FileStore (given init_method={init_method})",
            flush=True,
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    def on_fit_end(self) -> None:
        total = torch.tensor([float(self.global_rank + 1)])
        dist.all_reduce(total)
        if self.global_rank == 0:
            print(f"all_reduce over {self.trainer.world_size} ranks gave {total.item():g}", flush=True)


def main() -> None:
    # Ranks 1..N-1 are re-runs of this script with the parent's environment: share the store path through it.
    store_dir = os.environ.setdefault("EXAMPLE_STORE_DIR", tempfile.mkdtemp())
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(SiteSpecificBootstrap(os.path.join(store_dir, "store")))


if __name__ == "__main__":
    main()
