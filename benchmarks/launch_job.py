"""A 2-rank fit under Lightning's own launcher that records launch-to-first-step time (rank 0), then stops.

``BENCH_LAUNCH_T0`` is the wall-clock time at which the benchmark started this script; ``--trainer ours``
imports and uses ``lightning_dist_hooks.Trainer``, ``--trainer pytorch_lightning`` never imports it.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytorch_lightning as pl

from benchmarks.workload import Classifier, trainer_kwargs

STEPS = 2


class FirstStepClock(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0 and trainer.global_rank == 0:
            self.out.write_text(str(time.time() - float(os.environ["BENCH_LAUNCH_T0"])))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=["pytorch_lightning", "ours"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.trainer == "ours":
        import lightning_dist_hooks

        trainer_class = lightning_dist_hooks.Trainer
    else:
        trainer_class = pl.Trainer
    trainer_class(**trainer_kwargs(STEPS), callbacks=[FirstStepClock(args.out)]).fit(Classifier(batches_per_rank=STEPS))


if __name__ == "__main__":
    main()
