"""``dir://``'s store (issue 21): torch's Store semantics over a directory, without file locks, refusing what is not
this user's own; and the ``dir://`` handler's checks of what it finds on disk."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from lightning_fabric.plugins.environments import LightningEnvironment

from lightning_dist_hooks.init_methods import DirectoryStore, init_method_handler, validate_init_method
from lightning_dist_hooks.init_methods._shared_filesystem import directory_store
from lightning_dist_hooks.init_methods._shared_filesystem.dir_scheme import DirRendezvous

SHORT = timedelta(seconds=0.3)


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    path = tmp_path / "store.d"
    path.mkdir(mode=0o700)
    return path


def store_in(directory: Path, timeout: timedelta = timedelta(seconds=10)) -> DirectoryStore:
    """A store of its own (its own descriptor and cache), as each rank has."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    return DirectoryStore(descriptor, directory, timeout)


@pytest.mark.unit
def test_set_get_append_multi_and_the_key_names(directory):
    writer, reader = store_in(directory), store_in(directory)
    writer.set("default_pg/0//cpu//rank_3", b"\x00address")
    writer.set("plain", "text")
    assert reader.get("default_pg/0//cpu//rank_3") == b"\x00address"
    assert reader.get("plain") == b"text"
    writer.set("plain", b"again")
    assert reader.get("plain") == b"again"
    writer.append("plain", b"+more")
    assert reader.get("plain") == b"again+more"
    writer.multi_set(["a", "b"], [b"1", b"2"])
    assert reader.multi_get(["b", "a"]) == [b"2", b"1"]
    long_key = "k" * 300 + "/é"
    writer.set(long_key, b"long")
    assert reader.get(long_key) == b"long"
    names = sorted(os.listdir(directory))
    assert "k.default_pg%2F0%2F%2Fcpu%2F%2Frank_3.1" in names
    assert all(len(name) < 255 and not name.startswith("t.") for name in names), "no temporary name is left"


@pytest.mark.unit
def test_a_missing_key_times_out_naming_it(directory):
    store = store_in(directory, SHORT)
    started = time.monotonic()
    with pytest.raises(
        dist.DistStoreError,
        match=r"Wait timeout: timed out after 0.3 s waiting for the keys "
        r"\['nobody/set/this'\] in .*store.d",
    ):
        store.get("nobody/set/this")
    assert 0.3 <= time.monotonic() - started < 2
    with pytest.raises(dist.DistStoreError, match=r"timed out after 0.1 s waiting for the keys \['b'\]"):
        store_in(directory).wait(["b"], timedelta(seconds=0.1))
    store.set("a", b"1")
    assert store.check(["a"]) and not store.check(["a", "b"])
    store.wait(["a"])


@pytest.mark.unit
def test_add_compare_set_delete_and_num_keys(directory):
    one, other = store_in(directory), store_in(directory)
    assert one.add("counter", 5) == 5
    assert other.add("counter", -2) == 3
    assert one.add("counter", 0) == 3 and one.get("counter") == b"3"
    assert other.compare_set("swap", "", "first") == b"first"  # no value yet, expected empty: set
    assert one.compare_set("swap", "", "second") == b"first"  # it has one now: unchanged
    assert one.compare_set("swap", "first", "second") == b"second"
    assert other.compare_set("swap", "first", "third") == b"second"
    assert one.compare_set("unset", "expected", "desired") == b"expected" and not one.check(["unset"])
    assert one.num_keys() == 2
    assert other.delete_key("swap") is True and one.delete_key("swap") is False
    assert one.num_keys() == 1 and not one.check(["swap"])
    with pytest.raises(dist.DistStoreError, match="Wait timeout"):
        one.wait(["swap"], timedelta(seconds=0.05))
    one.set("swap", b"back")
    assert other.get("swap") == b"back"
    one.set("text", b"abc")
    with pytest.raises(dist.DistStoreError, match=r"add\('text'\): the key holds b'abc', not an integer"):
        other.add("text", 1)


