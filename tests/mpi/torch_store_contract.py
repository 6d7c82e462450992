"""torch's own store cases (``test/distributed/test_store.py`` of torch 2.13, the ones that are not TCP-specific),
run on ``MpiStore`` and on torch's ``HashStore``, raw and each wrapped in a ``PrefixStore`` (as torch holds every
default store), every call's outcome recorded so that the test compares the two call by call.

Usage (under mpirun -n N, N >= 2): python torch_store_contract.py REPORT_DIR

For every case, every kind (``raw``, ``prefix``) and every rank as the runner in turn, all ranks create a fresh
``MpiStore`` (collective); the runner runs the case on it and on a fresh ``HashStore`` while the other ranks serve
the keys they keep (crc32 spreads them, so most of the runner's calls are messages to another rank); then all
close it. Each case is torch's body, its assertions included (``TestCase`` methods of the same meaning), with each
store call's result or error recorded. At the end every rank initialises gloo through ``mpi://`` and exercises the
default store torch made of it (``num_keys``, ``delete_key``, ``clone``), as it can after ``tcp://``.

Each rank writes JSON lines to REPORT_DIR/rank-R.txt (``_setup.RankReport``): ``{"case", "kind", "runner",
"HashStore": outcome, "MpiStore": outcome}`` with outcome ``{"steps": [[label, result]...], "failure": text or
null}``; then ``{"trampoline_forwards": {...}}`` and ``{"default_store": {...}}``.
"""

from __future__ import annotations

import atexit
import json
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeAlias

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from _setup import RankReport, barrier, mpi

STORE_TIMEOUT = timedelta(seconds=300)  # as torch's cases set it
PREFIX = "test_prefix"

# The store a case runs on, typed as Any at this seam alone: torch's stubs for ``Store`` (_C/_distributed_c10d.pyi)
# lack methods the runtime class has (``append``, ``multi_set``, ``clone``, ``has_extended_api``) and accept fewer
# types than pybind11 converts (bytes keys, bytes values), and ``wrong_argument_types`` passes wrong ones on purpose.
AnyStore: TypeAlias = Any


class Recorder:
    """Runs store calls, recording each one's result (or error class, and whether torch's timeout pattern matches)."""

    def __init__(self) -> None:
        self.steps: list[list[Any]] = []
        self._lock = threading.Lock()  # threaded cases record from several threads

    # Called with no argument; ``...`` because the cases' lambdas bind their loop's variables as defaults
    # (``lambda key=key: ...``), which mypy cannot infer against ``Callable[[], Any]``.
    def __call__(self, label: str, call: Callable[..., Any]) -> Any:
        try:
            result = call()
        except Exception as error:
            # torch's own assertRaisesRegex pattern for a timeout (a TypeError naming a "timeout" argument is none)
            timeout = isinstance(error, RuntimeError) and re.search("[t -i]imeout", str(error)) is not None
            with self._lock:
                self.steps.append([label, ["error", type(error).__name__, timeout]])
            raise
        with self._lock:
            self.steps.append([label, ["ok", shown(result)]])
        return result


def shown(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.decode("latin-1")}
    if isinstance(value, (list, tuple)):
        return [shown(item) for item in value]
    if isinstance(value, dist.Store):
        return "a Store"
    return value


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def raises(call: Callable[..., Any], error: type[BaseException], pattern: str = "") -> None:
    """torch's assertRaises / assertRaisesRegex (``call`` takes no argument: ``...`` as for ``Recorder``)."""
    try:
        call()
    except error as raised:
        check(re.search(pattern, str(raised)) is not None, f"{raised!r} does not match {pattern!r}")
        return
    raise AssertionError(f"{error.__name__} not raised")


# --- torch's StoreTestBase -----------------------------------------------------------------------------------------


