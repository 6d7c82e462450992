"""The same store cases against torch's ``HashStore``, ``FileStore`` and ``MpiStore``, then cases across ranks.

Usage (under mpirun -n 2): python store_parity.py REPORT_DIR

Alone: a rank runs every case of ``CASES`` in turn on a store that only it uses; every rank at once, each on an
``MpiStore`` of its own (of two created on every rank), serving the other rank's meanwhile: half of each case's keys
are kept by the other rank. Meanwhile, in a thread, rank 0 runs them on a ``HashStore``; rank 1 runs each case on a
``FileStore`` of its own (a file in REPORT_DIR), every case at once: FileStore's timeouts take whole seconds, 8 s in
turn. Across: both ranks on one ``FileStore``, then on one ``MpiStore``: keys set later by the other rank, concurrent
``add``/``append``/``compare_set`` on one key, a delete the other rank sees, a wait for a key the other rank never
reaches.

Each rank writes one JSON object a line to REPORT_DIR/rank-R.txt (``_setup.RankReport``): ``{"phase": "alone",
"runner", "store", "case", "steps", "errors"}`` per case (each step ``["ok", value]`` or ``["error", kind]``, kind
``timeout`` for a wait that timed out, else the exception's class; ``errors`` has each error's class, message and
seconds), ``{"phase": "across", "store", "results"}`` and ``{"phase": "homes", ...}``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import zlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeAlias

import torch.distributed as dist
from _setup import RankReport, barrier, mpi

WORLD_SIZE = 2
LONG = timedelta(seconds=30)  # the stores' timeout where nothing should time out
SHORT_S = 0.5  # a store timeout (set_timeout) for cases that time out
WAIT_S = 0.3  # wait(keys, timeout) for cases that time out
ACROSS_ADDS = 100  # each rank's adds (and appends) to one key, concurrently with the other rank's

# The store a case runs on, typed as Any at this seam alone: torch's stubs for ``Store`` (_C/_distributed_c10d.pyi)
# lack methods the runtime class has (``append``, ``multi_set``) and type values as ``str`` where every store takes
# bytes too, and the cases call them all, as users do.
AnyStore: TypeAlias = Any


def homed(name: str, home: int) -> str:
    """A key named after ``name`` that ``MpiStore`` keeps on rank ``home`` (crc32 % world size, as home_of)."""
    for suffix in range(1000):
        key = f"{name}#{suffix}"
        if zlib.crc32(key.encode()) % WORLD_SIZE == home:
            return key
    raise AssertionError("unreachable")


def both(name: str) -> tuple[str, str]:
    return homed(name, 0), homed(name, 1)


ODD_KEYS = ["", " ", "with space", "slash/and:colon//", "ünïcödé ✓", "tab\tnew\nline", "nul\x00inside", "k" * 2000]


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.decode("latin-1")}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    return value


class Steps:
    """Runs one case's steps, recording each one's result or error."""

    def __init__(self) -> None:
        self.steps: list[list[Any]] = []
        self.errors: list[dict[str, Any]] = []

    # Called with no argument; ``...`` because the cases' lambdas bind their loop's key as a default
    # (``lambda key=key: ...``), which mypy cannot infer against ``Callable[[], Any]``.
    def __call__(self, action: Callable[..., Any]) -> None:
        started = time.monotonic()
        try:
            self.steps.append(["ok", jsonable(action())])
        except Exception as error:
            text = str(error)
            kind = "timeout" if "timeout" in text.lower() else type(error).__name__
            self.steps.append(["error", kind])
            self.errors.append(
                {"type": type(error).__name__, "message": text[:600], "seconds": round(time.monotonic() - started, 3)}
            )


# --- the cases: each takes a fresh-per-runner store (shared by all cases of a run) and a Steps ---


def set_get(s: AnyStore, do: Steps) -> None:
    k0, k1 = both("set-get")
    do(lambda: s.set(k0, "on rank 0"))
    do(lambda: s.set(k1, b"on rank 1"))
    do(lambda: s.get(k0))
    do(lambda: s.get(k1))


def set_overwrites(s: AnyStore, do: Steps) -> None:
    for key in both("overwrite"):
        do(lambda key=key: s.set(key, "first"))
        do(lambda key=key: s.set(key, "second"))
        do(lambda key=key: s.get(key))


def str_and_binary_values(s: AnyStore, do: Steps) -> None:
    k0, k1 = both("values")
    do(lambda: s.set(k0, "ü"))
    do(lambda: s.set(k1, b"\x00\xff\n\x80"))
    do(lambda: s.get(k0))
    do(lambda: s.get(k1))
    do(lambda: s.set(k0, b""))
    do(lambda: s.get(k0))


def large_value(s: AnyStore, do: Steps) -> None:
    value = bytes(range(256)) * 4096  # 1 MiB
    for key in both("large"):
        do(lambda key=key: s.set(key, value))
        do(lambda key=key: hashlib.sha256(s.get(key)).hexdigest() == hashlib.sha256(value).hexdigest())


def get_missing_times_out(s: AnyStore, do: Steps) -> None:
    k0, k1 = both("missing")
    s.set_timeout(timedelta(seconds=1))
    do(lambda: s.get(k0))
    s.set_timeout(timedelta(seconds=SHORT_S))  # set_timeout changes the next get's timeout
    do(lambda: s.get(k1))
    s.set_timeout(LONG)
    do(lambda: s.check([k0, k1]))  # a timed-out get leaves no key behind


def add(s: AnyStore, do: Steps) -> None:
    for key in both("add"):
        do(lambda key=key: s.add(key, 5))
        do(lambda key=key: s.add(key, 0))
        do(lambda key=key: s.add(key, -7))
        do(lambda key=key: s.get(key))
        do(lambda key=key: s.add(key, -(2**40)))
        do(lambda key=key: s.add(key, 2**40 + 2))
        do(lambda key=key: s.get(key))


def add_zero_creates_the_key(s: AnyStore, do: Steps) -> None:
    for key in both("add-zero"):
        do(lambda key=key: s.check([key]))
        do(lambda key=key: s.add(key, 0))
        do(lambda key=key: s.check([key]))
        do(lambda key=key: s.get(key))


def add_to_a_number_set_as_text(s: AnyStore, do: Steps) -> None:
    for key in both("add-text-number"):
        do(lambda key=key: s.set(key, "41"))
        do(lambda key=key: s.add(key, 1))
        do(lambda key=key: s.set(key, "-3"))
        do(lambda key=key: s.add(key, 1))


def add_to_text(s: AnyStore, do: Steps) -> None:
    for key in both("add-text"):
        do(lambda key=key: s.set(key, "forty"))
        do(lambda key=key: s.add(key, 1))
        do(lambda key=key: s.get(key))  # unchanged


def append(s: AnyStore, do: Steps) -> None:
    for key in both("append"):
        do(lambda key=key: s.append(key, "a"))  # a missing key is created
        do(lambda key=key: s.append(key, b"\x00b"))
        do(lambda key=key: s.get(key))


def compare_set_missing_key_nothing_expected(s: AnyStore, do: Steps) -> None:
    for key in both("cas-missing-empty"):
        do(lambda key=key: s.compare_set(key, "", "desired"))
        do(lambda key=key: s.get(key))


def compare_set_missing_key_something_expected(s: AnyStore, do: Steps) -> None:
    for key in both("cas-missing-expected"):
        do(lambda key=key: s.compare_set(key, "expected", "desired"))
        do(lambda key=key: s.check([key]))  # not created


def compare_set_match(s: AnyStore, do: Steps) -> None:
    for key in both("cas-match"):
        do(lambda key=key: s.set(key, "old"))
        do(lambda key=key: s.compare_set(key, "old", "new"))
        do(lambda key=key: s.get(key))


def compare_set_mismatch(s: AnyStore, do: Steps) -> None:
    for key in both("cas-mismatch"):
        do(lambda key=key: s.set(key, "current"))
        do(lambda key=key: s.compare_set(key, "other", "new"))
        do(lambda key=key: s.get(key))


def compare_set_empty_value(s: AnyStore, do: Steps) -> None:
    for key in both("cas-empty-value"):
        do(lambda key=key: s.set(key, ""))
        do(lambda key=key: s.compare_set(key, "", "filled"))
        do(lambda key=key: s.get(key))


def delete_key_present(s: AnyStore, do: Steps) -> None:
    for key in both("delete-present"):
        do(lambda key=key: s.set(key, "x"))
        do(lambda key=key: s.delete_key(key))
        do(lambda key=key: s.check([key]))


def delete_key_absent(s: AnyStore, do: Steps) -> None:
    for key in both("delete-absent"):
        do(lambda key=key: s.delete_key(key))


def check(s: AnyStore, do: Steps) -> None:
    k0, k1 = both("check")
    missing = homed("check-missing", 1)
    do(lambda: s.check([k0, k1]))
    do(lambda: s.set(k0, "x"))
    do(lambda: s.set(k1, "y"))
    do(lambda: s.check([k0, k1]))
    do(lambda: s.check([k1, missing, k0]))
    do(lambda: s.check([]))


def wait_for_keys_present(s: AnyStore, do: Steps) -> None:
    k0, k1 = both("wait-present")
    do(lambda: s.multi_set([k0, k1], ["x", "y"]))
    do(lambda: s.wait([k0, k1]))
    do(lambda: s.wait([k1, k0], timedelta(seconds=5)))
    do(lambda: s.wait([]))


def wait_with_timeout_times_out(s: AnyStore, do: Steps) -> None:
    for key in both("wait-missing"):
        do(lambda key=key: s.wait([key], timedelta(seconds=WAIT_S)))


def wait_without_timeout_times_out(s: AnyStore, do: Steps) -> None:
    s.set_timeout(timedelta(seconds=SHORT_S))
    do(lambda: s.wait([homed("wait-store-timeout", 1)]))
    s.set_timeout(LONG)


def wait_for_keys_partly_set_times_out(s: AnyStore, do: Steps) -> None:
    k0, k1 = both("wait-partly")
    do(lambda: s.set(k0, "x"))
    do(lambda: s.wait([k0, k1], timedelta(seconds=WAIT_S)))


def multi_set_and_multi_get(s: AnyStore, do: Steps) -> None:
    keys = [homed(f"multi-{index}", index % 2) for index in range(6)]
    do(lambda: s.multi_set(keys, [f"value {index}" for index in range(6)]))
    do(lambda: s.multi_get([keys[5], keys[0], keys[3], keys[2], keys[1], keys[4]]))
    do(lambda: s.multi_get([keys[1], keys[1]]))
    do(lambda: s.multi_get([]))
    do(lambda: s.get(keys[4]))


def multi_set_the_same_key_twice(s: AnyStore, do: Steps) -> None:
    for key in both("multi-twice"):
        do(lambda key=key: s.multi_set([key, key], ["first", b"last"]))
        do(lambda key=key: s.get(key))


def multi_get_with_a_missing_key_times_out(s: AnyStore, do: Steps) -> None:
    k0, k1 = both("multi-missing")
    do(lambda: s.set(k0, "x"))
    s.set_timeout(timedelta(seconds=SHORT_S))
    do(lambda: s.multi_get([k0, k1]))
    s.set_timeout(LONG)


def odd_keys(s: AnyStore, do: Steps) -> None:
    for index, key in enumerate(ODD_KEYS):
        do(lambda key=key, index=index: s.set(key, f"odd {index}"))
    do(lambda: s.multi_get(ODD_KEYS[::-1]))
    do(lambda: s.get(ODD_KEYS[5]))
    do(lambda: s.check(ODD_KEYS))
    do(lambda: s.delete_key(ODD_KEYS[6]))
    do(lambda: s.check(ODD_KEYS))


def num_keys(s: AnyStore, do: Steps) -> None:
    do(s.num_keys)  # every key the cases before left (run last)


CASES: list[Callable[[AnyStore, Steps], None]] = [
    set_get,
    set_overwrites,
    str_and_binary_values,
    large_value,
    get_missing_times_out,
    add,
    add_zero_creates_the_key,
    add_to_a_number_set_as_text,
    add_to_text,
    append,
    compare_set_missing_key_nothing_expected,
    compare_set_missing_key_something_expected,
    compare_set_match,
    compare_set_mismatch,
    compare_set_empty_value,
    delete_key_present,
    delete_key_absent,
    check,
    wait_for_keys_present,
    wait_with_timeout_times_out,
    wait_without_timeout_times_out,
    wait_for_keys_partly_set_times_out,
    multi_set_and_multi_get,
    multi_set_the_same_key_twice,
    multi_get_with_a_missing_key_times_out,
    odd_keys,
    num_keys,
]


def run_alone(
    rank: int, store: AnyStore, name: str, cases: list[Callable[[AnyStore, Steps], None]] = CASES
) -> list[str]:
    """Every case in turn on ``store``; the report's lines."""
    store.set_timeout(LONG)
    lines = []
    for case in cases:
        do = Steps()
        started = time.monotonic()
        case(store, do)
        seconds = round(time.monotonic() - started, 3)
        record = {"phase": "alone", "runner": rank, "store": name, "case": case.__name__}
        lines.append(json.dumps({**record, "steps": do.steps, "errors": do.errors, "seconds": seconds}))
    return lines


