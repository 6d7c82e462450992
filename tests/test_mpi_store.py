"""The ``mpi://`` store (issue 29): ``KeyTable``'s semantics against torch's ``HashStore`` in this process, then
real ``mpirun`` jobs: ``MpiStore`` against ``HashStore`` and ``FileStore`` case by case, across ranks, a rank that
never reaches a wait, and the MPI transport meeting through it without a socket or a file of its own.

The job scripts are tests/mpi/store_*.py; each rank reports to a file of its own (``_setup.RankReport``).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from helpers import OPENMPI_MPIRUN, job_environment, needs_mpi, run_mpi_job

from lightning_dist_hooks import mpi
from lightning_dist_hooks.mpi._key_table import Answer, KeyTable, Request

JOB_TIMEOUT_S = 120  # start-up (torch imported by every rank on 2 cores) takes 3 to 10 s; the jobs run under 15 s
needs_mpi_store = pytest.mark.skipif(
    OPENMPI_MPIRUN is None or not mpi.is_available(),
    reason="needs Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev) and mpi4py (pip install mpi4py)",
)


# --- KeyTable, in this process ------------------------------------------------------------------------------------


_request_ids = itertools.count(1)


def request(source: int, op: str, keys: list[str], args: tuple[Any, ...] = (), timeout_s: float = 10.0) -> Request:
    """A request from rank ``source``, numbered as an asking rank numbers them."""
    return Request(source, next(_request_ids), op, tuple(keys), args, timeout_s)


class TableStore:
    """A ``KeyTable`` answering as a store would, for one asking rank: the result, or the error it would raise."""

    def __init__(self) -> None:
        self.table = KeyTable(rank=0, world_size=1)

    def _one(self, op: str, keys: list[str], *args: Any) -> Any:
        answers = self.table.handle(request(0, op, keys, args), now=0.0)
        assert len(answers) == 1, f"{op} {keys}: {answers}"
        if not answers[0].ok:
            raise (ValueError if answers[0].error_type == "ValueError" else dist.DistStoreError)(answers[0].result)
        return answers[0].result

    def set(self, key: str, value: bytes) -> None:
        self._one("set", [key], value)

    def get(self, key: str) -> bytes:
        return self._one("get", [key])[0]

    def add(self, key: str, amount: int) -> int:
        return self._one("add", [key], amount)

    def append(self, key: str, value: bytes) -> None:
        self._one("append", [key], value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._one("compare_set", [key], expected, desired)

    def delete_key(self, key: str) -> bool:
        return self._one("delete_key", [key])

    def check(self, keys: list[str]) -> bool:
        return self._one("check", keys)

    def num_keys(self) -> int:
        return self._one("num_keys", [])

    def multi_set(self, keys: list[str], values: list[bytes]) -> None:
        self._one("set", keys, *values)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._one("get", keys)

    def list_keys(self) -> list[str]:
        return self._one("list_keys", [])

    def queue_push(self, key: str, value: bytes) -> None:
        self._one("queue_push", [key], value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        answers = self.table.handle(request(0, "queue_pop", [key], (block,)), now=0.0)
        if not answers:
            return "held"  # type: ignore[return-value]  # HashStore would wait here: the sequence avoids it
        if not answers[0].ok:
            raise {"QueueEmptyError": dist.QueueEmptyError}.get(answers[0].error_type, dist.DistStoreError)()
        return answers[0].result

    def queue_len(self, key: str) -> int:
        return self._one("queue_len", [key])


def outcomes(operations: list[Callable[[], Any]]) -> list[Any]:
    """Each operation's result, or the class name of what it raised, in turn."""
    results = []
    for operation in operations:
        try:
            results.append(operation())
        except Exception as error:
            results.append(type(error).__name__)
    return results


