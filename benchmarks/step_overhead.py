"""Step overhead: the same 2-rank gloo fit as a raw DDP loop, with pytorch_lightning.Trainer, and with ours."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import bootstrap_ci, free_ports, in_ms, job_environment, shuffled, start, summary, wait_all

VARIANTS = ["raw_ddp", "pytorch_lightning", "ours_default", "ours_file", "ours_hooks"]
BASELINE, FLOOR = "pytorch_lightning", "raw_ddp"


def task_count(rounds: int) -> int:
    return rounds * len(VARIANTS)


def run(rounds: int, warmup: int, steps: int, workdir: Path, advance) -> dict:
    """Run ``rounds`` rounds of every variant (a new order each round) in one pair of rank processes."""
    ports = free_ports(task_count(rounds))
    fits = [
        {"round": round_index, "variant": variant, "port": ports.pop(), "file": str(workdir / f"rdzv-{round_index}")}
        for round_index in range(rounds)
        for variant in shuffled(VARIANTS, seed=round_index)
    ]
    out = workdir / "step_overhead.jsonl"
    plan = workdir / "step_plan.json"
    plan.write_text(json.dumps({"warmup": warmup, "steps": steps, "fits": fits, "out": str(out)}))
    log = workdir / "step_overhead.log"
    ranks = [
        start(
            [sys.executable, "-m", "benchmarks.step_worker", "--plan", str(plan)],
            job_environment(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE="2"),
            log,
        )
        for rank in range(2)
    ]
    done = 0

    def on_tick() -> None:
        nonlocal done
        finished = len(out.read_text().splitlines()) if out.exists() else 0
        advance(finished - done)
        done = finished

    # Importing Lightning takes ~20 s on a busy 2-core machine; a step takes milliseconds.
    wait_all(ranks, timeout=180 + len(fits) * (20 + steps * 0.2), log=log, on_tick=on_tick)
    return analyse([json.loads(line) for line in out.read_text().splitlines()], warmup, steps)


def analyse(records: list[dict], warmup: int, steps: int) -> dict:
    """Per variant: the median step of each fit, their spread over rounds, and paired per-round ratios."""
    fit_median = {(record["round"], record["variant"]): statistics.median(record["step_seconds"]) for record in records}
    rounds = sorted({round_index for round_index, _ in fit_median})
    variants = {}
    for variant in VARIANTS:
        per_round = [fit_median[round_index, variant] for round_index in rounds]
        all_steps = [s for record in records if record["variant"] == variant for s in record["step_seconds"]]
        variants[variant] = {"step_ms": in_ms(summary(per_round)), "all_steps_ms": in_ms(summary(all_steps))}
        for name, reference in (("ratio_to_lightning", BASELINE), ("ratio_to_raw", FLOOR)):
            ratios = [fit_median[round_index, variant] / fit_median[round_index, reference] for round_index in rounds]
            variants[variant][name] = _ratio(ratios)
    return {"warmup_steps": warmup, "timed_steps": steps, "rounds": len(rounds), "variants": variants}


def _ratio(ratios: list[float]) -> dict:
    low, high = bootstrap_ci(ratios)
    return {"median": statistics.median(ratios), "ci95": [low, high], "per_round": ratios}
