"""Start-up: import time added by lightning_dist_hooks, and launch-to-first-step of a 2-rank fit."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import bootstrap_ci, in_ms, job_environment, rotated, run_python, start, summary, wait_all

TRAINERS = ["pytorch_lightning", "ours"]


def task_count(repetitions: int) -> int:
    return repetitions * (1 + len(TRAINERS))


def run(repetitions: int, workdir: Path, advance) -> dict:
    """Each repetition: one fresh import probe, then one launch per Trainer (order alternating)."""
    imports: list[dict] = []
    launches: dict[str, list[float]] = {trainer: [] for trainer in TRAINERS}
    for repetition in range(repetitions):
        imports.append(json.loads(run_python(["-m", "benchmarks.import_probe"], timeout=180)))
        advance(1)
        for trainer in rotated(TRAINERS, repetition):
            launches[trainer].append(_launch_to_first_step(trainer, workdir / f"launch-{repetition}-{trainer}"))
            advance(1)
    ratios = [ours / lightning for ours, lightning in zip(launches["ours"], launches["pytorch_lightning"], strict=True)]
    low, high = bootstrap_ci(ratios)
    return {
        "import_ms": {
            name: in_ms(summary([probe[f"{name}_s"] for probe in imports]))
            for name in ("pytorch_lightning", "lightning_dist_hooks")
        },
        "launch_to_first_step_s": {trainer: summary(seconds) for trainer, seconds in launches.items()},
        "launch_ratio": {"median": statistics.median(ratios), "ci95": [low, high], "per_repetition": ratios},
    }


def _launch_to_first_step(trainer: str, out: Path) -> float:
    log = out.with_suffix(".log")
    env = job_environment(BENCH_LAUNCH_T0=repr(time.time()))
    job = start([sys.executable, "-m", "benchmarks.launch_job", "--trainer", trainer, "--out", str(out)], env, log)
    wait_all([job], timeout=300, log=log)
    return float(out.read_text())
