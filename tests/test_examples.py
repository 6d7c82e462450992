"""Each example runs as a user would run it, on 2 real CPU processes, and prints what it proves."""

from __future__ import annotations

import os
import re
import sys

import pytest

from helpers import REPO, job_environment, run_command

pytestmark = pytest.mark.slow


def run_example(name: str, tmp_path, *args: str):
    command = [sys.executable, str(REPO / "examples" / name), *args]
    return run_command(command, cwd=tmp_path, out_dir=tmp_path / "none", timeout=240, env=job_environment())


def test_file_rendezvous_example_trains_equal_weights_and_cleans_up(tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir()
    result = run_example("ddp_file_rendezvous.py", tmp_path, "--rendezvous-dir", str(rendezvous_dir)).assert_ok()
    assert (f"ranks=2 backend=gloo init_method=file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/rendezvous "
            "weights_equal_on_all_ranks=True") in result.output
    assert float(re.search(r"final_loss=([\d.]+)", result.output).group(1)) < 0.2
    assert list(rendezvous_dir.iterdir()) == []


def test_custom_setup_hook_example_builds_its_own_store(tmp_path):
    result = run_example("custom_setup_hook.py", tmp_path).assert_ok()
    for rank in (0, 1):
        assert f"rank {rank}: built the gloo group on a hand-made FileStore (given init_method=env://)" in result.output
    assert "all_reduce over 2 ranks gave 3" in result.output


def test_balanced_sampler_example_balances_classes_across_ranks(tmp_path):
    result = run_example("balanced_sampler.py", tmp_path).assert_ok()
    counts = re.search(r"class counts over 2 ranks: \[(\d+), (\d+)\] \(class 1 share ([\d.]+)", result.output)
    assert counts, result.output[-3000:]
    assert int(counts.group(1)) + int(counts.group(2)) == 2000  # 2 epochs x 1000 draws, split across the ranks
    assert 0.4 < float(counts.group(3)) < 0.6


def test_lightning_package_example_trains_with_the_unified_package(tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir()
    result = run_example("lightning_package.py", tmp_path, "--rendezvous-dir", str(rendezvous_dir)).assert_ok()
    assert re.search(rf"package=lightning ranks=2 backend=gloo init_method=file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/"
                     r"ldh-rendezvous-\S+ weights_equal_on_all_ranks=True", result.output), result.output[-3000:]
    assert list(rendezvous_dir.iterdir()) == []


def test_fabric_example_uses_its_hook_its_sampler_and_a_per_launch_file(tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir()
    result = run_example("fabric_custom_sampler.py", tmp_path, "--rendezvous-dir", str(rendezvous_dir)).assert_ok()
    for rank in (0, 1):
        assert re.search(rf"rank {rank}: init_process_group\('gloo', 'file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/ldh-rendezvous-\S+', "
                         r"world_size=2\)", result.output), result.output[-3000:]
    # 256 samples per epoch in all: each rank read its own half, through the sampler the example built.
    assert re.search(r"fabric ranks=2 backend=gloo .* samples_per_epoch=256 weights_equal_on_all_ranks=True",
                     result.output)
    assert list(rendezvous_dir.iterdir()) == []


def test_lightning_cli_example_takes_our_flags_as_trainer_options(tmp_path):
    rendezvous_dir = tmp_path / "shared"
    rendezvous_dir.mkdir()
    result = run_example("lightning_cli.py", tmp_path, "fit", "--trainer.accelerator=cpu", "--trainer.devices=2",
                         "--trainer.strategy=ddp", "--trainer.max_epochs=2", "--trainer.logger=false",
                         "--trainer.torch_dist_backend=gloo",
                         f"--trainer.torch_dist_init_method=file://{rendezvous_dir}/").assert_ok()
    assert re.search(rf"cli ranks=2 backend=gloo init_method=file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/"
                     r"ldh-rendezvous-", result.output)
    assert list(rendezvous_dir.iterdir()) == []
