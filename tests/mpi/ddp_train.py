"""A few deterministic DDP training steps; rank 0 saves the final parameters.

Usage (under mpirun): python ddp_train.py BACKEND OUT_FILE [--pause-dir DIR]

With --pause-dir, every rank writes ``rank<R>.pid`` into DIR after the first steps and waits (at most 60 s) for
DIR/resume before it continues (``_setup.pause_for_inspection``), so the test can inspect the sockets of a job that
is mid-training.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from _setup import init_from_mpi_launch, pause_for_inspection
from torch.nn.parallel import DistributedDataParallel

STEPS = 6
PAUSE_AFTER_STEP = 2


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend")
    parser.add_argument("out_file", type=Path)
    parser.add_argument("--pause-dir", type=Path)
    args = parser.parse_args()

    rank, _ = init_from_mpi_launch(args.backend)
    # A small first bucket spreads the gradients over several buckets, so several allreduces overlap backward.
    model = DistributedDataParallel(make_model(), bucket_cap_mb=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        inputs = torch.randn(32, 64, generator=data)
        targets = torch.randn(32, 8, generator=data)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
        if step == PAUSE_AFTER_STEP and args.pause_dir is not None:
            pause_for_inspection(args.pause_dir, rank)
    if rank == 0:
        torch.save({name: p.detach().clone() for name, p in model.module.named_parameters()}, args.out_file)
    del model, optimizer  # gloo hangs at exit if DDP's reducer outlives its process group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
