"""``python -m benchmarks --quick`` still runs end to end and writes sane results (the full run is done by hand)."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import REPO, job_environment

EXPECTED_VARIANTS = {"raw_ddp", "pytorch_lightning", "ours_default", "ours_file", "ours_hooks"}


def test_quick_benchmarks_write_json_markdown_and_plots(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)], cwd=REPO,
                               env=job_environment(), capture_output=True, text=True, timeout=420,
                               stdin=subprocess.DEVNULL)
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
    assert set(latency) == {"env://", "tcp://", "file://"}
    assert all(stats["median"] > 0 for by_size in latency.values() for stats in by_size.values())

    assert (tmp_path / "results.md").read_text().startswith("Machine:")
    for plot in ("step_overhead.png", "startup.png", "bootstrap.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
