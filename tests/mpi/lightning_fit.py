"""A Lightning ``Trainer.fit`` on the mpi4py backend, launched by mpirun (Lightning's MPIEnvironment).

Usage (under mpirun -n 2): python lightning_fit.py OUT_DIR [--profile]

Each rank writes OUT_DIR/rank<R>.json with its final parameters and the results of the strategy's
collectives (reduce mean on an int64 tensor, reduce sum, broadcast, all_gather) and the backend in use. With
``--profile`` the fit runs under ``profiler="pytorch"`` (Lightning's ``PyTorchProfiler``), which writes each rank's
Chrome trace to OUT_DIR.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from lightning_fabric.plugins.environments import MPIEnvironment
from pytorch_lightning.profilers import PyTorchProfiler
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist_hooks import mpi


class Regression(pl.LightningModule):
    def __init__(self, out_dir: Path) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)
        self.out_dir = out_dir

    def training_step(self, batch: list[torch.Tensor], batch_index: int) -> torch.Tensor:
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.layer(inputs), targets)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randn(64, 8, generator=generator)
        return DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True)), batch_size=8)

    def on_train_end(self) -> None:
        strategy, rank = self.trainer.strategy, self.global_rank
        record = {
            "rank": rank,
            "backend": dist.get_backend(),
            "parameters": [p.detach().flatten().tolist() for p in self.parameters()],
            "int_mean": strategy.reduce(torch.tensor(3 * rank + 1), reduce_op="mean").item(),
            "float_sum": strategy.reduce(torch.tensor(rank + 1.0), reduce_op="sum").item(),
            "broadcast": strategy.broadcast({"from": rank}, src=1),
            "all_gather": strategy.all_gather(torch.tensor([rank])).tolist(),
            "logged_train_loss": float(self.trainer.callback_metrics["train_loss"]),
        }
        strategy.barrier()
        (self.out_dir / f"rank{rank}.json").write_text(json.dumps(record))


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    profiler = None
    if "--profile" in sys.argv:
        profiler = PyTorchProfiler(dirpath=out_dir, filename="profile", export_to_chrome=True)
    mpi.register()  # pl.Trainer names the backend, so torch must know it first
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend=mpi.BACKEND_NAME),
        plugins=[MPIEnvironment()],
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        profiler=profiler,
    )
    trainer.fit(Regression(out_dir))


if __name__ == "__main__":
    main()
