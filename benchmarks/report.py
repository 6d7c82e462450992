"""Turning a results dict into the Markdown report and the PNG plots (benchmarks/docs.py puts the report in the
docs)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only: no display on CI machines
import matplotlib.pyplot as plt

from benchmarks.step_overhead import BASELINE, FLOOR, VARIANTS

LABELS = {
    "raw_ddp": "raw DistributedDataParallel loop",
    "pytorch_lightning": "pytorch_lightning.Trainer",
    "ours_default": "lightning_dist_hooks.Trainer (defaults)",
    "ours_file": "lightning_dist_hooks.Trainer, file://",
    "ours_hooks": "lightning_dist_hooks.Trainer, both hooks overridden",
}
PLOTS = {"step_overhead": "step_overhead.png", "startup": "startup.png", "bootstrap": "bootstrap.png"}


def markdown(results: dict, image_dir: str = "") -> str:
    """The whole report; ``image_dir`` (e.g. ``benchmarks/results/``) adds the plots as images."""
    machine, step = results["machine"], results["step_overhead"]
    startup, boot = results["startup"], results["bootstrap"]
    lines = [
        (
            f"Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), {machine['memory_gib']:.0f} GiB memory, "
            f"Python {machine['python']}, torch {machine['torch']}, pytorch-lightning {machine['pytorch_lightning']}; "
            f"load average {machine['load_before'][0]:.2f} before, {machine['load_after'][0]:.2f} after "
            f"(1 min). Command: `{results['command']}` ({results['seconds']:.0f} s, {results['date']})."
        ),
        "",
        (
            f"**Step overhead**: 2 ranks, gloo, CPU, one torch thread each; {step['rounds']} rounds of every variant "
            f"(seeded random order per round), {step['timed_steps']} timed steps per fit after "
            f"{step['warmup_steps']} warm-up steps. "
            "Step = interval between consecutive batch starts, measured inside rank 0. Ratios are per-round "
            "(paired) ratios of fit medians: their median and a bootstrap 95% CI."
        ),
        "",
        "| variant | median step (ms) | IQR over rounds (ms) | vs pytorch_lightning.Trainer | vs raw DDP |",
        "|---|---:|---:|---:|---:|",
    ]
    for variant in VARIANTS:
        row = step["variants"][variant]
        lines.append(
            f"| {LABELS[variant]} | {row['step_ms']['median']:.2f} | "
            f"{row['step_ms']['q1']:.2f}–{row['step_ms']['q3']:.2f} | "
            f"{_ratio(row['ratio_to_lightning'], variant == BASELINE)} | "
            f"{_ratio(row['ratio_to_raw'], variant == FLOOR)} |"
        )
    imports, launch = startup["import_ms"], startup["launch_to_first_step_s"]
    lines += [
        "",
        (
            f"**Start-up**: {imports['lightning_dist_hooks']['n']} fresh interpreters for imports; "
            f"{launch['ours']['n']} launches of a 2-rank `ddp` fit per Trainer (alternating), from `Popen` to rank "
            "0's first `on_train_batch_start`."
        ),
        "",
        "| measurement | median | IQR |",
        "|---|---:|---:|",
        _row("`import pytorch_lightning`", imports["pytorch_lightning"], "ms"),
        _row("`import lightning_dist_hooks` after it (added)", imports["lightning_dist_hooks"], "ms"),
        _row("launch to first step, pytorch_lightning.Trainer", launch["pytorch_lightning"], "s"),
        _row("launch to first step, lightning_dist_hooks.Trainer", launch["ours"], "s"),
        f"| ratio ours / pytorch_lightning (paired) | {_ratio(startup['launch_ratio'], False)} | |",
        "",
        (
            "**Bootstrap latency** (ms, median; fork of the first rank to the last rank past its first barrier, "
            f"gloo, loopback; {_first(_first(boot['latency_ms']))['n']} repetitions):"
        ),
        "",
        "| world size | " + " | ".join(boot["latency_ms"]) + " |",
        "|---:|" + "---:|" * len(boot["latency_ms"]),
    ]
    for size in _first(boot["latency_ms"]):
        medians = [f"{by_size[size]['median']:.0f}" for by_size in boot["latency_ms"].values()]
        lines.append(f"| {size} | " + " | ".join(medians) + " |")
    if "mpi_allreduce" in results:
        lines += ["", _mpi_markdown(results["mpi_allreduce"])]
    if image_dir:
        lines += [""] + [f"![{name}]({image_dir}{file})" for name, file in PLOTS.items()]
    return "\n".join(lines) + "\n"


def _ratio(ratio: dict, is_reference: bool) -> str:
    if is_reference:
        return "1 (reference)"
    low, high = ratio["ci95"]
    return f"{ratio['median']:.3f}x [{low:.3f}, {high:.3f}]"


def _row(label: str, stats: dict, unit: str) -> str:
    digits = 1 if unit == "ms" else 2
    median, q1, q3 = (f"{stats[key]:.{digits}f}" for key in ("median", "q1", "q3"))
    return f"| {label} | {median} {unit} | {q1}–{q3} {unit} |"


def _first(mapping: dict) -> dict:
    return next(iter(mapping.values()))


def _mpi_markdown(mpi: dict) -> str:
    if "skipped" in mpi:
        return f"**MPI**: skipped ({mpi['skipped']})."
    step = mpi["ddp_step"]["median_seconds"]
    lines = [
        (
            f"**MPI** (`benchmarks/mpi_allreduce.py`, 2 ranks under mpirun; median seconds): DDP step "
            f"{step['mpi4py backend'] * 1e3:.2f} ms with the mpi4py backend, {step['gloo'] * 1e3:.2f} ms with gloo."
        ),
        "",
        "| allreduce size | mpi4py backend | gloo | speed vs gloo |",
        "|---:|---:|---:|---:|",
    ]
    for row in mpi["allreduce"]:
        seconds = row["median_seconds"]
        lines.append(
            f"| {row['bytes'] >> 10} KiB | {seconds['mpi4py backend'] * 1e6:.0f} µs | "
            f"{seconds['gloo'] * 1e6:.0f} µs | {row['ours_speed_relative_to']['gloo']:.2f}x |"
        )
    tail = mpi["ddp_backward_tail"]["median_seconds"]
    lines += [
        "",
        (
            "DDP backward's wait for outstanding buckets after the last one was ready: "
            f"{tail['mpi4py backend'] * 1e3:.2f} ms with the mpi4py backend, "
            f"{tail['gloo'] * 1e3:.2f} ms with gloo."
        ),
        "",
        "| allreduce size | blocking | async_op, wait() | async_op, future (DDP's route) | future/blocking |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in mpi["completion_routes"]:
        seconds = [row["median_seconds"][route] * 1e6 for route in row["median_seconds"]]
        future_ratio = row["time_relative_to_blocking"]["async_op, future (DDP's route)"]
        lines.append(
            f"| {row['bytes'] >> 10} KiB | {' | '.join(f'{value:.0f} µs' for value in seconds)} | {future_ratio:.2f}x |"
        )
    return "\n".join(lines)


def plot(results: dict, out: Path) -> None:
    """Write the three PNGs into ``out``."""
    _plot_steps(results["step_overhead"], out / PLOTS["step_overhead"])
    _plot_startup(results["startup"], out / PLOTS["startup"])
    _plot_bootstrap(results["bootstrap"], out / PLOTS["bootstrap"])


def _plot_steps(step: dict, path: Path) -> None:
    """Left: step times. Right: the paired per-round ratios to Lightning, which cancel most of the machine's drift."""
    figure, (times, ratios) = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
    labels = [LABELS[variant] for variant in VARIANTS]
    rows = [step["variants"][variant]["step_ms"] for variant in VARIANTS]
    times.barh(
        labels,
        [row["median"] for row in rows],
        color="tab:blue",
        capsize=4,
        xerr=[[row["median"] - row["q1"] for row in rows], [row["q3"] - row["median"] for row in rows]],
    )
    times.set_xlabel("median step time (ms), bars: IQR over rounds")
    times.set_title(f"Step time, 2 ranks, gloo ({step['rounds']} rounds × {step['timed_steps']} steps)")
    ratios.boxplot(
        [step["variants"][variant]["ratio_to_lightning"]["per_round"] for variant in VARIANTS],
        vert=False,
        positions=range(len(VARIANTS)),
    )
    times.set_yticks(range(len(labels)), labels)  # again: the boxplot (shared y axis) replaced them with numbers
    times.invert_yaxis()
    ratios.axvline(1.0, color="tab:gray", linestyle="--")
    ratios.set_xlabel("per-round ratio to pytorch_lightning.Trainer")
    ratios.set_title("Paired ratios (1 = no overhead)")
    _save(figure, path)


