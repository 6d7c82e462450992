"""``python -m benchmarks [--quick] [--with-mpi] [--out DIR] [--update-docs]``: run every benchmark section.

Writes ``results.json``, ``results.md`` and the PNG plots into ``--out`` and prints the Markdown table. On a busy
2-core machine the full run takes about 15 minutes and ``--quick`` (a smoke run: tiny sizes, one repetition)
1.5 minutes, most of it importing Lightning in the 7 fresh processes it needs (~9 s of CPU each there).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from benchmarks import bootstrap, docs, mpi_section, report, startup, step_overhead
from benchmarks.common import REPO, machine

RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Settings:
    step_rounds: int
    warmup_steps: int
    timed_steps: int
    startup_repetitions: int
    bootstrap_world_sizes: tuple[int, ...]
    bootstrap_repetitions: int


FULL = Settings(
    step_rounds=20,
    warmup_steps=10,
    timed_steps=50,
    startup_repetitions=6,
    bootstrap_world_sizes=(2, 4, 8, 16, 32),
    bootstrap_repetitions=5,
)
QUICK = Settings(
    step_rounds=1,
    warmup_steps=2,
    timed_steps=5,
    startup_repetitions=1,
    bootstrap_world_sizes=(2, 4),
    bootstrap_repetitions=1,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: checks that every section works")
    parser.add_argument(
        "--with-mpi",
        action="store_true",
        help="also run benchmarks/mpi_allreduce.py under mpirun (skipped without mpirun/mpi4py)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"results folder (default {RESULTS.relative_to(REPO)}, or its quick/ subfolder with --quick)",
    )
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help="rewrite the documentation's generated blocks from these results (python -m benchmarks.docs)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: redraw the table and plots (and the docs) from --out's results.json",
    )
    args = parser.parse_args()
    if args.update_docs and args.out not in (None, RESULTS):
        parser.error(f"--update-docs renders the documentation from {RESULTS.relative_to(REPO)}; drop --out")
    return args


def main() -> None:
    args = parse_args()
    settings = QUICK if args.quick else FULL
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    results = json.loads((out / "results.json").read_text()) if args.report_only else measure(args, settings, out)
    report.plot(results, out)
    table = report.markdown(results)
    (out / "results.md").write_text(table)
    print(table)
    if args.update_docs:
        docs.main([])


def measure(args: argparse.Namespace, settings: Settings, out: Path) -> dict:
    """Run every section and write ``results.json`` into ``out``."""
    # No tqdm monitor thread: the bootstrap section forks ranks, which must not inherit a running thread.
    tqdm.monitor_interval = 0
    started = time.monotonic()
    results: dict = {
        "settings": asdict(settings),
        "machine": machine(),
        "command": shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }
    total = (
        step_overhead.task_count(settings.step_rounds)
        + startup.task_count(settings.startup_repetitions)
        + bootstrap.task_count(list(settings.bootstrap_world_sizes), settings.bootstrap_repetitions)
        + int(args.with_mpi)
    )
    with tempfile.TemporaryDirectory(prefix="ldh-bench-") as scratch, tqdm(total=total, unit="task") as bar:
        workdir = Path(scratch)
        bar.set_description("bootstrap")
        results["bootstrap"] = bootstrap.run(
            list(settings.bootstrap_world_sizes), settings.bootstrap_repetitions, workdir, bar.update
        )
        bar.set_description("step overhead")
        results["step_overhead"] = step_overhead.run(
            settings.step_rounds, settings.warmup_steps, settings.timed_steps, workdir, bar.update
        )
        bar.set_description("start-up")
        results["startup"] = startup.run(settings.startup_repetitions, workdir, bar.update)
        if args.with_mpi:
            bar.set_description("mpi")
            results["mpi_allreduce"] = mpi_section.run(args.quick, workdir)
            bar.update(1)
    results["machine"]["load_after"] = os.getloadavg()
    results["seconds"] = time.monotonic() - started
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