def set_get_check(fs: AnyStore, call: Recorder) -> None:
    for key, amount in [("key", 1), ("key", 2), ("key", 3)]:
        call(f"add {key} {amount}", lambda key=key, amount=amount: fs.add(key, amount))
    call("set key0", lambda: fs.set("key0", "value0"))
    call("add key3 1", lambda: fs.add("key3", 1))
    call("set key1", lambda: fs.set("key1", "value1"))
    call("add key3 2", lambda: fs.add("key3", 2))
    call("set key2", lambda: fs.set("key2", "value2"))
    for amount in (3, 4, 5, 6):
        call(f"add key3 {amount}", lambda amount=amount: fs.add("key3", amount))
    check(call("num_keys", fs.num_keys) == 5, "num_keys_total")  # torch's base case: 5 keys
    check(call("get key", lambda: fs.get("key")) == b"6", "key")
    check(call("get key0", lambda: fs.get("key0")) == b"value0", "key0")
    check(call("get key1", lambda: fs.get("key1")) == b"value1", "key1")
    check(call("get key2", lambda: fs.get("key2")) == b"value2", "key2")
    check(call("get key3", lambda: fs.get("key3")) == b"21", "key3")
    check(call("check key3", lambda: fs.check(["key3"])) is True, "check key3")
    check(call("check Randomkey3", lambda: fs.check(["Randomkey3"])) is False, "check Randomkey3")
    call("set -key3", lambda: fs.set("-key3", "7"))
    check(call("get -key3", lambda: fs.get("-key3")) == b"7", "-key3")
    call("delete -key3", lambda: fs.delete_key("-key3"))
    check(call("num_keys again", fs.num_keys) == 5, "num_keys_total after delete")


def compare_set(store: AnyStore, call: Recorder) -> None:
    missing = call("cas missing", lambda: store.compare_set("cs_key0", "wrong_old_value", "new_value0"))
    check(missing == b"wrong_old_value", "missing key result")
    call("set cs_key0", lambda: store.set("cs_key0", "value0"))
    check(call("get", lambda: store.get("cs_key0")) == b"value0", "value0")
    old = call("cas wrong", lambda: store.compare_set("cs_key0", "wrong_old_value", "new_value0"))
    check(old == b"value0", "old value result")
    check(call("get again", lambda: store.get("cs_key0")) == b"value0", "value0 kept")
    new = call("cas right", lambda: store.compare_set("cs_key0", "value0", "new_value0"))
    check(new == b"new_value0", "new value result")
    check(call("get new", lambda: store.get("cs_key0")) == b"new_value0", "new_value0")
    empty = call("cas empty expected", lambda: store.compare_set("cs_key1", "", "new_value1"))
    check(empty == b"new_value1", "empty old value result")
    check(call("get cs_key1", lambda: store.get("cs_key1")) == b"new_value1", "new_value1")


def simple_wait(fs: AnyStore, call: Recorder) -> None:
    raises(
        lambda: call("wait bad_key", lambda: fs.wait(["bad_key"], timedelta(seconds=0.25))),
        RuntimeError,
        "[t -i]imeout",
    )
    call("add good_key", lambda: fs.add("good_key", 1))
    call("wait good_key", lambda: fs.wait(["good_key"]))


def extended_api(store: AnyStore, call: Recorder) -> None:
    """torch's append, multi_set and multi_get bodies, which return early unless ``has_extended_api()``: asserted
    true here, so that they run."""
    check(call("has_extended_api", store.has_extended_api) is True, "has_extended_api")
    call("set foo", lambda: store.set("foo", "po"))
    call("append foo", lambda: store.append("foo", "tato"))
    call("append bar", lambda: store.append("bar", "po"))
    call("append bar again", lambda: store.append("bar", "tato"))
    check(call("get foo", lambda: store.get("foo")) == b"potato", "foo")
    check(call("get bar", lambda: store.get("bar")) == b"potato", "bar")
    call("multi_set", lambda: store.multi_set(["mfoo", "mbar"], ["po", "tato"]))
    check(call("get mfoo", lambda: store.get("mfoo")) == b"po", "mfoo")
    check(call("get mbar", lambda: store.get("mbar")) == b"tato", "mbar")
    call("set gfoo", lambda: store.set("gfoo", "po"))
    call("set gbar", lambda: store.set("gbar", "tato"))
    check(call("multi_get", lambda: store.multi_get(["gfoo", "gbar"])) == [b"po", b"tato"], "multi_get")


