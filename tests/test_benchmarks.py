"""``python -m benchmarks --quick`` still runs end to end and writes sane results (the full run is done by hand)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO, job_environment, needs_mpi

EXPECTED_VARIANTS = {"raw_ddp", "pytorch_lightning", "ours_default", "ours_file", "ours_hooks"}


@pytest.mark.slow
def test_quick_benchmarks_write_json_markdown_and_plots(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        env=job_environment(),
        capture_output=True,
        text=True,
        timeout=420,
        stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "| variant | median step (ms)" in completed.stdout

    results = json.loads((tmp_path / "results.json").read_text())
    variants = results["step_overhead"]["variants"]
    assert set(variants) == EXPECTED_VARIANTS
    for row in variants.values():
        assert row["step_ms"]["median"] > 0
        assert row["ratio_to_lightning"]["median"] > 0 and row["ratio_to_raw"]["median"] > 0
    startup = results["startup"]
    assert startup["import_ms"]["lightning_dist_hooks"]["median"] > 0
    assert all(startup["launch_to_first_step_s"][trainer]["median"] > 0 for trainer in ("pytorch_lightning", "ours"))
    assert startup["launch_ratio"]["median"] > 0
    latency = results["bootstrap"]["latency_ms"]
    assert set(latency) == {"env://", "tcp://", "file://", "FileStore", "dir://"}
    assert all(stats["median"] > 0 for by_size in latency.values() for stats in by_size.values())

    assert (tmp_path / "results.md").read_text().startswith("Machine:")
    for plot in ("step_overhead.png", "startup.png", "bootstrap.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_scale_benchmark_writes_json_and_a_plot(tmp_path):
    out = tmp_path / "scale.json"
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.bootstrap", "--world-sizes", "2,4", "--repetitions", "1", "--out", str(out)],
        cwd=REPO,
        env=job_environment(),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads(out.read_text())
    assert set(results["methods"]) == {"env://", "FileStore", "dir://", "env:// lazy", "FileStore lazy", "dir:// lazy"}
    assert results["lazy_init_available"] is True  # torch 2.13's gloo reads TORCH_GLOO_LAZY_INIT
    operations = results["methods"]["dir://"]["4"]["operations"][0]
    assert 0 < operations["median"] <= operations["max"]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
def test_the_mpi_store_benchmark_runs_at_two_ranks_and_renders(tmp_path):
    from benchmarks import mpi_store

    out = tmp_path / "mpi_store.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.mpi_store",
        "--world-sizes",
        "2",
        "--repetitions",
        "1",
        "--op-world-sizes",
        "2",
        "--ops",
        "3",
        "--op-rounds",
        "1",
        "--out",
        str(out),
    ]
    completed = subprocess.run(
        command, cwd=REPO, env=job_environment(), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    results = json.loads(out.read_text())
    row = results["summary"]["first_barrier"]["2"]
    assert all(row[method]["max_s"] > 0 for method in mpi_store.METHODS)
    assert row["mpi://"]["rendezvous_max_s"] > 0 and set(row["mpi_over"]) == {"env://", "file://", "dir://"}
    operations = results["summary"]["operations"]["2"]["us"]
    assert set(operations) == {"MpiStore", "TCPStore", "FileStore", "DirectoryStore"}
    assert all(stats["median"] > 0 and stats["n"] == 2 * 3 for by_op in operations.values() for stats in by_op.values())
    assert "| 2 | set |" in mpi_store.markdown(results) and "| 2 |" in mpi_store.summary(results)
    assert out.with_suffix(".txt").read_text().startswith("python -m benchmarks.mpi_store")


@pytest.mark.unit
def test_the_committed_scale_results_show_dir_operations_growing_linearly():
    from benchmarks import scale_report

    stored = json.loads((REPO / "benchmarks" / "results" / "rendezvous_scale.json").read_text())
    per_rank = {
        int(size): samples["operations"][0]["median"] / int(size)
        for size, samples in stored["methods"]["dir://"].items()
        if int(size) >= 32
    }
    assert max(per_rank.values()) < 1.5 * min(per_rank.values()), per_rank
    assert "| world size | env:// |" in scale_report.markdown(stored)


@pytest.mark.unit
def test_mpi_markdown_gives_the_completion_routes_and_the_backward_wait():
    from benchmarks import report

    stored = json.loads((REPO / "benchmarks" / "results" / "mpi_allreduce.json").read_text())
    markdown = report._mpi_markdown(stored)
    ours_wait = stored["ddp_backward_tail"]["median_seconds"]["mpi4py backend"]
    assert f"{ours_wait * 1e3:.2f} ms with the mpi4py backend" in markdown
    route_rows = [line for line in markdown.splitlines() if line.startswith("| ") and line.count("µs") == 3]
    assert [row.split(" | ")[0] for row in route_rows] == [
        "| 4 KiB",
        "| 1024 KiB",
        "| 4096 KiB",
        "| 16384 KiB",
        "| 65536 KiB",
    ]
    future_ratio = stored["completion_routes"][0]["time_relative_to_blocking"]["async_op, future (DDP's route)"]
    assert route_rows[0].endswith(f"| {future_ratio:.2f}x |")
