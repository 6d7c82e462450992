"""``configure_sampler`` decides every loader's sampler, on 2 real ranks."""

from __future__ import annotations

import json

import pytest
from helpers import both_packages

pytestmark = pytest.mark.slow

DATASET = list(range(24))


@both_packages
def test_custom_sampler_gives_each_rank_exactly_its_indices_in_every_stage(run_job, package):
    result = run_job(
        "--package", package.name, "--sampler-hook", "custom", "--stages", "fit,test,predict", "--epochs", "2"
    ).assert_ok()
    for rank, record in result.ranks.items():
        mine = list(range(rank, 24, 3))
        assert record["seen"]["train"] == mine * 2
        assert record["seen"]["test"] == mine and record["seen"]["predict"] == mine
        # the validation loader is prepared once, for the sanity check, and reused by both epochs
        assert record["seen"]["validate"] == mine[:4] + mine * 2
        assert record["sampler_calls"] == ["validate", "train", "test", "predict"]
    assert result.same_on_all_ranks("weights_sha256")


def test_returning_none_keeps_the_loader_so_every_rank_sees_the_whole_dataset(run_job):
    result = run_job("--sampler-hook", "keep", "--stages", "fit,test", "--epochs", "2").assert_ok()
    for record in result.ranks.values():
        train = record["seen"]["train"]
        assert sorted(train[:24]) == DATASET and sorted(train[24:]) == DATASET  # shuffled, but all of it
        assert record["seen"]["test"] == DATASET


def test_default_via_super_equals_lightnings_split(run_job):
    theirs = run_job("--trainer", "pl", "--stages", "fit,predict").assert_ok()
    ours = run_job("--sampler-hook", "super", "--stages", "fit,predict").assert_ok()
    for rank in (0, 1):
        assert ours.ranks[rank]["seen"] == theirs.ranks[rank]["seen"]
        assert ours.ranks[rank]["sampler_calls"] == ["validate", "train", "predict"]
    assert ours.ranks[0]["weights_sha256"] == theirs.ranks[0]["weights_sha256"]
    assert set(ours.ranks[0]["seen"]["train"][:12]).isdisjoint(ours.ranks[1]["seen"]["train"][:12])  # one epoch each


def test_a_datamodule_hook_wins_over_the_modules(run_job):
    result = run_job("--sampler-hook", "custom", "--datamodule", "--epochs", "1").assert_ok()
    for rank, record in result.ranks.items():
        assert record["sampler_calls"] == []  # the module's hook was never asked
        datamodule_calls = json.loads((result.out_dir / f"datamodule-rank{rank}.json").read_text())
        assert datamodule_calls == ["train"]
        assert record["seen"]["train"] == DATASET  # the datamodule returned None: loader as given, unsplit