def apply_in_turn(store: Any) -> list[Any]:
    """The same operations, each one's result or error class, on ``store`` (HashStore or TableStore)."""
    operations = [
        lambda: store.num_keys(),
        lambda: store.set("a", b"1"),
        lambda: store.get("a"),
        lambda: store.set("a", b"2"),
        lambda: store.get("a"),
        lambda: store.add("n", 5),
        lambda: store.add("n", 0),
        lambda: store.add("n", -8),
        lambda: store.get("n"),
        lambda: store.add("zero", 0),
        lambda: store.get("zero"),
        lambda: store.set("text-number", b"41"),
        lambda: store.add("text-number", 1),
        lambda: store.set("signed", b"-3"),
        lambda: store.add("signed", 1),
        lambda: store.append("log", b"x"),
        lambda: store.append("log", b"\x00y"),
        lambda: store.get("log"),
        lambda: store.compare_set("cas", b"", b"first"),
        lambda: store.get("cas"),
        lambda: store.compare_set("cas", b"first", b"second"),
        lambda: store.compare_set("cas", b"nope", b"third"),
        lambda: store.get("cas"),
        lambda: store.compare_set("absent", b"expected", b"desired"),
        lambda: store.check(["absent"]),
        lambda: store.set("empty", b""),
        lambda: store.compare_set("empty", b"", b"filled"),
        lambda: store.get("empty"),
        lambda: store.delete_key("a"),
        lambda: store.delete_key("a"),
        lambda: store.check(["a"]),
        lambda: store.check(["n", "log"]),
        lambda: store.check(["n", "a"]),
        lambda: store.check([]),
        lambda: store.multi_set(["m1", "m2", "m1"], [b"x", b"y", b"z"]),
        lambda: store.multi_get(["m2", "m1", "n"]),
        lambda: store.multi_get([]),
        lambda: store.set("", b"empty key"),
        lambda: store.set("nul\x00 ünï", b"odd key"),
        lambda: store.multi_get(["nul\x00 ünï", ""]),
        lambda: store.num_keys(),
    ]
    return outcomes(operations)


@pytest.mark.unit
def test_key_table_answers_like_torchs_hash_store() -> None:
    expected = apply_in_turn(dist.HashStore())
    assert apply_in_turn(TableStore()) == expected
    assert expected[-1] == 11 and expected[-2] == [b"odd key", b"empty key"]  # the sequence does what it says


def queue_steps(store: Any) -> list[Any]:
    """Queue operations beside keys of the same names, each one's result or error class."""
    operations = [
        lambda: store.queue_len("q"),
        lambda: store.check(["q"]),
        lambda: store.queue_push("q", b"1"),
        lambda: store.queue_push("q", b"2"),
        lambda: store.check(["q"]),
        lambda: store.queue_len("q"),
        lambda: store.num_keys(),
        lambda: store.list_keys(),
        lambda: store.set("q", b"a key too"),
        lambda: store.queue_pop("q"),
        lambda: store.get("q"),
        lambda: store.delete_key("q"),
        lambda: store.queue_pop("q", False),
        lambda: store.check(["q"]),
        lambda: store.queue_pop("q", False),
        lambda: store.queue_len("q"),
        lambda: store.set("k", b"v"),
        lambda: store.queue_push("k", b"item"),
        lambda: store.delete_key("k"),
        lambda: store.check(["k"]),
        lambda: sorted(store.list_keys()),
    ]
    return outcomes(operations)


@pytest.mark.unit
def test_queues_live_beside_the_keys_as_in_torchs_hash_store() -> None:
    expected = queue_steps(dist.HashStore())
    assert queue_steps(TableStore()) == expected
    assert expected[9] == b"1" and expected[14] == "QueueEmptyError"  # the sequence does what it says


@pytest.mark.unit
def test_a_held_queue_pop_takes_the_item_pushed_later_and_two_held_pops_take_one_each() -> None:
    table = KeyTable(rank=0, world_size=3)
    first, second = request(1, "queue_pop", ["q"], (True,)), request(2, "queue_pop", ["q"], (True,))
    assert table.handle(first, now=0.0) == [] and table.handle(second, now=0.0) == []
    push = request(0, "queue_push", ["q"], (b"x",))
    answers = table.handle(push, now=1.0)
    assert answers == [Answer(0, push.request_id, True, None), Answer(1, first.request_id, True, b"x")]
    push = request(0, "queue_push", ["q"], (b"y",))
    assert table.handle(push, now=2.0)[1:] == [Answer(2, second.request_id, True, b"y")]
    assert table.queues["q"] == deque() and table.held == []


