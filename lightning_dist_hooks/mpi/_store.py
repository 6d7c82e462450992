"""A ``torch.distributed.Store`` whose operations travel over MPI: no socket, no file, every backend can meet in it.

``mpi://`` hands it to torch, so gloo, NCCL, composites and subgroups of any backend rendezvous where only an MPI
launcher started the ranks, and nothing listens on a port nor waits on a shared filesystem. How the keys are kept
and the messages travel: :mod:`~lightning_dist_hooks.mpi._store_service`.

It answers all of torch 2.13's ``Store`` API as torch's own stores do (checked against ``HashStore`` with the cases of
torch's ``test_store.py``, tests/mpi/torch_store_contract.py): ``set``, ``get``, ``add``, ``compare_set``,
``append``, ``check``, ``wait``, ``delete_key``, ``num_keys``, ``multi_get``, ``multi_set``, ``list_keys``,
``queue_push``, ``queue_pop``, ``queue_len`` and ``clone``, with ``has_extended_api()`` true, so gloo batches its
rendezvous through ``multi_get``. torch's C++ side reaches a Python store through a pybind11 trampoline that looks up
some methods by their C++ names, so those are here too: ``getNumKeys``, ``deleteKey``. The trampoline of torch 2.13
forwards no queue operation and no ``list_keys``: through the ``PrefixStore`` torch wraps every default store in,
those raise torch's own ``NotImplementedError``, as for every Python store; on the store itself they work.

    store = MpiStore.create(timeout=timedelta(minutes=5))      # collective: every rank of COMM_WORLD
    torch.distributed.init_process_group("gloo", store=store, rank=store.rank, world_size=store.world_size)
"""

from __future__ import annotations

import atexit
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.mpi._store_arguments import amount_of, key_of, keys_of, timeout_of, value_of, values_of
from lightning_dist_hooks.mpi._store_service import StoreService, duplicate_world

if TYPE_CHECKING:
    from mpi4py import MPI