def _plot_startup(startup: dict, path: Path) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    launches = [startup["launch_to_first_step_s"][trainer] for trainer in ("pytorch_lightning", "ours")]
    bars = left.bar(
        ["pytorch_lightning", "lightning_dist_hooks"],
        [s["median"] for s in launches],
        yerr=[[s["median"] - s["q1"] for s in launches], [s["q3"] - s["median"] for s in launches]],
        color=["tab:gray", "tab:blue"],
        capsize=4,
    )
    left.bar_label(bars, fmt="%.1f s", label_type="center")
    left.set_ylabel("launch to first step (s)")
    left.set_title("2-rank ddp fit, median and IQR")
    imports = startup["import_ms"]
    bars = right.bar(
        ["pytorch_lightning", "lightning_dist_hooks\n(added on top)"],
        [imports["pytorch_lightning"]["median"], imports["lightning_dist_hooks"]["median"]],
        color=["tab:gray", "tab:blue"],
    )
    right.bar_label(bars, fmt="%.0f ms")  # ours is too small to see as a bar
    right.margins(y=0.15)
    right.set_ylabel("import time (ms), median")
    right.set_title("Import in a fresh interpreter")
    _save(figure, path)


def _plot_bootstrap(boot: dict, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7, 4))
    for method, by_size in boot["latency_ms"].items():
        sizes = [int(size) for size in by_size]
        axes.errorbar(
            sizes,
            [by_size[str(s)]["median"] for s in sizes],
            yerr=[
                [by_size[str(s)]["median"] - by_size[str(s)]["q1"] for s in sizes],
                [by_size[str(s)]["q3"] - by_size[str(s)]["median"] for s in sizes],
            ],
            marker="o",
            capsize=3,
            label=method,
        )
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(sizes, [str(size) for size in sizes])
    axes.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.set_xlabel("world size (ranks on one machine)")
    axes.set_ylabel("process start to first barrier (ms)")
    axes.set_title("Bootstrap latency, gloo, loopback (median, IQR)")
    axes.legend()
    _save(figure, path)


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
