"""Train on 2 CPU processes started by ``mpirun`` with gloo, meeting through ``mpi://``: no TCP store, no shared file.

    mpirun --mca btl self,vader -n 2 python examples/mpirun_gloo_mpi_rendezvous.py

(as root add ``--allow-run-as-root``; on fewer cores than ranks ``--oversubscribe``.) The path a GPU cluster without a
shared directory takes: rank and world size come from MPI, and gloo's addresses travel over MPI (``MpiStore``)
instead of through rank 0's TCP store or a file. gloo itself still connects its ranks over TCP (on
``GLOO_SOCKET_IFNAME``'s interface); only an MPI backend avoids that (``examples/mpirun_mpi_transport.py``). On GPU
nodes, one rank per GPU, the same flags with NCCL::

    Trainer(accelerator="gpu", devices=4, num_nodes=2, strategy="ddp",
            torch_dist_backend="nccl", torch_dist_init_method="mpi://")
    mpirun -n 8 --map-by ppr:4:node python train.py          # or: srun --mpi=pmix python train.py

NCCL's unique id then travels over MPI too. Needs mpi4py (``pip install ".[mpi]"``). Plain ``mpirun`` (without
``--mca btl self,vader``) also starts Open MPI's tcp transport: rank 0 then warns in the log, naming those sockets.
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist_hooks import Trainer


def store_chain() -> str:
    """The stores torch holds for the default group, outermost first: PrefixStores around the one the ranks met in."""
    store, chain = c10d._get_default_store(), []
    while isinstance(store, dist.PrefixStore):
        chain.append("PrefixStore")
        store = store.underlying_store
    return " > ".join([*chain, type(store).__name__])


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
        # Equal weights on all ranks mean the gradients really were all-reduced, here by gloo.
        flat = torch.cat([p.detach().flatten() for p in self.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(self.trainer.world_size)]
        dist.all_gather(gathered, flat)
        if self.global_rank == 0:
            trainer = self.trainer
            assert isinstance(trainer, Trainer)  # this project's Trainer, which adds torch_dist_init_method
            same = all(torch.equal(gathered[0], other) for other in gathered[1:])
            print(f"store: {store_chain()}", flush=True)
            print(
                f"ranks={self.trainer.world_size} backend={dist.get_backend()} "
                f"init_method={trainer.torch_dist_init_method} weights_equal_on_all_ranks={same} "
                f"final_loss={self.trainer.callback_metrics['loss'].item():.4f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=2, help="ranks per node: mpirun's -n on one node")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    pl.seed_everything(0)
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        torch_dist_backend="gloo",
        torch_dist_init_method="mpi://",  # rank and world size from MPI; the rendezvous travels over MPI
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(Regression())


if __name__ == "__main__":
    main()
