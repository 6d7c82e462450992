"""``MpiStore`` against torch's own store cases (issue 35): the non-TCP bodies of torch's ``test_store.py``, under
``mpirun`` at 2 and 3 ranks, raw and in a ``PrefixStore``, every call's outcome equal to ``HashStore``'s.

The job is tests/mpi/torch_store_contract.py; every rank runs every case as the runner once, so each case's keys
are kept by each rank in turn. What torch itself cannot do is asserted as such: torch 2.13's bridge to Python
stores forwards no queue operation and no ``list_keys``, so through a ``PrefixStore`` those raise torch's
``NotImplementedError`` for every Python store (the job checks a bare one); on a torch whose bridge forwards them,
the same cases must equal ``HashStore``'s instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import run_mpi_job
from test_mpi_store import JOB_TIMEOUT_S, needs_mpi_store

CASES = [
    "set_get_check", "compare_set", "simple_wait", "extended_api", "queues", "queues_nonblocking",
    "queues_bidirectional", "queues_timeout", "clone", "num_keys_delete_key", "python_store", "multi_threaded_wait",
    "interrupt_doesnt_break_wait", "wrong_argument_types", "list_keys",
]  # fmt: skip
# The cases whose first call through a PrefixStore needs what torch's bridge may not forward (see the module doc).
NEEDS_FORWARDED = {"queues": "queue_push", "queues_nonblocking": "queue_push", "queues_bidirectional": "queue_push",
                   "queues_timeout": "queue_push", "list_keys": "list_keys"}  # fmt: skip


@dataclass(frozen=True)
class ContractJob:
    ranks: int
    returncode: int
    output: str
    records: dict[tuple[str, str, int], dict[str, Any]]  # (case, kind, runner) -> record
    forwards: dict[str, bool]
    default_stores: dict[int, dict[str, Any]]  # rank -> what the default store after mpi:// answered


@pytest.fixture(scope="module", params=[2, 3], ids=lambda ranks: f"{ranks}-ranks")
def contract_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ContractJob:
    report_dir = tmp_path_factory.mktemp(f"torch-store-contract-{request.param}")
    job = run_mpi_job("torch_store_contract.py", str(report_dir), ranks=request.param, timeout_s=JOB_TIMEOUT_S,
                      report_dir=report_dir)  # fmt: skip
    records, forwards, default_stores = {}, {}, {}
    for rank, lines in job.reports.items():
        for line in lines:
            record = json.loads(line)
            if "case" in record:
                records[record["case"], record["kind"], record["runner"]] = record
            elif "trampoline_forwards" in record:
                forwards = record["trampoline_forwards"]
            else:
                default_stores[rank] = record["default_store"]
    return ContractJob(request.param, job.returncode, job.output, records, forwards, default_stores)


def first_difference(reference: list, subject: list) -> str:
    for index, (expected, got) in enumerate(zip(reference, subject, strict=False)):
        if expected != got:
            return f"step {index}: HashStore {expected}, MpiStore {got}"
    return f"HashStore made {len(reference)} calls, MpiStore {len(subject)}"


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
def test_torchs_store_cases_give_mpi_store_hash_stores_results_raw_and_in_a_prefix_store(
    contract_job: ContractJob,
) -> None:
    assert contract_job.returncode == 0, contract_job.output[-6000:]
    expected_keys = {(case, kind, runner) for case in CASES for kind in ("raw", "prefix")
                     for runner in range(contract_job.ranks)}  # fmt: skip
    assert set(contract_job.records) == expected_keys
    found = []
    for (case, kind, runner), record in sorted(contract_job.records.items()):
        reference, subject = record["HashStore"], record["MpiStore"]
        where = f"{case} ({kind}, run by rank {runner} of {contract_job.ranks})"
        # HashStore passes torch's body: the case is right, and ran to its end (no early return).
        assert reference["failure"] is None, f"{where}: HashStore failed torch's body:\n{reference['failure']}"
        assert reference["steps"], f"{where}: no call recorded"
        forwarded = contract_job.forwards.get(NEEDS_FORWARDED.get(case, ""), True)
        if kind == "prefix" and not forwarded:
            # torch's bridge reaches no Python store's queue_push/list_keys: HashStore's results up to the first such
            # call, which raises torch's own NotImplementedError.
            *before, last = subject["steps"]
            assert before == reference["steps"][: len(before)], f"{where}: {subject['steps']}"
            assert last[1] == ["error", "NotImplementedError", False], f"{where}: {subject['steps']}"
            continue
        if subject["failure"] is not None:
            found.append(f"{where}: MpiStore failed torch's body:\n{subject['failure']}")
        elif subject["steps"] != reference["steps"]:
            found.append(f"{where}: {first_difference(reference['steps'], subject['steps'])}")
    assert not found, "\n".join(found)


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
def test_the_cases_that_return_early_without_the_extended_api_run_their_bodies(contract_job: ContractJob) -> None:
    for kind in ("raw", "prefix"):
        steps = contract_job.records["extended_api", kind, 0]["MpiStore"]["steps"]
        assert steps[0] == ["has_extended_api", ["ok", True]]
        assert ["multi_get", ["ok", [{"bytes": "po"}, {"bytes": "tato"}]]] in steps
        python_store = contract_job.records["python_store", kind, 0]["MpiStore"]
        assert python_store["steps"] == [["_test_python_store", ["ok", None]]]


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi_store
def test_the_default_store_after_mpi_answers_num_keys_delete_key_and_clone(contract_job: ContractJob) -> None:
    assert contract_job.returncode == 0, contract_job.output[-6000:]
    assert set(contract_job.default_stores) == set(range(contract_job.ranks))
    for answered in contract_job.default_stores.values():
        assert answered["layers"][-1] == "MpiStore" and set(answered["layers"][:-1]) == {"PrefixStore"}
        # every rank's own key and gloo's rendezvous keys, read from every home
        assert answered["num_keys"] >= 2 * contract_job.ranks, answered
        assert (answered["deleted"], answered["deleted_again"]) == (True, False)
        assert answered["clone_sees"] == {"bytes": "x"}  # the next rank's key, through a clone
        assert answered["has_extended_api"] is True


@pytest.mark.unit
def test_every_case_of_the_job_is_checked() -> None:
    source = (Path(__file__).parent / "mpi" / "torch_store_contract.py").read_text()
    assert all(f'"{case}": {case},' in source for case in CASES)
