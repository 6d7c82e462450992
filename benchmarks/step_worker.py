"""One rank of the step-overhead benchmark: runs every planned fit in turn, in this same process.

Started twice by ``step_overhead.py`` with ``LOCAL_RANK`` set, so Lightning treats the processes as launched
externally (as under torchrun or SLURM) and starts none itself. Running all variants in the same two processes
removes process start-up from the comparison and lets the variants alternate. Each fit makes its own process
group (a fresh port, or a fresh rendezvous file) and destroys it afterwards, so ``file://`` really rendezvous
through its file. Rank 0 appends one JSON line per fit to the output file, which is also the progress signal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import lightning_dist_hooks
from benchmarks.workload import (
    BATCH_SIZE,
    SEED,
    Classifier,
    HookedClassifier,
    StepClock,
    make_dataset,
    make_mlp,
    trainer_kwargs,
)


def run_raw_ddp(fit: dict, batches: int, rank: int) -> list[float]:
    """The floor: a hand-written DDP loop with the same model, data, sampler and optimizer."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{fit['port']}", rank=rank, world_size=2)
    model = DistributedDataParallel(make_mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = make_dataset(batches, world_size=2)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=DistributedSampler(dataset, shuffle=True, seed=SEED))
    starts = []
    for inputs, targets in loader:
        starts.append(time.perf_counter())
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    del model  # gloo can hang at exit if DDP's reducer outlives its process group
    return [later - earlier for earlier, later in itertools.pairwise(starts)]


def run_lightning(fit: dict, batches: int) -> list[float]:
    os.environ["MASTER_PORT"] = str(fit["port"])  # Lightning's env:// reads it when the fit starts
    variant = fit["variant"]
    trainer_class = pl.Trainer if variant == "pytorch_lightning" else lightning_dist_hooks.Trainer
    extra: dict[str, Any] = {"torch_dist_init_method": f"file://{fit['file']}"} if variant == "ours_file" else {}
    model = (HookedClassifier if variant == "ours_hooks" else Classifier)(batches)
    clock = StepClock()
    trainer = trainer_class(**trainer_kwargs(batches), callbacks=[clock], **extra)
    trainer.fit(model)
    return clock.step_seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", type=Path, required=True)
    plan = json.loads(parser.parse_args().plan.read_text())
    rank = int(os.environ["LOCAL_RANK"])
    batches = plan["warmup"] + plan["steps"] + 1  # N batch starts give N - 1 steps
    for fit in plan["fits"]:
        seconds = run_raw_ddp(fit, batches, rank) if fit["variant"] == "raw_ddp" else run_lightning(fit, batches)
        dist.destroy_process_group()
        if rank == 0:
            record = {**fit, "step_seconds": seconds[plan["warmup"] :]}
            with open(plan["out"], "a") as out:
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