@pytest.mark.unit
def test_add_parses_and_overflows_like_torchs_hash_store() -> None:
    def outcomes(store: Any) -> list[Any]:
        results = []
        for text, amount in [(b"1_0", 1), (b"9223372036854775807", 1), (b"forty", 1)]:
            store.set("n", text)
            try:
                results.append(store.add("n", amount))
            except Exception as error:
                results.append(type(error).__name__)
        return results

    assert outcomes(TableStore()) == outcomes(dist.HashStore()) == [2, -(2**63), "ValueError"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("op", "args", "value"),
    [("set", (b"v",), b"v"), ("add", (5,), b"5"), ("append", (b"ab",), b"ab"), ("multi-set", (), b"k's")],
)
def test_a_held_get_is_answered_by_a_later_change_of_its_key(op: str, args: tuple, value: bytes) -> None:
    table = KeyTable(rank=0, world_size=3)
    held = request(1, "get", ["k"])
    assert table.handle(held, now=0.0) == []
    assert table.handle(request(2, "get", ["other"]), now=0.0) == []
    assert table.next_deadline() == 10.0
    change = request(2, "set", ["x", "k"], (b"x's", b"k's")) if op == "multi-set" else request(2, op, ["k"], args)
    answers = table.handle(change, now=1.0)
    own_result = 5 if op == "add" else None
    assert answers == [Answer(2, change.request_id, True, own_result), Answer(1, held.request_id, True, [value])]
    assert len(table.held) == 1  # the get of "other" still waits
    assert table.expire(now=5.0) == []


@pytest.mark.unit
def test_a_held_wait_for_several_keys_is_answered_once_every_key_is_set() -> None:
    table = KeyTable(rank=0, world_size=2)
    wait = request(1, "wait", ["a", "b", "c"])
    get = request(1, "get", ["c", "a"])
    assert table.handle(wait, now=0.0) == table.handle(get, now=0.0) == []
    assert table.handle(request(0, "compare_set", ["a"], (b"expected", b"x")), now=0.1)[0].result == b"expected"
    assert len(table.held) == 2  # a compare_set that set nothing completes nothing
    answers = table.handle(request(0, "compare_set", ["a"], (b"", b"A")), now=0.2)
    assert answers[1:] == []
    answers = table.handle(request(0, "set", ["b", "c"], (b"B", b"C")), now=0.3)
    assert answers[1:] == [Answer(1, wait.request_id, True, None), Answer(1, get.request_id, True, [b"C", b"A"])]
    assert table.held == [] and table.next_deadline() is None
    # Once set, the keys are there: a wait or get asked now is answered at once.
    answers = table.handle(request(1, "get", ["a", "b"]), now=0.4)
    assert [answer.result for answer in answers] == [[b"A", b"B"]]


@pytest.mark.unit
def test_expire_answers_at_the_deadline_naming_the_keys_the_waiting_ranks_and_the_ranks_never_seen() -> None:
    table = KeyTable(rank=1, world_size=4)
    get = request(0, "get", ["x"], timeout_s=2.0)
    wait = request(2, "wait", ["x", "y"], timeout_s=5.0)
    assert table.handle(get, now=0.0) == table.handle(wait, now=0.0) == []
    table.handle(request(3, "set", ["y"], (b"Y",)), now=1.0)  # rank 3 reached y, not x
    assert table.next_deadline() == 2.0
    assert table.expire(now=1.999) == []
    assert table.expire(now=2.0) == [
        Answer(0, get.request_id, False,
               "Wait timeout: rank 0 waited 2 s for the keys ['x'] of the mpi:// store (kept by rank 1), which no rank "
               "set. Ranks that asked for them: [0, 2]; ranks that never reached them: [1, 3]."),
    ]  # fmt: skip
    assert table.next_deadline() == 5.0
    assert table.expire(now=6.0) == [
        Answer(2, wait.request_id, False,
               "Wait timeout: rank 2 waited 5 s for the keys ['x'] of the mpi:// store (kept by rank 1), which no rank "
               "set. Ranks that asked for them: [0, 2]; ranks that never reached them: [1, 3]."),
    ]  # fmt: skip
    assert table.held == [] and table.next_deadline() is None
    assert table.expire(now=100.0) == []
    late_set = request(3, "set", ["x"], (b"X",))
    assert table.handle(late_set, now=7.0) == [Answer(3, late_set.request_id, True, None)]  # nothing held any more