@pytest.mark.unit
def test_concurrent_adds_and_swaps_from_threads_are_atomic(directory):
    results: list[int] = []
    winners: list[int] = []
    store_in(directory).set("swap", b"0")

    def worker(index: int) -> None:
        store = store_in(directory)
        for _ in range(25):
            results.append(store.add("counter", 1))
        if store.compare_set("swap", b"0", str(index + 1)) == str(index + 1).encode():
            winners.append(index)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results) == list(range(1, 201)), "every increment counted once, each sum seen by one adder"
    assert len(winners) == 1 and store_in(directory).get("swap") == str(winners[0] + 1).encode()


def _add_in_a_process(directory: Path, count: int, results) -> None:
    store = store_in(directory)
    results.put([store.add("counter", 1) for _ in range(count)])


@pytest.mark.slow  # forked processes
def test_concurrent_adds_from_processes_are_atomic(directory):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    processes = [context.Process(target=_add_in_a_process, args=(directory, 30, results)) for _ in range(4)]
    for process in processes:
        process.start()
    seen = sorted(value for _ in processes for value in results.get(timeout=60))
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode == 0
    assert seen == list(range(1, 121))


@pytest.mark.unit
def test_reading_a_key_again_costs_one_look_until_it_changes(directory):
    writer, reader = store_in(directory), store_in(directory)
    writer.set("key", b"value")
    assert reader.get("key") == b"value"
    before = reader.operations.as_dict()
    for _ in range(10):
        assert reader.get("key") == b"value"
    after = reader.operations.as_dict()
    assert after["stats"] - before["stats"] == 10, "one look for a next entry per get"
    assert after["opens"] == before["opens"] and after["reads"] == before["reads"]
    assert writer.operations.creates == 1 and writer.operations.links == 1 and writer.operations.unlinks == 1
    assert reader.operations.total() == sum(reader.operations.as_dict().values())


@pytest.mark.unit
def test_waits_back_off_further_the_more_ranks_share_the_store(directory):
    """The longest pause is world_size / 5000 s (10 ms at least), so a job's waiting ranks together look about 5000
    times a second, however many they are. A 0.6 s wait: a store of 50 ranks looks every 10 ms after its first look,
    61 looks at most; one of 2500 ranks looks at 0, 0.01, 0.03, 0.07, 0.15, 0.31 and 0.6 s (pauses 10 ms doubling to
    0.5 s, the last cut short by the timeout), 7 looks at most; the first look is counted twice (wait's own, then its
    loop's). A store told no world size backs off to 0.1 s, as one of 500 ranks: 11 looks at most."""
    looks = {}
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for world_size in (50, 2500, None):
            store = DirectoryStore(descriptor, directory, timedelta(seconds=0.6), world_size=world_size)
            with pytest.raises(dist.DistStoreError, match="Wait timeout"):
                store.wait(["missing"])
            looks[world_size] = store.operations.stats
        with pytest.raises(ValueError, match=r"world_size=0\): a world has one rank at least"):
            DirectoryStore(descriptor, directory, world_size=0)
    finally:
        os.close(descriptor)
    assert looks[2500] <= 1 + 7, looks
    assert looks[None] <= 1 + 11, looks
    assert looks[50] <= 1 + 61 and looks[50] > 3 * looks[2500], looks


# --- refusing what is not this user's own -------------------------------------------------------------------------


@pytest.mark.unit
def test_a_symlink_at_a_keys_name_is_refused(directory, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"=planted")
    os.chmod(elsewhere, 0o600)
    (directory / "k.key.1").symlink_to(elsewhere)
    with pytest.raises(dist.DistStoreError, match=r"k.key.1 is a symbolic link, not an entry private to this user"):
        store_in(directory).get("key")


