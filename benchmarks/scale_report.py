"""The table and plot of ``python -m benchmarks.bootstrap`` (``benchmarks/results/rendezvous_scale.json``)."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker


def _median(values: list[float]) -> float:
    return statistics.median(values)


ORDER = ["env://", "FileStore", "dir://", "env:// lazy", "FileStore lazy", "dir:// lazy"]


def _labels(results: dict) -> list[str]:
    """The stores measured, in a fixed order (the run alternates them)."""
    return sorted(results["methods"], key=lambda label: ORDER.index(label) if label in ORDER else len(ORDER))


def _sizes(results: dict) -> list[int]:
    return sorted({int(size) for by_size in results["methods"].values() for size in by_size})


def _samples(results: dict, label: str, size: int) -> dict | None:
    samples = results["methods"].get(label, {}).get(str(size))
    return samples if samples and samples["seconds"] else None


def _operations(results: dict, label: str, size: int, per_rank: bool = True) -> str:
    """``label``'s operations per rank at ``size``: the median rank's (the busiest rank's), or divided by ``size``."""
    samples = _samples(results, label, size)
    if samples is None or not samples["operations"]:
        return "–"
    median = _median([each["median"] for each in samples["operations"]])
    if per_rank:
        return f"{median / size:.1f}"
    return f"{median:.0f} ({_median([each['max'] for each in samples['operations']]):.0f})"


def summary(results: dict, sizes: tuple[int, ...] = (128, 256, 512)) -> str:
    """The README's few lines: ``dir://`` against raw ``FileStore`` at the largest world sizes, eager and lazy."""
    lines = [
        (
            f"Seconds to a first barrier, {results['machine']['cpus']} CPUs, forked ranks, gloo on loopback, median "
            f"of the run's repetitions (`{results['command']}`, {results['date']}; *lazy*: `TORCH_GLOO_LAZY_INIT=1`):"
        ),
        "",
        (
            "| world size | FileStore | dir:// | dir:// ÷ FileStore | FileStore lazy | dir:// lazy "
            "| dir:// ÷ FileStore, lazy |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        cells = []
        for variant in ("", " lazy"):
            stores = [_samples(results, label + variant, size) for label in ("FileStore", "dir://")]
            if None in stores:
                cells += ["–"] * 3
                continue
            file_store, directory = (_median(samples["seconds"]) for samples in stores if samples is not None)
            cells += [f"{file_store:.2f}", f"{directory:.2f}", f"{directory / file_store:.2f}"]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(results: dict, image_dir: str = "") -> str:
    """The section's Markdown: seconds per store and world size, dir://'s operations per rank, memory, skips."""
    labels = _labels(results)
    machine = results["machine"]
    repetitions = max(
        len(samples["seconds"]) for by_size in results["methods"].values() for samples in by_size.values()
    )
    lines = [
        (
            f"**Bootstrap at scale** (`{results['command']}`, {results['date']}): {machine['cpus']} CPUs "
            f"({machine['cpu_model']}), {machine['memory_gib']:.0f} GiB, load {machine['load_before'][0]:.1f} before "
            f"and {machine['load_after'][0]:.1f} after; Python {machine['python']}, torch {machine['torch']}. Forked "
            f"ranks, gloo on loopback; seconds from the first fork until the last rank has passed its first barrier, "
            f"median of up to {repetitions}. *lazy*: `TORCH_GLOO_LAZY_INIT=1` "
            f"({'known to' if results['lazy_init_available'] else 'not in'} this torch's gloo)."
        ),
        "",
        "| world size | " + " | ".join(labels) + " |",
        "|---:|" + "---:|" * len(labels),
    ]
    for size in _sizes(results):
        cells = []
        for label in labels:
            samples = results["methods"][label].get(str(size))
            cells.append(f"{_median(samples['seconds']):.2f}" if samples and samples["seconds"] else "–")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    lines += [
        "",
        (
            "`dir://`'s filesystem operations per rank (opens, reads, creates, writes, links, unlinks, stats, "
            "listings; the median rank and the busiest one, medians over the repetitions) and that divided by the "
            "world size N; each rank's own memory (pages it does not share with the process it was forked from, after "
            "its barrier; median rank, `dir://`); the most of the machine's memory a trial took (MemAvailable's "
            "largest drop, median over the repetitions, other work on the machine included):"
        ),
        "",
        "| world size | `dir://` operations per rank: median (busiest) | per rank / N | `dir://` lazy "
        "| own memory per rank (MiB) | machine memory taken (MiB): "
        + " / ".join(label for label in labels if not label.endswith("lazy"))
        + " |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for size in _sizes(results):
        cells = [
            _operations(results, "dir://", size, per_rank=False),
            _operations(results, "dir://", size),
            _operations(results, "dir:// lazy", size, per_rank=False),
        ]
        own = _samples(results, "dir://", size)
        cells.append(f"{_median(own['private_mib']):.1f}" if own else "–")
        taken = [_samples(results, label, size) for label in labels if not label.endswith("lazy")]
        cells.append(" / ".join(f"{_median(each['memory_used_mib']):.0f}" if each else "–" for each in taken))
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    if results["skipped"]:
        lines += ["", "Not measured:", ""]
        lines += [f"* {what}: {why}" for what, why in results["skipped"].items()]
    lines += ["", f"![bootstrap at scale]({image_dir}rendezvous_scale.png)", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Seconds against world size for every store (left), ``dir://``'s operations per rank (right)."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label in _labels(results):
        by_size = results["methods"][label]
        sizes = sorted(int(size) for size, samples in by_size.items() if samples["seconds"])
        base = label.removesuffix(" lazy")
        color = {"env://": "tab:blue", "FileStore": "tab:orange", "dir://": "tab:green"}.get(base)
        left.plot(
            sizes,
            [_median(by_size[str(size)]["seconds"]) for size in sizes],
            marker="o",
            color=color,
            linestyle="--" if label.endswith("lazy") else "-",
            label=label,
        )
        with_operations = [size for size in sizes if by_size[str(size)]["operations"]]
        if with_operations:
            right.plot(
                with_operations,
                [_median([each["median"] for each in by_size[str(size)]["operations"]]) for size in with_operations],
                marker="o",
                color=color,
                linestyle="--" if label.endswith("lazy") else "-",
                label=f"{label}, median rank",
            )
    everything = _sizes(results)
    for axes in (left, right):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xticks(everything, [str(size) for size in everything])
        axes.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axes.set_xlabel("world size (forked ranks on one machine)")
        axes.legend()
    left.set_ylabel("first fork to last rank past its barrier (s)")
    left.set_title("Bootstrap through each store, gloo, loopback (median)")
    right.plot(everything, [10 * size for size in everything], color="gray", linestyle=":", label="10 N (linear)")
    right.legend()
    right.set_ylabel("filesystem operations per rank")
    right.set_title("dir://: operations per rank")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