@pytest.mark.unit
def test_the_timeout_names_every_missing_key_and_every_rank_that_reached_none_of_them() -> None:
    table = KeyTable(rank=0, world_size=3)
    wait = request(0, "wait", ["k2", "k1", "present"], timeout_s=0.5)
    table.handle(request(1, "set", ["present"], (b"",)), now=0.0)
    table.handle(wait, now=0.0)
    table.handle(request(1, "check", ["k1"]), now=0.1)  # a check reaches a key too
    (answer,) = table.expire(now=0.5)
    assert answer.result == (
        "Wait timeout: rank 0 waited 0.5 s for the keys ['k1', 'k2'] of the mpi:// store (kept by rank 0), which no "
        "rank set. Ranks that asked for them: [0, 1]; ranks that never reached them: [1, 2]."
    )
    assert table.not_reached("k1") == [2] and table.not_reached("k2") == [1, 2]
    assert table.not_reached("never asked") == [0, 1, 2]


@pytest.mark.unit
def test_an_unknown_operation_and_an_add_to_text_are_error_answers_that_change_nothing() -> None:
    table = KeyTable(rank=0, world_size=1)
    table.handle(request(0, "set", ["t"], (b"text",)), now=0.0)
    (unknown,) = table.handle(request(0, "rename", ["t"]), now=0.0)
    assert (unknown.ok, unknown.result) == (False, "the mpi:// store has no operation 'rename'")
    (add,) = table.handle(request(0, "add", ["t"], (1,)), now=0.0)
    assert (add.ok, add.result) == (False, "add('t'): the key holds b'text', not an integer")
    assert table.values == {"t": b"text"}


@pytest.mark.unit
def test_a_held_get_waits_again_for_a_key_deleted_before_its_last_key_came() -> None:
    table = KeyTable(rank=0, world_size=2)
    get = request(1, "get", ["a", "b"])
    assert table.handle(get, now=0.0) == []
    table.handle(request(0, "set", ["a"], (b"A",)), now=0.1)
    table.handle(request(0, "delete_key", ["a"]), now=0.2)
    assert table.handle(request(0, "set", ["b"], (b"B",)), now=0.3)[1:] == []  # a is missing again (HashStore waits)
    answers = table.handle(request(0, "set", ["a"], (b"A2",)), now=0.4)
    assert answers[1:] == [Answer(1, get.request_id, True, [b"A2", b"B"])]


# --- mpirun jobs ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParityJob:
    returncode: int
    output: str
    alone: dict[tuple[str, int, str], dict]  # (store, runner, case) -> record
    across: dict[tuple[str, int], dict]  # (store, rank) -> results
    homes: dict[int, dict[str, int]]  # rank -> key -> the rank MpiStore keeps it on

    def cases(self) -> list[str]:
        return [case for (store, runner, case) in self.alone if store == "HashStore"]


@pytest.fixture(scope="module")
def parity_job(tmp_path_factory: pytest.TempPathFactory) -> ParityJob:
    report_dir = tmp_path_factory.mktemp("store-parity")
    job = run_mpi_job("store_parity.py", str(report_dir), timeout_s=JOB_TIMEOUT_S, report_dir=report_dir)
    alone, across, homes = {}, {}, {}
    for rank, lines in job.reports.items():
        for line in lines:
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record["phase"] == "alone":
                alone[record["store"], record["runner"], record["case"]] = record
            elif record["phase"] == "across":
                across[record["store"], rank] = record["results"]
            else:
                homes[rank] = record["keys"]
    return ParityJob(job.returncode, job.output, alone, across, homes)