def queues(store: AnyStore, call: Recorder) -> None:
    call("queue support", lambda: store.queue_push("test_queue_support", "1"))
    check(call("check foo", lambda: store.check(["foo"])) is False, "no foo")
    check(call("len foo", lambda: store.queue_len("foo")) == 0, "empty")
    call("push 1", lambda: store.queue_push("foo", "1"))
    call("push 2", lambda: store.queue_push("foo", "2"))
    check(call("check foo again", lambda: store.check(["foo"])) is True, "foo")
    check(call("len 2", lambda: store.queue_len("foo")) == 2, "two items")
    call("wait foo", lambda: store.wait(["foo"]))
    check(call("pop 1", lambda: store.queue_pop("foo")) == b"1", "first")
    check(call("pop 2", lambda: store.queue_pop("foo")) == b"2", "second")
    check(call("check emptied", lambda: store.check(["foo"])) is False, "emptied")
    check(call("len 0", lambda: store.queue_len("foo")) == 0, "none left")


def queues_nonblocking(store: AnyStore, call: Recorder) -> None:
    call("queue support", lambda: store.queue_push("test_queue_support", "1"))
    raises(lambda: call("pop empty", lambda: store.queue_pop("foo", block=False)), dist.QueueEmptyError, "empty")
    call("push a", lambda: store.queue_push("foo", "a"))
    check(call("pop a", lambda: store.queue_pop("foo", block=False)) == b"a", "a")


def queues_bidirectional(store: AnyStore, call: Recorder) -> None:
    call("queue support", lambda: store.queue_push("test_queue_support", "1"))

    def worker_a() -> None:
        local_store = store.clone()
        call("a pushes", lambda: local_store.queue_push("a", "a1"))
        check(call("a pops", lambda: local_store.queue_pop("b")) == b"b1", "b1")

    def worker_b() -> None:
        local_store = store.clone()
        check(call("b pops", lambda: local_store.queue_pop("a")) == b"a1", "a1")
        call("b pushes", lambda: local_store.queue_push("b", "b1"))

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(worker_a), pool.submit(worker_b)]:
            future.result()
    call.steps.sort(key=lambda step: step[0])  # the two threads' steps interleave differently on every run


def queues_timeout(store: AnyStore, call: Recorder) -> None:
    call("queue support", lambda: store.queue_push("test_queue_support", "1"))
    store.set_timeout(timedelta(seconds=0.01))
    raises(lambda: call("pop times out", lambda: store.queue_pop("non_existant")), dist.DistStoreError, "timeout")


def clone(a: AnyStore, call: Recorder) -> None:
    b = call("clone", a.clone)
    check(isinstance(b, dist.Store), "a Store")
    call("set via a", lambda: a.set("foo", "bar"))
    check(call("get via b", lambda: b.get("foo")) == b"bar", "shared")
    # Held by nothing of Python's but the store: through a PrefixStore, torch's C++ side holds the inner clone alone.
    clone_of_clone = a.clone().clone()
    check(call("get via a clone's clone", lambda: clone_of_clone.get("foo")) == b"bar", "clone of a clone")


# --- the rest of torch's file, outside StoreTestBase ---------------------------------------------------------------


def num_keys_delete_key(fs: AnyStore, call: Recorder) -> None:
    """TCPStoreTest._test_numkeys_delkeys without TCPStore's own init key (0 keys to begin with, as HashStore)."""
    check(call("num_keys empty", fs.num_keys) == 0, "empty")
    for amount in (1, 2, 3):
        call(f"add key {amount}", lambda amount=amount: fs.add("key", amount))
    call("set key0", lambda: fs.set("key0", "value0"))
    call("add key3", lambda: fs.add("key3", 1))
    call("set key1", lambda: fs.set("key1", "value1"))
    check(call("num_keys 4", fs.num_keys) == 4, "4 keys")
    call("delete key", lambda: fs.delete_key("key"))
    check(call("num_keys 3", fs.num_keys) == 3, "3 keys")
    fs.set_timeout(timedelta(seconds=0.5))  # torch's 2 s, shortened: the case runs 2 x 2 x world size times
    raises(lambda: call("get deleted", lambda: fs.get("key")), RuntimeError)
    call("delete key0", lambda: fs.delete_key("key0"))
    call("delete key3", lambda: fs.delete_key("key3"))
    check(call("num_keys 1", fs.num_keys) == 1, "1 key")
    call("set key4", lambda: fs.set("key4", "value2"))
    check(call("num_keys 2", fs.num_keys) == 2, "2 keys")
    check(call("get key1", lambda: fs.get("key1")) == b"value1", "key1")
    check(call("get key4", lambda: fs.get("key4")) == b"value2", "key4")


