"""Train on 2 CPU processes started by ``mpirun``, over MPI alone: no TCP store, no file, no listening socket.

    mpirun --mca btl self,vader -n 2 python examples/mpirun_mpi_transport.py

(``self,sm`` on Open MPI 5; as root add ``--allow-run-as-root``, on fewer cores than ranks ``--oversubscribe``.)
``torch_dist_backend="mpi"`` on stock torch is this package's MPI transport (``mpi4py``, ``pip install ".[mpi]"``),
and the ranks meet through ``mpi://``: rank and world size come from MPI. ``--mca btl self,vader`` keeps Open MPI
on shared memory; plain ``mpirun -n 2`` also starts its TCP transport, and every rank then listens on a port of every
interface. Each rank lists the listening TCP sockets it holds at the end (read from ``/proc``), so you can see that
there are none. ``mpirun`` itself still listens for its own daemons (docs/mpi.md, "What listens, per launch").
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist_hooks import Trainer


def socket_inodes(pid: int | str) -> set[str]:
    """The inodes of the sockets process ``pid`` holds."""
    inodes = set()
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(descriptor)
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def listening_tcp_sockets(pid: int | str = "self") -> dict[str, str]:
    """``{inode: "ADDRESS:PORT"}`` of the TCP sockets in LISTEN state that process ``pid`` holds (IPv4 and IPv6)."""
    held, found = socket_inodes(pid), {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in held:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)  # /proc writes each 32-bit word of the address in host (little-endian) order
            packed = b"".join(raw[word : word + 4][::-1] for word in range(0, len(raw), 4))
            host = str(ipaddress.ip_address(packed))
            found[fields[9]] = f"[{host}]:{int(port, 16)}" if table == "tcp6" else f"{host}:{int(port, 16)}"
    return found


def describe_listening_sockets() -> str:
    """This process's listening TCP sockets, each one that an ancestor (the launcher) holds too named as its."""
    ancestors, pid = [], os.getppid()
    while pid > 1:
        ancestors.append((pid, Path(f"/proc/{pid}/comm").read_text().strip()))
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    described = []
    for inode, name in sorted(listening_tcp_sockets().items(), key=lambda item: item[1]):
        holders = []
        for ancestor, command in ancestors:
            try:
                if inode in socket_inodes(ancestor):
                    holders.append(f"{command}, pid {ancestor}")
            except OSError:
                pass  # another user's process (root's slurmstepd): its descriptors are not ours to list
        described.append(f"{name} (inherited from {holders[-1]})" if holders else name)
    return ", ".join(described) or "none"


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
        # Equal weights on all ranks mean the gradients really were all-reduced, here over MPI.
        flat = torch.cat([p.detach().flatten() for p in self.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(self.trainer.world_size)]
        dist.all_gather(gathered, flat)
        sockets: list[str] = [""] * self.trainer.world_size
        dist.all_gather_object(sockets, f"(pid {os.getpid()}): {describe_listening_sockets()}")
        if self.global_rank == 0:
            trainer = self.trainer
            assert isinstance(trainer, Trainer)  # this project's Trainer, which adds torch_dist_init_method
            for rank, listening in enumerate(sockets):
                print(f"rank {rank} {listening.replace(': ', ': listening TCP sockets: ', 1)}", flush=True)
            same = all(torch.equal(gathered[0], other) for other in gathered[1:])
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
        torch_dist_backend="mpi",  # the MPI transport on stock torch; the rendezvous goes through mpi://
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(Regression())


if __name__ == "__main__":
    main()