# FileStore's own departures from HashStore (torch 2.13's): delete_key answers True for an absent key, and num_keys
# counts a key of its own. MpiStore is compared with HashStore alone on these.
FILE_STORE_DIFFERS = {"delete_key_absent", "num_keys"}


def differences(job: ParityJob, case: str, runner: int) -> list[str]:
    """How MpiStore's record of ``case`` (run by ``runner``) differs from HashStore's and FileStore's."""
    hash_store = job.alone["HashStore", 0, case]
    file_store = job.alone["FileStore", 1, case]
    mpi_store = job.alone["MpiStore", runner, case]
    found = []
    if mpi_store["steps"] != hash_store["steps"]:
        found.append(f"{case} (rank {runner}): MpiStore {mpi_store['steps']} != HashStore {hash_store['steps']}")
    mpi_errors = [error["type"] for error in mpi_store["errors"]]
    if mpi_errors != [error["type"] for error in hash_store["errors"]]:
        found.append(f"{case} (rank {runner}): MpiStore raised {mpi_errors}, HashStore {hash_store['errors']}")
    if case not in FILE_STORE_DIFFERS and mpi_store["steps"] != file_store["steps"]:
        found.append(f"{case} (rank {runner}): MpiStore {mpi_store['steps']} != FileStore {file_store['steps']}")
    return found


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
def test_mpi_store_answers_every_case_as_hash_store_and_file_store(parity_job: ParityJob) -> None:
    assert parity_job.returncode == 0, parity_job.output[-6000:]
    cases = parity_job.cases()
    assert len(cases) == 27 and set(cases) >= FILE_STORE_DIFFERS
    assert {runner for (store, runner, _) in parity_job.alone if store == "MpiStore"} == {0, 1}
    found = [difference for case in cases for runner in (0, 1) for difference in differences(parity_job, case, runner)]
    assert not found, "\n".join(found)
    # The cases do what they are named for (HashStore is torch's reference).
    steps = {case: parity_job.alone["HashStore", 0, case]["steps"] for case in cases}
    assert steps["set_get"][2:] == [["ok", {"bytes": "on rank 0"}], ["ok", {"bytes": "on rank 1"}]]
    assert steps["add"][:4] == [["ok", 5], ["ok", 5], ["ok", -2], ["ok", {"bytes": "-2"}]]
    assert steps["compare_set_missing_key_something_expected"][:2] == [["ok", {"bytes": "expected"}], ["ok", False]]
    assert steps["delete_key_absent"] == [["ok", False]] * 2
    assert steps["odd_keys"][-3:] == [["ok", True], ["ok", True], ["ok", False]]
    assert steps["num_keys"] == [["ok", 47]]
    for case in ("get_missing_times_out", "wait_with_timeout_times_out", "multi_get_with_a_missing_key_times_out"):
        assert ["error", "timeout"] in steps[case], case