@pytest.mark.unit
def test_a_key_file_open_to_others_or_with_two_links_is_refused(directory, tmp_path, monkeypatch):
    planted = directory / "k.key.1"
    planted.write_bytes(b"=planted")
    planted.chmod(0o644)
    with pytest.raises(dist.DistStoreError, match=r"mode 0o644, 1 links, not an entry private to this user"):
        store_in(directory).get("key")
    planted.chmod(0o600)
    os.link(planted, tmp_path / "second-name")  # another name, outside: not an entry's writer about to remove it
    monkeypatch.setattr(directory_store, "_SECOND_LINK_WAIT_S", 0.05)
    with pytest.raises(dist.DistStoreError, match=r"mode 0o600, 2 links, not an entry"):
        store_in(directory).get("key")


@pytest.mark.unit
def test_a_planted_key_file_that_is_not_an_entry_is_refused(directory):
    planted = directory / "k.key.1"
    planted.write_bytes(b"no marker")
    planted.chmod(0o600)
    with pytest.raises(dist.DistStoreError, match=r"k.key.1 is not an entry of this store \(content b'no marker'\)"):
        store_in(directory).get("key")


@pytest.mark.unit
@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")
def test_a_key_file_of_another_user_is_refused(directory):
    planted = directory / "k.key.1"
    planted.write_bytes(b"=planted")
    planted.chmod(0o600)
    os.chown(planted, 65534, 65534)
    with pytest.raises(dist.DistStoreError, match=r"a file of uid 65534, mode 0o600, 1 links, not an entry private"):
        store_in(directory).get("key")


# --- torch over it, and the dir:// handler ------------------------------------------------------------------------


def _gloo_rank(directory: Path, rank: int, world_size: int, results) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo", store=store_in(directory), rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    tensor = torch.tensor([float(rank)])
    dist.all_reduce(tensor)
    dist.barrier()
    results.put(tensor.item())
    dist.destroy_process_group()


@pytest.mark.slow  # forked ranks
@pytest.mark.parametrize("world_size", [2, 8])
def test_gloo_meets_through_it(directory, world_size):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    ranks = [
        context.Process(target=_gloo_rank, args=(directory, rank, world_size, results)) for rank in range(world_size)
    ]
    for process in ranks:
        process.start()
    sums = [results.get(timeout=120) for _ in ranks]
    for process in ranks:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert sums == [world_size * (world_size - 1) / 2] * world_size


class _TwoRanks(LightningEnvironment):
    def world_size(self) -> int:
        return 2


@pytest.mark.slow  # the janitor is a process
def test_prepare_makes_a_fresh_store_directory_and_finish_removes_everything(tmp_path):
    url = validate_init_method(f"dir://{tmp_path}/run42")
    handler = init_method_handler(url)
    rendezvous = handler.prepare(url, _TwoRanks())
    assert isinstance(rendezvous, DirRendezvous) and rendezvous.store is not None
    private = tmp_path / f"ldh-uid-{os.geteuid()}"
    assert rendezvous.init_method == f"dir://{private}/run42"
    (store_directory,) = [path for path in private.iterdir() if path.is_dir()]
    assert store_directory.name.startswith("run42.") and store_directory.name.endswith(".d")
    assert (private / "run42").read_text() == store_directory.name
    assert oct(store_directory.stat().st_mode & 0o777) == "0o700"
    rendezvous.store.set("key", b"value")
    assert handler.waiting_for(rendezvous, 2) == [1]
    handler.finish(rendezvous)
    assert list(tmp_path.iterdir()) == [], "the store's directory, its keys, the file and the claim are gone"


@pytest.mark.slow  # the janitor is a process
def test_a_leftover_rendezvous_file_naming_no_directory_is_refused(tmp_path):
    private = tmp_path / f"ldh-uid-{os.geteuid()}"
    private.mkdir(mode=0o700)
    (private / "run42").write_text("run42.0123456789abcdef.d")
    (private / "run42").chmod(0o600)
    url = validate_init_method(f"dir://{tmp_path}/run42")
    with pytest.raises(RuntimeError, match=r"run42 exists, but no rank of this run made it"):
        init_method_handler(url).prepare(url, _TwoRanks())
    assert sorted(path.name for path in private.iterdir()) == ["run42"], "nothing of this rank is left"