class MpiStore(dist.Store):
    """torch's store interface over MPI point-to-point messages (see the module's description).

    Build it with :meth:`create` on every rank of ``COMM_WORLD`` (collective), or on every rank of ``comm`` with the
    constructor; ``comm`` becomes the store's own and must not carry other traffic.
    """

    def __init__(self, comm: MPI.Comm, timeout: timedelta = timedelta(minutes=5)) -> None:
        super().__init__()
        self.set_timeout(timeout)
        self._service = StoreService(comm)
        atexit.register(self.close)

    @classmethod
    def create(cls, timeout: timedelta = timedelta(minutes=5)) -> MpiStore:
        """A store on a communicator of its own, duplicated from ``COMM_WORLD``: every rank must call it.

        Raises ``torch.distributed.DistStoreError`` if not every rank of the MPI job calls it within ``timeout``.
        """
        return cls(duplicate_world(timeout), timeout)

    @property
    def rank(self) -> int:
        return self._service.rank

    @property
    def world_size(self) -> int:
        return self._service.world_size

    def home_of(self, key: str) -> int:
        """The rank that keeps ``key``."""
        return self._service.home_of(key)

    # --- one key ---

    @override
    def set(self, key: str, value: bytes | str) -> None:
        key = key_of("set", key)
        self._ask(key, "set", value_of("set", value))

    @override
    def get(self, key: str) -> bytes:
        values: list[bytes] = self._ask(key_of("get", key), "get")
        return values[0]

    @override
    def add(self, key: str, amount: int) -> int:
        key = key_of("add", key)
        result: int = self._ask(key, "add", amount_of("add", amount))
        return result

    def append(self, key: str, value: bytes | str) -> None:
        key = key_of("append", key)
        self._ask(key, "append", value_of("append", value))

    @override
    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        key = key_of("compare_set", key)
        result: bytes = self._ask(
            key, "compare_set", value_of("compare_set", expected), value_of("compare_set", desired)
        )
        return result

    @override
    def delete_key(self, key: str) -> bool:
        result: bool = self._ask(key_of("delete_key", key), "delete_key")
        return result

    # --- several keys ---

    @override
    def check(self, keys: list[str]) -> bool:
        return all(self._service.ask_each_home("check", keys_of("check", keys), self._timeout_s()).values())

    @override
    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Return once every key is set; ``timeout`` None or zero means the store's (torch's zero, "no timeout", would
        let a missing rank hang the job)."""
        keys = keys_of("wait", keys)
        self._service.ask_each_home("wait", keys, timeout_of("wait", timeout) or self._timeout_s())

    @override
    def multi_get(self, keys: list[str]) -> list[bytes]:
        keys = keys_of("multi_get", keys)
        by_home = self._service.ask_each_home("get", keys, self._timeout_s())
        values = {key: value for home, home_keys in self._service.by_home(keys).items() for key, value in
                  zip(home_keys, by_home[home], strict=True)}  # fmt: skip
        return [values[key] for key in keys]

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        keys, checked = keys_of("multi_set", keys), values_of("multi_set", values)
        if len(keys) != len(checked):
            raise ValueError(f"MpiStore.multi_set(): {len(keys)} keys but {len(checked)} values")
        by_key = dict(zip(keys, checked, strict=True))
        requests = [
            (home, "set", tuple(home_keys), tuple(by_key[key] for key in home_keys))
            for home, home_keys in self._service.by_home(keys).items()
        ]
        self._service.ask_many(requests, self._timeout_s())

    def has_extended_api(self) -> bool:
        """True: ``append``, ``multi_get`` and ``multi_set`` are the store's own (gloo then batches its rendezvous)."""
        return True

    # --- every rank ---

    @override
    def num_keys(self) -> int:
        return sum(self._service.ask_every_rank("num_keys", self._timeout_s()))

    @override
    def list_keys(self) -> list[str]:
        return [key for keys in self._service.ask_every_rank("list_keys", self._timeout_s()) for key in keys]

    # torch's trampoline calls these two by their C++ names (torch/csrc/distributed/c10d/init.cpp, PythonStore).
    def getNumKeys(self) -> int:  # noqa: N802 - the C++ name torch's trampoline looks up
        return self.num_keys()

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the C++ name torch's trampoline looks up
        return self.delete_key(key)

    # --- queues ---

    @override
    def queue_push(self, key: str, value: bytes | str) -> None:
        key = key_of("queue_push", key)
        self._ask(key, "queue_push", value_of("queue_push", value))

    @override
    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """The first item of the queue ``key``; waits for one up to the store's timeout, or with ``block`` False
        raises ``torch.distributed.QueueEmptyError`` at once."""
        result: bytes = self._ask(key_of("queue_pop", key), "queue_pop", bool(block))
        return result

    @override
    def queue_len(self, key: str) -> int:
        result: int = self._ask(key_of("queue_len", key), "queue_len")
        return result

    # --- handles ---

    def clone(self) -> MpiStore:
        """Another handle on this same store (torch's ``clone``: e.g. one per thread), with this one's timeout."""
        handle = MpiStore.__new__(MpiStore)
        dist.Store.__init__(handle)
        handle.set_timeout(self._timeout())
        handle._service = self._service
        self._service.handles.append(handle)
        return handle

    def close(self) -> None:
        """Stop answering once every rank is done with the store (see ``_store_service``); idempotent."""
        self._service.close(self._timeout_s())

    # --- asking ---

    def _timeout(self) -> timedelta:
        # The C++ store's, which torch's set_timeout changes (also through a PrefixStore wrapping this one).
        return self.timeout  # type: ignore[attr-defined]  # torch's stubs omit the property

    def _timeout_s(self) -> float:
        return float(self._timeout().total_seconds())

    def _ask(self, key: str, op: str, *args: Any) -> Any:
        return self._service.ask_many([(self.home_of(key), op, (key,), args)], self._timeout_s())[0]