# Every timeout step of the cases: (case, seconds it must take, a pattern of the key it names).
MPI_STORE_TIMEOUTS = [
    ("get_missing_times_out", 1.0, r"missing#\d+"),
    ("get_missing_times_out", 0.5, r"missing#\d+"),
    ("wait_with_timeout_times_out", 0.3, r"wait-missing#\d+"),
    ("wait_with_timeout_times_out", 0.3, r"wait-missing#\d+"),
    ("wait_without_timeout_times_out", 0.5, r"wait-store-timeout#\d+"),
    ("wait_for_keys_partly_set_times_out", 0.3, r"wait-partly#\d+"),
    ("multi_get_with_a_missing_key_times_out", 0.5, r"multi-missing#\d+"),
]
TIMEOUT_MARGIN_S = 1.0  # the home answers at its deadline; polling and a loaded 2-core machine add a little


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
def test_mpi_store_times_out_after_the_timeout_naming_the_key_and_who_waited(parity_job: ParityJob) -> None:
    assert parity_job.returncode == 0, parity_job.output[-6000:]
    for runner in (0, 1):
        errors = [
            error
            for case in dict.fromkeys(case for case, _, _ in MPI_STORE_TIMEOUTS)
            for error in parity_job.alone["MpiStore", runner, case]["errors"]
        ]
        assert len(errors) == len(MPI_STORE_TIMEOUTS)
        for error, (case, seconds, key) in zip(errors, MPI_STORE_TIMEOUTS, strict=True):
            assert error["type"] == "DistStoreError", (case, error)
            assert seconds <= error["seconds"] <= seconds + TIMEOUT_MARGIN_S, (case, error)
            assert re.fullmatch(
                rf"Wait timeout: rank {runner} waited {seconds:g} s for the keys \['{key}'\] of the mpi:// store "
                rf"\(kept by rank [01]\), which no rank set\. Ranks that asked for them: \[{runner}\]; ranks that "
                rf"never reached them: \[{1 - runner}\]\.",
                error["message"],
            ), (case, error)
    # HashStore raises the same class (FileStore a RuntimeError, torch's own difference).
    hash_errors = parity_job.alone["HashStore", 0, "get_missing_times_out"]["errors"]
    assert [error["type"] for error in hash_errors] == ["DistStoreError", "DistStoreError"]


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
def test_mpi_store_keeps_each_key_on_the_rank_crc32_names(parity_job: ParityJob) -> None:
    assert parity_job.returncode == 0, parity_job.output[-6000:]
    # The job's first key that crc32 % 2 puts on rank 0, then on rank 1: MpiStore.home_of on each rank.
    assert parity_job.homes[0] == parity_job.homes[1]
    assert list(parity_job.homes[0].values()) == [0, 1]


ACROSS_ADDS = 100


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
@pytest.mark.parametrize("store", ["FileStore", "MpiStore"])
def test_two_ranks_share_one_store(parity_job: ParityJob, store: str) -> None:
    assert parity_job.returncode == 0, parity_job.output[-6000:]
    ranks = {rank: parity_job.across[store, rank] for rank in (0, 1)}
    rank0 = ranks[0]
    # A get and a wait for keys rank 1 sets 0.3 s later return then, with its values.
    assert rank0["get of a key rank 1 sets later"]["step"] == ["ok", {"bytes": "set late by rank 1"}]
    assert 0.25 <= rank0["get of a key rank 1 sets later"]["seconds"] <= 0.3 + TIMEOUT_MARGIN_S
    assert rank0["wait for keys rank 1 sets later"]["step"] == ["ok", None]
    assert 0.25 <= rank0["wait for keys rank 1 sets later"]["seconds"] <= 0.3 + TIMEOUT_MARGIN_S
    assert rank0["multi_get of them"]["step"] == ["ok", [{"bytes": "two"}, {"bytes": "one"}]]
    # Concurrent adds: every total from 1 to 2N returned exactly once, in increasing order on each rank.
    returned = {rank: results["add returns"] for rank, results in ranks.items()}
    assert sorted(returned[0] + returned[1]) == list(range(1, 2 * ACROSS_ADDS + 1))
    assert all(values == sorted(values) and len(values) == ACROSS_ADDS for values in returned.values())
    assert ranks[0]["add total"] == ranks[1]["add total"] == 2 * ACROSS_ADDS
    # Concurrent appends: nothing lost. (Not FileStore's: torch 2.13's loses all but about one of one process's
    # appends when two processes append to one key, tests/mpi/store_parity.py's job and two plain processes alike.)
    log = ranks[0]["append total"]
    assert log == ranks[1]["append total"]
    if store == "MpiStore":
        assert sorted(log) == ["0"] * ACROSS_ADDS + ["1"] * ACROSS_ADDS
    # compare_set race: one winner, which both see.
    holder = ranks[0]["lock holder"]
    assert holder in ("rank 0", "rank 1") and ranks[1]["lock holder"] == holder
    assert ranks[0]["compare_set race"] == ranks[1]["compare_set race"] == holder
    # A delete by rank 1 of a key rank 0 set, seen by both.
    assert ranks[1]["delete of rank 0's key"] is True
    assert ranks[0]["check after the delete"] is ranks[1]["check after the delete"] is False
    assert ranks[0]["num_keys"] == ranks[1]["num_keys"]
    never = rank0["wait for a key rank 1 never reaches"]
    assert never["step"] == ["error", "timeout"] and never["seconds"] >= 0.3
    if store == "MpiStore":
        assert ranks[0]["num_keys"] == 6  # late x3, counter, log, lock (the deleted key is gone)
        assert never["seconds"] <= 0.3 + TIMEOUT_MARGIN_S
        assert re.fullmatch(
            r"Wait timeout: rank 0 waited 0\.3 s for the keys \['across-never#\d+'\] of the mpi:// store \(kept by "
            r"rank 1\), which no rank set\. Ranks that asked for them: \[0\]; ranks that never reached them: \[1\]\.",
            never["errors"][0]["message"],
        ), never


