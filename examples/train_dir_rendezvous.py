"""Train with a ``dir://`` rendezvous: the ranks meet in a shared directory, with no TCP store and no file locks.

    srun --ntasks-per-node=2 python examples/train_dir_rendezvous.py --rendezvous-dir /shared/scratch/$USER/rdzv

Meant to run under a launcher that names the job (SLURM here: ``examples/slurm_job.sbatch`` submits it; also
torchrun, ``mpirun``, Flux, PBS, LSF), one process per device: ``--devices`` is the tasks per node, ``--num-nodes``
the nodes. ``dir:///DIR/`` (the trailing slash) gives each launch its own rendezvous in your private directory
``DIR/ldh-uid-<UID>/``, named after the job and step, removed when the run ends. DIR must be a directory every node
mounts; unlike ``file://`` it needs no working ``flock`` (Lustre without ``-o flock``, NFS without a lock manager).
gloo still connects the ranks over TCP afterwards: on several nodes set ``GLOO_SOCKET_IFNAME``.
"""

from __future__ import annotations

import argparse
import os

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
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(512, 8, generator=generator)
        y = x @ torch.linspace(-1, 1, 8).unsqueeze(1)
        return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

    def on_fit_end(self) -> None:
        # Equal weights on all ranks mean the gradients really were all-reduced.
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
    parser.add_argument(
        "--rendezvous-dir",
        default=os.environ.get("RENDEZVOUS_DIR"),
        help="a directory every node mounts (default: $RENDEZVOUS_DIR)",
    )
    parser.add_argument("--devices", type=int, default=2, help="processes per node: the launcher's tasks per node")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if not args.rendezvous_dir:
        parser.error("give --rendezvous-dir (or set RENDEZVOUS_DIR): a directory every node mounts")

    pl.seed_everything(0)
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        torch_dist_backend="gloo",
        torch_dist_init_method=f"dir://{os.path.abspath(args.rendezvous_dir)}/",
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(Regression())


if __name__ == "__main__":
    main()
