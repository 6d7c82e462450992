"""The flags and ``setup_distributed_backend`` really create the process group, on 2 real ranks; first, in this
process, the checks that judge what the hook left and what torch's errors say."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from helpers import Rank, job_environment

from lightning_dist_hooks.init_methods import FileInitMethod, Rendezvous, init_method_handler
from lightning_dist_hooks.process_group.create import (
    DistributedSetupError,
    _is_rendezvous_timeout,
    check_default_group,
)


def _missing_ranks(rendezvous, world_size, error):
    # What the timeout message asks the rendezvous's own handler (issue 13: no per-scheme code in process_group).
    return init_method_handler(rendezvous.init_method).missing_ranks(rendezvous, world_size, error)


@pytest.fixture
def default_group():
    """``init()`` makes a one-rank gloo default group on an in-process HashStore; destroyed afterwards."""

    def init(rank: int = 0, world_size: int = 1) -> None:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=rank, world_size=world_size)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.unit
def test_check_default_group_accepts_the_group_the_trainer_expects(default_group):
    default_group()
    check_default_group(rank=0, world_size=1)


@pytest.mark.unit
def test_check_default_group_names_a_missing_group():
    assert not dist.is_initialized()
    with pytest.raises(
        DistributedSetupError,
        match=r"setup_distributed_backend returned on rank 3 without creating "
        r"the default process group. Call "
        r"torch.distributed.init_process_group",
    ):
        check_default_group(rank=3, world_size=4)


@pytest.mark.unit
def test_check_default_group_names_a_group_of_the_wrong_shape(default_group):
    default_group()
    with pytest.raises(
        DistributedSetupError,
        match=r"created a process group with rank 0 and world size 1, but this "
        r"Trainer expects rank 0 and world size 2",
    ):
        check_default_group(rank=0, world_size=2)


def _raised(action) -> Exception:
    try:
        action()
    except Exception as error:  # torch raises RuntimeError or its own DistError subclasses
        return error
    raise AssertionError("expected torch to raise")


# torch's own timeout errors, made by torch here (each takes about a second, torch's smallest wait), so that a
# change of wording in a torch release fails these tests instead of silently turning timeouts into plain errors.
def _file_store_timeout(tmp_path: Path) -> Exception:  # file://: gloo waits for the peers' keys in the FileStore
    store = dist.FileStore(str(tmp_path / "store"), 2)
    return _raised(lambda: store.wait(["rank1"], timedelta(milliseconds=100)))


def _tcp_server_timeout(tmp_path: Path) -> Exception:  # tcp:// and env:// on rank 0: the store counts its clients
    return _raised(
        lambda: dist.TCPStore(
            "127.0.0.1", 0, world_size=3, is_master=True, wait_for_workers=True, timeout=timedelta(milliseconds=100)
        )
    )


@pytest.mark.unit
def test_torchs_timeout_wording_is_recognised_and_its_client_count_read(tmp_path):
    file_error, tcp_error = _file_store_timeout(tmp_path), _tcp_server_timeout(tmp_path)
    assert str(file_error) == "Wait timeout"
    assert re.fullmatch(r"Timed out after \d+ seconds waiting for clients. 1/3 clients joined.", str(tcp_error))
    timeout = timedelta(seconds=10)
    for error in (file_error, tcp_error):
        assert _is_rendezvous_timeout(error, elapsed_s=10.0, timeout=timeout)
        # The same words long before the timeout come from somewhere else (a user's hook, a server it called).
        assert not _is_rendezvous_timeout(error, elapsed_s=1.0, timeout=timeout)
    assert not _is_rendezvous_timeout(RuntimeError("Connection refused"), elapsed_s=10.0, timeout=timeout)
    assert _missing_ranks(Rendezvous("tcp://127.0.0.1:1"), 3, tcp_error) == "ranks that never arrived: [1, 2]"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Timed out after 15 seconds waiting for clients. 1/4 clients joined.", "ranks that never arrived: [1, 2, 3]"),
        (
            "Timed out after 15 seconds waiting for clients. 3/4 clients joined.",
            "1 of 4 ranks never arrived (a TCP rendezvous does not say which)",
        ),
        (
            "The client socket has timed out after 15000ms while trying to connect to (127.0.0.1, 29500).",
            "which ranks are missing cannot be known from this rank",
        ),
    ],
)
def test_missing_ranks_from_a_tcp_rendezvous(message, expected):
    assert _missing_ranks(Rendezvous("env://"), 4, RuntimeError(message)) == expected


@pytest.mark.slow  # the rendezvous file's janitor is a process
def test_missing_ranks_from_a_file_rendezvous_are_the_ranks_without_a_claim(tmp_path):
    url = f"file://{tmp_path}/rendezvous"
    claimed = [FileInitMethod().prepare(url, Rank(rank)) for rank in (0, 2)]
    assert _missing_ranks(claimed[0], 4, RuntimeError("Wait timeout")) == "ranks that never arrived: [1, 3]"


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_setup_hook_runs_once_per_rank_with_the_resolved_values(run_job, tmp_path, strategy):
    init_method = f"file://{tmp_path}/rendezvous"
    result = run_job(
        "--strategy", strategy, "--backend", "GLOO", "--init-method", init_method, "--setup-hook", "record"
    ).assert_ok()
    used = f"file://{tmp_path}/ldh-uid-{os.geteuid()}/rendezvous"  # inside the per-user directory (issue 9)
    for rank, record in result.ranks.items():
        assert record["setup_calls"] == [
            {
                "backend": "gloo",
                "init_method": used,
                "rank": rank,
                "world_size": 2,
                "timeout_s": 1800.0,
                "initialized_before": False,
                "device_id": None,
                "rendezvous_file_mode": "0o600",  # CPU: no device
            }
        ]
        assert record["process_group_backend"] == "gloo"
    assert result.same_on_all_ranks("weights_sha256")
    assert not (tmp_path / "rendezvous").exists() and not (tmp_path / f"ldh-uid-{os.geteuid()}").exists()


@pytest.mark.slow
def test_setup_hook_alone_gets_lightnings_defaults_and_the_strategy_settings(run_job):
    result = run_job("--strategy", "ddp-instance", "--timeout", "42", "--setup-hook", "record").assert_ok()
    for record in result.ranks.values():
        (call,) = record["setup_calls"]
        assert (call["backend"], call["init_method"], call["timeout_s"]) == ("gloo", "env://", 42.0)
        assert record["strategy_kwargs"] == {"find_unused_parameters": True}
        assert record["store"][-1] == "TCPStore"


@pytest.mark.slow
def test_tcp_init_method_on_loopback(run_job, free_port):
    result = run_job("--backend", "gloo", "--init-method", f"tcp://127.0.0.1:{free_port}", "--setup-hook", "record")
    result.assert_ok()
    for record in result.ranks.values():
        assert record["setup_calls"][0]["init_method"] == f"tcp://127.0.0.1:{free_port}"
        assert record["store"][-1] == "TCPStore"
    assert result.same_on_all_ranks("weights_sha256")


@pytest.mark.slow
def test_hand_built_store_in_the_hook(run_job, tmp_path):
    store_file = tmp_path / "hand-built-store"
    result = run_job("--setup-hook", "hand-store", "--hand-store", str(store_file)).assert_ok()
    for record in result.ranks.values():
        assert record["store"][-1] == "FileStore" and record["setup_calls"][0]["init_method"] == "env://"
    assert result.same_on_all_ranks("weights_sha256")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_true"])
def test_every_ddp_registered_name_takes_the_flags(run_job, tmp_path, strategy):
    rendezvous = tmp_path / "rendezvous"
    result = run_job(
        "--strategy",
        strategy,
        "--backend",
        "gloo",
        "--init-method",
        f"file://{rendezvous}",
        "--setup-hook",
        "record",
        "--stages",
        "fit",
    ).assert_ok()
    for rank, record in result.ranks.items():
        assert record["setup_calls"][0]["rank"] == rank and record["store"][-1] == "FileStore"
    if strategy == "ddp_find_unused_parameters_true":
        assert result.ranks[0]["strategy_kwargs"] == {"find_unused_parameters": True}
    assert not rendezvous.exists()


@pytest.mark.slow
def test_model_parallel_strategy_takes_the_flags(run_job, tmp_path):
    result = run_job(
        "--strategy",
        "model_parallel",
        "--backend",
        "gloo",
        "--init-method",
        f"file://{tmp_path}/r",
        "--setup-hook",
        "record",
        "--epochs",
        "1",
    ).assert_ok()
    assert result.same_on_all_ranks("strategy") == "ModelParallelStrategy"
    for rank, record in result.ranks.items():
        assert record["setup_calls"][0]["rank"] == rank and record["store"][-1] == "FileStore"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("no-group", "setup_distributed_backend returned on rank 0 without creating the default process group"),
        (
            "wrong-world",
            (
                "setup_distributed_backend created a process group with rank 0 and world size 1, but this "
                "Trainer expects rank 0 and world size 2"
            ),
        ),
    ],
)
def test_a_hook_that_leaves_no_proper_group_is_named_in_the_error(run_job, hook, message):
    result = run_job("--setup-hook", hook, "--devices", "2", timeout=120)
    assert result.returncode != 0
    assert "DistributedSetupError" in result.output and message in result.output


# A hook that raises on one rank: tests/test_faults.py (message, exit code, time bound, nothing left).