GROUP_TIMEOUT_S = 5


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
def test_a_rank_that_never_reaches_a_store_wait_is_named_and_the_job_ends_after_the_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    job = run_mpi_job(
        "store_missing_rank.py",
        str(tmp_path),
        str(GROUP_TIMEOUT_S),
        ranks=3,
        timeout_s=JOB_TIMEOUT_S,
        report_dir=tmp_path,
    )
    ended, job_seconds = time.time(), time.monotonic() - started
    returncode, output, reports = job.returncode, job.output, job.reports
    assert returncode != 0, output[-6000:]
    assert job_seconds < 60, output[-6000:]
    assert reports[2] == ["rank 2: default group all-reduce 6", "rank 2: sleeping"], output[-6000:]
    reported_the_group_timeout = []
    for rank in (0, 1):
        lines = reports[rank]
        assert lines[0] == f"rank {rank}: default group all-reduce 6", output[-6000:]
        waited = re.fullmatch(
            rf"rank {rank}: store wait failed after ([\d.]+) s: DistStoreError: Wait timeout: rank {rank} waited 2 s "
            r"for the keys \['default_pg/[^']*never-set'\] of the mpi:// store \(kept by rank [012]\), which no rank "
            r"set\. Ranks that asked for them: \[(0, 1|0|1)\]; ranks that never reached them: \[2\]\.",
            lines[1],
        )
        assert waited and 2.0 <= float(waited.group(1)) <= 2.0 + TIMEOUT_MARGIN_S, lines
        since = re.fullmatch(rf"rank {rank}: new_group since ([\d.]+)", lines[2])
        assert since, lines
        # The unhandled error ends the job with MPI_Abort, soon after the timeout (rank 2 sleeps 120 s).
        assert GROUP_TIMEOUT_S <= ended - float(since.group(1)) <= GROUP_TIMEOUT_S + 15, output[-6000:]
        # The first rank to time out aborts the job, which may end the other before its own timeout, a moment later
        # (on a loaded machine): then its report stops here. No rank may report "completed".
        assert len(lines) in (3, 4), lines
        if len(lines) == 3:
            continue
        # gloo's rendezvous waits in the store for rank 2's address; the store names rank 2 at the group timeout.
        failed = re.fullmatch(
            rf"rank {rank}: new_group failed after ([\d.]+) s: DistStoreError: Wait timeout: rank {rank} waited "
            rf"{GROUP_TIMEOUT_S} s for the keys \['[^']*/2'\] of the mpi:// store \(kept by rank [012]\), which no "
            r"rank set\. Ranks that asked for them: \[(0, 1|0|1)\]; ranks that never reached them: \[2\]\.",
            lines[3],
        )
        assert failed and GROUP_TIMEOUT_S <= float(failed.group(1)) <= GROUP_TIMEOUT_S + TIMEOUT_MARGIN_S, lines
        reported_the_group_timeout.append(rank)
    assert reported_the_group_timeout, f"the rank whose timeout ended the job reports it: {reports}"
    assert "ended with an unhandled exception: DistStoreError: Wait timeout" in output, output[-6000:]
    assert "MPI_ABORT was invoked" in output, output[-6000:]


