"""The flags and ``setup_distributed_backend`` really create the process group, on 2 real ranks."""

from __future__ import annotations

import pytest

from helpers import job_environment


def test_file_rendezvous_uses_the_file_privately_needs_no_master_port_and_removes_it(run_job, tmp_path, busy_port):
    rendezvous = tmp_path / "rendezvous"
    # MASTER_PORT points at a port held by this test: a TCP store there could neither bind nor talk to it.
    env = job_environment(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(busy_port))
    result = run_job("--backend", "gloo", "--init-method", f"file://{rendezvous}", "--setup-hook", "record", env=env)
    result.assert_ok()
    assert sorted(result.ranks) == [0, 1]
    for rank, record in result.ranks.items():
        assert record["store"][-1] == "FileStore" and "TCPStore" not in record["store"]
        (call,) = record["setup_calls"]
        assert call["rendezvous_file_mode"] == "0o600"
        assert (call["rank"], call["world_size"]) == (rank, 2)
    assert result.same_on_all_ranks("weights_sha256")
    assert not rendezvous.exists()


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_setup_hook_runs_once_per_rank_with_the_resolved_values(run_job, tmp_path, strategy):
    init_method = f"file://{tmp_path}/rendezvous"
    result = run_job("--strategy", strategy, "--backend", "GLOO", "--init-method", init_method,
                     "--setup-hook", "record").assert_ok()
    for rank, record in result.ranks.items():
        assert record["setup_calls"] == [{
            "backend": "gloo", "init_method": init_method, "rank": rank, "world_size": 2, "timeout_s": 1800.0,
            "initialized_before": False, "rendezvous_file_mode": "0o600",
        }]
        assert record["process_group_backend"] == "gloo"
    assert result.same_on_all_ranks("weights_sha256")
    assert not (tmp_path / "rendezvous").exists()


def test_setup_hook_alone_gets_lightnings_defaults_and_the_strategy_settings(run_job):
    result = run_job("--strategy", "ddp-instance", "--timeout", "42", "--setup-hook", "record").assert_ok()
    for rank, record in result.ranks.items():
        (call,) = record["setup_calls"]
        assert (call["backend"], call["init_method"], call["timeout_s"]) == ("gloo", "env://", 42.0)
        assert record["strategy_kwargs"] == {"find_unused_parameters": True}
        assert record["store"][-1] == "TCPStore"


def test_tcp_init_method_on_loopback(run_job, free_port):
    result = run_job("--backend", "gloo", "--init-method", f"tcp://127.0.0.1:{free_port}", "--setup-hook", "record")
    result.assert_ok()
    for record in result.ranks.values():
        assert record["setup_calls"][0]["init_method"] == f"tcp://127.0.0.1:{free_port}"
        assert record["store"][-1] == "TCPStore"
    assert result.same_on_all_ranks("weights_sha256")


def test_hand_built_store_in_the_hook(run_job, tmp_path):
    store_file = tmp_path / "hand-built-store"
    result = run_job("--setup-hook", "hand-store", "--hand-store", str(store_file)).assert_ok()
    for record in result.ranks.values():
        assert record["store"][-1] == "FileStore" and record["setup_calls"][0]["init_method"] == "env://"
    assert result.same_on_all_ranks("weights_sha256")


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_true"])
def test_every_ddp_registered_name_takes_the_flags(run_job, tmp_path, strategy):
    rendezvous = tmp_path / "rendezvous"
    result = run_job("--strategy", strategy, "--backend", "gloo", "--init-method", f"file://{rendezvous}",
                     "--setup-hook", "record", "--stages", "fit").assert_ok()
    for rank, record in result.ranks.items():
        assert record["setup_calls"][0]["rank"] == rank and record["store"][-1] == "FileStore"
    if strategy == "ddp_find_unused_parameters_true":
        assert result.ranks[0]["strategy_kwargs"] == {"find_unused_parameters": True}
    assert not rendezvous.exists()


def test_model_parallel_strategy_takes_the_flags(run_job, tmp_path):
    result = run_job("--strategy", "model_parallel", "--backend", "gloo", "--init-method", f"file://{tmp_path}/r",
                     "--setup-hook", "record", "--epochs", "1").assert_ok()
    assert result.same_on_all_ranks("strategy") == "ModelParallelStrategy"
    for rank, record in result.ranks.items():
        assert record["setup_calls"][0]["rank"] == rank and record["store"][-1] == "FileStore"


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("no-group", "setup_distributed_backend returned on rank 0 without creating the default process group"),
        ("wrong-world", "setup_distributed_backend created a process group with rank 0 and world size 1, but this "
                        "Trainer expects rank 0 and world size 2"),
    ],
)
def test_a_hook_that_leaves_no_proper_group_is_named_in_the_error(run_job, hook, message):
    result = run_job("--setup-hook", hook, "--devices", "2", timeout=120)
    assert result.returncode != 0
    assert "DistributedSetupError" in result.output and message in result.output


# A hook that raises on one rank: tests/test_faults.py (message, exit code, time bound, nothing left).