def run_each_case_on_a_file_store(rank: int, report_dir: Path) -> list[str]:
    """Every case at once, each in a thread on a ``FileStore`` of its own; the report's lines, in the cases' order.

    The cases' keys are their own, so each case's steps are those it has in turn on one store (``num_keys`` aside,
    which FileStore counts differently anyway).
    """
    lines: dict[str, list[str]] = {}

    def run(case: Callable[[AnyStore, Steps], None]) -> None:
        store = dist.FileStore(str(report_dir / f"alone-{case.__name__}.filestore"), 1)
        lines[case.__name__] = run_alone(rank, store, "FileStore", [case])

    threads = [threading.Thread(target=run, args=(case,)) for case in CASES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [line for case in CASES for line in lines[case.__name__]]


# --- across ranks ---


def run_across(report: RankReport, store: AnyStore, name: str) -> None:
    rank = report.rank
    store.set_timeout(LONG)
    results: dict[str, Any] = {}
    phase_started = time.monotonic()

    def record(label: str, action: Callable[[], Any]) -> None:
        do = Steps()
        started = time.monotonic()
        do(action)
        results[label] = {"step": do.steps[0], "errors": do.errors, "seconds": round(time.monotonic() - started, 3)}

    late0, late1 = both("across-late")
    barrier()
    if rank == 1:
        time.sleep(0.3)
        store.set(late0, "set late by rank 1")
        time.sleep(0.3)
        store.multi_set([late1, homed("across-late-b", 0)], ["one", "two"])
    else:
        record("get of a key rank 1 sets later", lambda: store.get(late0))
        record("wait for keys rank 1 sets later", lambda: store.wait([homed("across-late-b", 0), late1]))
        record("multi_get of them", lambda: store.multi_get([homed("across-late-b", 0), late1]))

    barrier()
    results["add returns"] = [store.add("across-counter", 1) for _ in range(ACROSS_ADDS)]
    for _ in range(ACROSS_ADDS):
        store.append("across-log", str(rank))
    barrier()
    results["add total"] = int(store.get("across-counter"))
    results["append total"] = store.get("across-log").decode()

    barrier()
    results["compare_set race"] = store.compare_set("across-lock", "", f"rank {rank}").decode()
    barrier()
    results["lock holder"] = store.get("across-lock").decode()

    doomed = homed("across-doomed", 1 - rank)  # kept by the rank that does not delete it
    if rank == 0:
        store.set(doomed, "x")
    barrier()
    if rank == 1:
        results["delete of rank 0's key"] = store.delete_key(homed("across-doomed", 1))
    barrier()
    results["check after the delete"] = store.check([homed("across-doomed", 1)])

    barrier()
    if rank == 0:
        never = homed("across-never", 1)  # kept by rank 1, which never asks for it
        record("wait for a key rank 1 never reaches", lambda: store.wait([never], timedelta(seconds=WAIT_S)))
    barrier()
    results["num_keys"] = store.num_keys()
    barrier()
    seconds = round(time.monotonic() - phase_started, 3)
    report.line(json.dumps({"phase": "across", "store": name, "results": results, "seconds": seconds}))


def main() -> None:
    report_dir = Path(sys.argv[1])
    started = time.monotonic()
    world = mpi.init_mpi().COMM_WORLD
    rank = world.Get_rank()
    assert world.Get_size() == WORLD_SIZE, "run under mpirun -n 2"
    report = RankReport(str(report_dir), rank)
    # Two MpiStores (collective), one a runner: each rank runs its cases on its own while it serves the other's.
    mpi_stores = [mpi.MpiStore.create(LONG) for _ in range(WORLD_SIZE)]
    homes = {key: mpi_stores[0].home_of(key) for key in both("homes")}
    report.line(json.dumps({"phase": "homes", "keys": homes}))
    # Meanwhile, in a thread: rank 0 runs them on a HashStore, rank 1 on FileStores (whose timeouts take seconds).
    reference: list[str] = []
    if rank == 0:
        alone = threading.Thread(target=lambda: reference.extend(run_alone(rank, dist.HashStore(), "HashStore")))
    else:
        alone = threading.Thread(target=lambda: reference.extend(run_each_case_on_a_file_store(rank, report_dir)))
    alone.start()
    lines = run_alone(rank, mpi_stores[rank], "MpiStore")
    alone.join()
    for line in [*lines, *reference]:
        report.line(line)
    barrier()

    run_across(report, dist.FileStore(str(report_dir / "across.filestore"), WORLD_SIZE), "FileStore")
    run_across(report, mpi.MpiStore.create(LONG), "MpiStore")
    report.line(f"rank {rank}: done in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