@dataclass(frozen=True)
class TransportJob:
    returncode: int
    output: str
    listening: dict[int, set[int]]  # rank -> TCP ports it listened on after init_process_group and the store's use
    records: dict[int, dict]
    tmp_dir: Path
    cwd: Path


@pytest.fixture(scope="module")
def transport_job(tmp_path_factory: pytest.TempPathFactory) -> TransportJob:
    """store_mpi_transport.py with a fresh TMPDIR and working directory, paused once the store was used."""
    base = tmp_path_factory.mktemp("store-transport")
    report_dir, pause_dir, tmp_dir, cwd = (base / name for name in ("reports", "pause", "tmp", "cwd"))
    for directory in (report_dir, pause_dir, tmp_dir, cwd):
        directory.mkdir()
    job = run_mpi_job(
        "store_mpi_transport.py",
        str(report_dir),
        str(pause_dir),
        timeout_s=JOB_TIMEOUT_S,
        cwd=cwd,
        env=job_environment(TMPDIR=str(tmp_dir)),
        report_dir=report_dir,
        pause_dir=pause_dir,
    )
    records = {rank: json.loads(lines[-1]) for rank, lines in job.reports.items() if lines}
    return TransportJob(job.returncode, job.output, job.listening, records, tmp_dir, cwd)


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
def test_the_mpi_transport_meets_through_mpi_store_without_a_socket_or_a_file(transport_job: TransportJob) -> None:
    job = transport_job
    assert job.returncode == 0, job.output[-6000:]
    assert job.listening == {0: set(), 1: set()}
    for rank, record in job.records.items():
        assert record["store"]["other"] == f"hello from {1 - rank}"
        assert record["store"]["counter"] == 3 and record["store"]["added"] in (rank + 1, 3)
        # init_process_group and the store's operations opened no descriptor at all and closed none of MPI's...
        assert record["files_opened"] == {} and record["files_closed"] == [], record
        # ...of which none is a file under the temporary or the working directory: pipes, eventfds, a socket to
        # Open MPI's daemon, its shared-memory file, the terminal or /dev/null.
        for fd, target in record["files_before"].items():
            assert re.fullmatch(
                r"(pipe|socket|anon_inode):\[\w+\]|/dev/(shm/open_mpi\.\d+ \(deleted\)|pts/\d+|null)", target
            ), (rank, fd, target)
        # Nothing appeared or went under them (Open MPI's session directory, made before, is all there is).
        assert record["roots"] == [str(job.tmp_dir), str(job.cwd)]
        assert record["paths_added"] == record["paths_removed"] == []
        assert all(path.startswith(f"{job.tmp_dir}/ompi.") for path in record["paths_before"]), record
    assert sorted(job.records) == [0, 1], job.output[-6000:]
    assert not list(job.cwd.iterdir()) and not list(job.tmp_dir.iterdir())  # and Open MPI removed its own


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
def test_gloo_subgroups_and_a_device_mesh_form_on_the_mpi_transports_store(transport_job: TransportJob) -> None:
    assert transport_job.returncode == 0, transport_job.output[-6000:]
    assert sorted(transport_job.records) == [0, 1]
    for record in transport_job.records.values():
        assert record["default_backend"] == mpi.BACKEND_NAME and record["default_all_reduce"] == [3.0]
        assert record["gloo_backend"] == "gloo" and record["gloo_all_reduce"] == [3.0, 30.0]
        assert record["mesh_size"] == 2 and record["mesh_all_reduce"] == [3, 300]
        assert record["mesh_backend"] == mpi.BACKEND_NAME  # a 1-D mesh of the world uses the default group