def python_store(store: AnyStore, call: Recorder) -> None:
    """PythonStoreTest: torch's own C++ body (``_test_python_store``) through the trampoline."""
    call("_test_python_store", lambda: dist._test_python_store(store))


def multi_threaded_wait(store: AnyStore, call: Recorder) -> None:
    """TestMultiThreadedWait: one thread waits for a key another sets (each with a clone, as threads should)."""
    store.set_timeout(timedelta(seconds=2))

    def rank0() -> None:
        local = store.clone()
        call("0 waits", lambda: local.wait(["key1"]))
        check(call("0 gets", lambda: local.get("key1")) == b"value1", "value1")

    def rank1() -> None:
        time.sleep(0.2)
        store.clone().set("key1", "value1")

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(rank0), pool.submit(rank1)]:
            future.result()


def interrupt_doesnt_break_wait(store: AnyStore, call: Recorder) -> None:
    """TimeoutTest: a signal delivered to a thread waiting in ``wait`` does not end the wait (torch's 4 s and 1 s
    shortened to 0.6 s and 0.3 s)."""
    results: list[Any] = [None, None]

    def run(rank: int, my_store: dist.Store) -> None:
        try:
            if rank == 0:
                time.sleep(0.6)
                my_store.set("foo", "bar")
            else:
                my_store.wait(["foo"], timedelta(seconds=10))
            results[rank] = True
        except Exception as error:
            results[rank] = repr(error)

    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        threads = [threading.Thread(target=run, args=(rank, store.clone())) for rank in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        assert threads[1].ident is not None
        signal.pthread_kill(threads[1].ident, signal.SIGUSR1)
        for thread in threads:
            thread.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    check(call("both ranks' results", lambda: results) == [True, True], f"results {results}")


def wrong_argument_types(store: AnyStore, call: Recorder) -> None:
    """What torch's stores refuse with a ``TypeError`` (pybind11's conversions), and what they take."""
    wrong = [
        ("set int value", lambda: store.set("k", 5)),
        ("set huge int value", lambda: store.set("k", 10**8)),
        ("set list value", lambda: store.set("k", [1, 2])),
        ("add float", lambda: store.add("n", 1.5)),
        ("add str", lambda: store.add("n", "3")),
        ("add past int64", lambda: store.add("n", 1 << 70)),
        ("check a str", lambda: store.check("abc")),
        ("wait a str", lambda: store.wait("abc")),
        ("wait int timeout", lambda: store.wait(["k"], 5)),
        ("get int key", lambda: store.get(1)),
        ("compare_set int", lambda: store.compare_set("k", 1, b"x")),
        ("append int", lambda: store.append("k", 3)),
        ("multi_get a str", lambda: store.multi_get("k")),
        ("multi_set int", lambda: store.multi_set(["a"], [1])),
        ("queue_push int", lambda: store.queue_push("q", 1)),
    ]
    for label, action in wrong:
        raises(lambda label=label, action=action: call(label, action), TypeError)
    call("set bytes key", lambda: store.set(b"bk", "v"))
    check(call("get str of it", lambda: store.get("bk")) == b"v", "a bytes key is its str")
    call("set bytearray", lambda: store.set("ba", bytearray(b"x")))
    check(call("add bool", lambda: store.add("flag", True)) == 1, "bool is an int")
    check(call("check tuple", lambda: store.check(("bk", "ba"))) is True, "a tuple of keys")
    check(call("get bytearray", lambda: store.get("ba")) == b"x", "bytearray")


def list_keys(store: AnyStore, call: Recorder) -> None:
    for key in ("a", "b", "c"):
        call(f"set {key}", lambda key=key: store.set(key, key))
    call("delete b", lambda: store.delete_key("b"))
    check(call("list_keys", lambda: sorted(store.list_keys())) == ["a", "c"], "keys")


CASES: dict[str, Callable[[AnyStore, Recorder], None]] = {
    "set_get_check": set_get_check,
    "compare_set": compare_set,
    "simple_wait": simple_wait,
    "extended_api": extended_api,
    "queues": queues,
    "queues_nonblocking": queues_nonblocking,
    "queues_bidirectional": queues_bidirectional,
    "queues_timeout": queues_timeout,
    "clone": clone,
    "num_keys_delete_key": num_keys_delete_key,
    "python_store": python_store,
    "multi_threaded_wait": multi_threaded_wait,
    "interrupt_doesnt_break_wait": interrupt_doesnt_break_wait,
    "wrong_argument_types": wrong_argument_types,
    "list_keys": list_keys,
}


def run_case(case: str, store: dist.Store) -> dict[str, Any]:
    call = Recorder()
    try:
        CASES[case](store, call)
        failure = None
    except Exception:
        failure = traceback.format_exc(limit=4)
    return {"steps": call.steps, "failure": failure}


def wrapped(kind: str, store: dist.Store) -> dist.Store:
    return dist.PrefixStore(PREFIX, store) if kind == "prefix" else store


def default_store_after_mpi_rendezvous() -> dict[str, Any]:
    """What the store torch made of ``mpi://`` answers (a PrefixStore over a PrefixStore over MpiStore)."""
    mpi.register_rendezvous()
    dist.init_process_group("gloo", init_method="mpi://", timeout=timedelta(seconds=60))
    store: AnyStore = c10d._get_default_store()  # clone and has_extended_api, which the stubs lack
    found: dict[str, Any] = {"layers": []}
    underlying = store
    while isinstance(underlying, dist.PrefixStore):
        found["layers"].append("PrefixStore")
        underlying = underlying.underlying_store
    found["layers"].append(type(underlying).__name__)
    rank = dist.get_rank()
    store.set(f"mine-{rank}", "x")
    dist.barrier()
    found["num_keys"] = store.num_keys()
    found["clone_sees"] = shown(store.clone().get(f"mine-{(rank + 1) % dist.get_world_size()}"))
    dist.barrier()  # every rank has read its neighbour's key before any deletes its own
    found["deleted"] = store.delete_key(f"mine-{rank}")
    found["deleted_again"] = store.delete_key(f"mine-{rank}")
    found["has_extended_api"] = store.has_extended_api()
    dist.destroy_process_group()
    return found


def trampoline_forwards() -> dict[str, bool]:
    """Whether this torch's C++ side reaches a Python store's ``queue_push`` and ``list_keys`` through a
    ``PrefixStore`` (torch 2.13's trampoline forwards neither: a C++ ``NotImplementedError`` for every Python store)."""

    class Probe(dist.Store):
        def queue_push(self, key: str, value: bytes | str) -> None:
            pass

        def list_keys(self) -> list[str]:
            return []

    prefixed = dist.PrefixStore(PREFIX, Probe())
    forwards = {}
    for name, call in [("queue_push", lambda: prefixed.queue_push("q", "v")), ("list_keys", prefixed.list_keys)]:
        try:
            call()
            forwards[name] = True
        except NotImplementedError:
            forwards[name] = False
    return forwards


def main() -> None:
    report = RankReport(sys.argv[1], mpi.init_mpi().COMM_WORLD.Get_rank())
    world = mpi.init_mpi().COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    for case in CASES:
        for kind in ("raw", "prefix"):
            for runner in range(size):
                mpi_store = mpi.MpiStore.create(STORE_TIMEOUT)
                if rank == runner:
                    hash_store = dist.HashStore()
                    hash_store.set_timeout(STORE_TIMEOUT)
                    record = {
                        "case": case,
                        "kind": kind,
                        "runner": runner,
                        "HashStore": run_case(case, wrapped(kind, hash_store)),
                        "MpiStore": run_case(case, wrapped(kind, mpi_store)),
                    }
                    report.line(json.dumps(record))
                barrier()  # the other ranks' service threads answered the runner meanwhile
                mpi_store.close()
                atexit.unregister(mpi_store.close)
    report.line(json.dumps({"trampoline_forwards": trampoline_forwards()}))
    report.line(json.dumps({"default_store": default_store_after_mpi_rendezvous()}))


if __name__ == "__main__":
    main()
