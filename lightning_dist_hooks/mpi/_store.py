"""A ``torch.distributed.Store`` whose operations travel over MPI: no socket, no file, every backend can meet in it.

``mpi://`` hands it to torch, so gloo, NCCL, composites and subgroups of any backend rendezvous where only an MPI
launcher started the ranks, and nothing listens on a port nor waits on a shared filesystem.

Who does what. The keys are spread over the ranks: key ``K`` is kept by rank ``crc32(K) % world_size``, its
*home*. Every rank runs one service thread that keeps its share of the keys (a
:class:`~lightning_dist_hooks.mpi._key_table.KeyTable`) and answers what other ranks ask of them. An operation on
one key (``set``, ``get``, ``add``, ``append``, ``compare_set``, ``delete_key``) is one message to the key's home
and one answer back; one on several keys (``wait``, ``check``, ``multi_get``, ``multi_set``) is one message to each
home involved, sent together; ``num_keys`` asks every rank. A home holds a ``get`` or ``wait`` whose keys are not
set yet and answers it when they are, or at its deadline with an error naming the keys and the ranks that never
reached them. An operation on a key this rank keeps itself sends no message. gloo's rendezvous (each rank sets
its address, then waits for and gets every peer's) thus costs every home about ``2 x world_size`` answers, and no
rank more than another.

The messages go on a communicator of the store's own (``MPI_Comm_idup`` of ``COMM_WORLD``), so they never meet a
user's own MPI traffic. MPI offers no blocking wait that sleeps (Open MPI's spins on a core), so the service thread
polls with ``MPI_Improbe`` (twice when the first finds nothing: see ``_probe``), sleeping between polls: 20 us after
any traffic, doubling up to ``max(1 ms, world_size x 50 us)`` while this rank has asked something or was asked
something in the last second, then up to 50 ms. A rank waiting for an answer sleeps on a lock the service thread
releases.

At exit every rank keeps answering until all ranks are done with the store (an ``MPI_Ibarrier`` on its
communicator, within the store's timeout), then stops its thread before mpi4py finalises MPI. A rank exiting after
a failure skips that: ``MPI_Abort`` ends the job instead (see ``_abort``).

    store = MpiStore.create(timeout=timedelta(minutes=5))      # collective: every rank of COMM_WORLD
    torch.distributed.init_process_group("gloo", store=store, rank=store.rank, world_size=store.world_size)
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from ._abort import failure_recorded
from ._key_table import Answer, KeyTable, Request
from ._mpi import init_mpi

if TYPE_CHECKING:
    from mpi4py import MPI

_REQUEST_TAG = 1
_ANSWER_TAG = 2
_FIRST_PAUSE_S = 20e-6
_ACTIVE_PAUSE_PER_RANK_S = 50e-6
_ACTIVE_PAUSE_MIN_S = 1e-3
_IDLE_PAUSE_S = 0.05
_ACTIVE_FOR_S = 1.0
# A home answers a held wait at its deadline; the asking rank gives up this much later, if the answer never comes.
_ANSWER_GRACE_S = 5.0


class MpiStore(dist.Store):
    """torch's store interface over MPI point-to-point messages; see the module's description for who does what.

    Build it with :meth:`create` on every rank of ``COMM_WORLD`` (collective), or on every rank of ``comm`` with the
    constructor; ``comm`` becomes the store's own and must not carry other traffic.
    """

    def __init__(self, comm: MPI.Comm, timeout: timedelta = timedelta(minutes=5)) -> None:
        super().__init__()
        self.set_timeout(timeout)
        self.rank: int = comm.Get_rank()
        self.world_size: int = comm.Get_size()
        self._comm = comm
        self._table = KeyTable(self.rank, self.world_size)
        self._lock = threading.Lock()  # the table, the waiting callers, the sends in flight
        self._request_ids = itertools.count(1)
        self._waiting: dict[int, _PendingAnswer] = {}
        self._sends: deque[MPI.Request] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._active_pause_s = _active_pause(self.world_size)
        self._last_activity = time.monotonic()
        self._service = threading.Thread(target=self._serve, name=f"mpi-store-rank{self.rank}", daemon=True)
        self._service.start()
        atexit.register(self.close)

    @classmethod
    def create(cls, timeout: timedelta = timedelta(minutes=5)) -> MpiStore:
        """A store on a communicator of its own, duplicated from ``COMM_WORLD``: every rank must call it.

        Raises ``torch.distributed.DistStoreError`` if not every rank of the MPI job calls it within ``timeout``.
        """
        mpi = init_mpi()
        world = mpi.COMM_WORLD
        deadline = time.monotonic() + timeout.total_seconds()
        # Every rank first waits for all to arrive (ranks start seconds apart), backing off to the idle pause; an
        # MPI_Ibarrier needs few rounds of messages. MPI_Idup then agrees on a context id in about twenty rounds,
        # each of which moves on only when the ranks involved test it again: polled at the idle pause, that took
        # 0.8 s with 32 ranks and 1.2 s with 128 on 2 cores. Every rank is there by then, so it polls as the service
        # thread does while active.
        _wait_for_every_rank(world.Ibarrier(), world, deadline, timeout, _IDLE_PAUSE_S)
        comm, duplicated = world.Idup()
        _wait_for_every_rank(duplicated, world, deadline, timeout, _active_pause(world.Get_size()))
        return cls(comm, timeout)

    def home_of(self, key: str) -> int:
        """The rank that keeps ``key``."""
        return zlib.crc32(key.encode()) % self.world_size

    # --- torch.distributed.Store ---

    def set(self, key: str, value: bytes | str) -> None:
        self._ask(self.home_of(key), "set", (key,), (_as_bytes(value),))

    def get(self, key: str) -> bytes:
        values: list[bytes] = self._ask(self.home_of(key), "get", (key,), (), self._timeout_s())
        return values[0]

    def add(self, key: str, amount: int) -> int:
        result: int = self._ask(self.home_of(key), "add", (key,), (int(amount),))
        return result

    def append(self, key: str, value: bytes | str) -> None:
        self._ask(self.home_of(key), "append", (key,), (_as_bytes(value),))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        result: bytes = self._ask(self.home_of(key), "compare_set", (key,), (_as_bytes(expected), _as_bytes(desired)))
        return result

    def delete_key(self, key: str) -> bool:
        result: bool = self._ask(self.home_of(key), "delete_key", (key,), ())
        return result

    def check(self, keys: list[str]) -> bool:
        return all(self._ask_each_home("check", keys, timeout_s=self._timeout_s()).values())

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Return once every key is set; ``timeout`` None or zero means the store's (torch's zero, "no timeout", would
        let a missing rank hang the job)."""
        timeout_s = timeout.total_seconds() if timeout else 0.0
        self._ask_each_home("wait", keys, timeout_s=timeout_s or self._timeout_s())

    def num_keys(self) -> int:
        return sum(self._ask_many([(home, "num_keys", (), ()) for home in range(self.world_size)], self._timeout_s()))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        by_home = self._ask_each_home("get", keys, timeout_s=self._timeout_s())
        values = {key: value for home, home_keys in _by_home(self, keys).items() for key, value in
                  zip(home_keys, by_home[home], strict=True)}  # fmt: skip
        return [values[key] for key in keys]

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        by_key = dict(zip(keys, (_as_bytes(value) for value in values), strict=True))
        requests = [
            (home, "set", tuple(home_keys), tuple(by_key[key] for key in home_keys))
            for home, home_keys in _by_home(self, keys).items()
        ]
        self._ask_many(requests, self._timeout_s())

    # --- exit ---

    def close(self) -> None:
        """Stop answering once every rank is done with the store (see the module's description); idempotent."""
        if self._stopping or not self._service.is_alive():
            return
        if not failure_recorded():
            self._serve_until_every_rank_closes()
        self._stopping = True
        self._wake.set()
        self._service.join(timeout=_ANSWER_GRACE_S)

    def _serve_until_every_rank_closes(self) -> None:
        done = self._comm.Ibarrier()
        deadline = time.monotonic() + self._timeout_s()
        while not done.Test():
            if time.monotonic() > deadline:
                # Not an error of this rank: a peer still uses the store (or hangs); it will time out on its own.
                return
            time.sleep(_IDLE_PAUSE_S / 5)

    # --- asking ---

    def _timeout_s(self) -> float:
        # The C++ store's, which torch's set_timeout changes (also through a PrefixStore wrapping this one).
        return float(self.timeout.total_seconds())  # type: ignore[attr-defined]  # torch's stubs omit the property

    def _ask(self, home: int, op: str, keys: tuple[str, ...], args: tuple[Any, ...], timeout_s: float = 0.0) -> Any:
        return self._ask_many([(home, op, keys, args)], timeout_s or self._timeout_s())[0]

    def _ask_each_home(self, op: str, keys: Sequence[str], timeout_s: float) -> dict[int, Any]:
        groups = _by_home(self, keys)
        results = self._ask_many([(home, op, tuple(home_keys), ()) for home, home_keys in groups.items()], timeout_s)
        return dict(zip(groups, results, strict=True))

    def _ask_many(
        self, requests: Iterable[tuple[int, str, tuple[str, ...], tuple[Any, ...]]], timeout_s: float
    ) -> list[Any]:
        """Send each ``(home, op, keys, args)`` at once, then wait for every answer, in order; raise the first error."""
        pending = []
        local_answers: list[Answer] = []
        with self._lock:
            for home, op, keys, args in requests:
                request_id = next(self._request_ids)
                answer = self._waiting[request_id] = _PendingAnswer(request_id, home, op, keys)
                pending.append(answer)
                request = Request(self.rank, request_id, op, keys, args, timeout_s)
                if home == self.rank:
                    local_answers += self._handled(request)
                else:
                    self._sends.append(self._comm.isend(request, dest=home, tag=_REQUEST_TAG))
            self._last_activity = time.monotonic()
            self._deliver(local_answers)
        self._wake.set()  # the service thread polls for the answers from now on, at its shortest pause
        deadline = time.monotonic() + timeout_s + _ANSWER_GRACE_S
        try:
            return [answer.result(deadline - time.monotonic()) for answer in pending]
        finally:
            with self._lock:
                for answer in pending:
                    self._waiting.pop(answer.request_id, None)

    # --- the service thread ---

    def _serve(self) -> None:
        pause = _FIRST_PAUSE_S
        status = init_mpi().Status()
        while not self._stopping:
            received = False
            while (message := self._probe(status)) is not None:
                received = True
                payload = message.recv()
                with self._lock:
                    if status.Get_tag() == _ANSWER_TAG:
                        self._deliver([Answer(self.rank, *payload)])
                    else:
                        self._deliver(self._handled(payload))
            now = time.monotonic()
            with self._lock:
                self._deliver(self._table.expire(now))
                _complete_sends(self._sends)
                if received:
                    self._last_activity = now
                busy = bool(self._waiting) or now - self._last_activity < _ACTIVE_FOR_S
                next_deadline = self._table.next_deadline()
            pause = _FIRST_PAUSE_S if received else min(pause * 2, self._active_pause_s if busy else _IDLE_PAUSE_S)
            sleep = pause if next_deadline is None else max(0.0, min(pause, next_deadline - now))
            if self._wake.wait(sleep):
                self._wake.clear()
                pause = _FIRST_PAUSE_S

    def _handled(self, request: Request) -> list[Answer]:
        """The table's answers to ``request``; an unexpected error is the asking rank's to raise, never the end of the
        service thread (which would leave every rank asking this one to wait until its timeout)."""
        try:
            return self._table.handle(request, time.monotonic())
        except Exception as error:  # any error: the thread must go on answering
            failure = f"{type(error).__name__}: {error}"
            text = f"rank {self.rank} failed to answer {request.op!r} of {list(request.keys)}: {failure}"
            return [Answer(request.source, request.request_id, False, text)]

    def _probe(self, status: MPI.Status) -> MPI.Message | None:
        """The next message for this rank's store, if one has arrived.

        Open MPI's ``MPI_Improbe`` looks in its matching queues and, finding nothing there, progresses MPI (which
        moves the messages that have arrived into those queues) and answers "nothing": a message that arrived while
        the service thread slept is found by the probe after, one pause later. So a probe that finds nothing
        probes again at once.
        """
        message = self._comm.improbe(status=status)
        return message if message is not None else self._comm.improbe(status=status)

    def _deliver(self, answers: list[Answer]) -> None:
        """Hand each answer to this rank's waiting caller, or send it to the asking rank (the lock is held)."""
        for answer in answers:
            if answer.destination == self.rank:
                waiting = self._waiting.pop(answer.request_id, None)
                if waiting is not None:  # None: its caller gave up before the answer came
                    waiting.complete(answer)
            else:
                payload = (answer.request_id, answer.ok, answer.result, answer.error_type)
                self._sends.append(self._comm.isend(payload, dest=answer.destination, tag=_ANSWER_TAG))


class _PendingAnswer:
    """One operation this rank asked of a home, until its answer comes: the caller sleeps on a lock."""

    __slots__ = ("_answer", "_arrived", "home", "keys", "op", "request_id")

    def __init__(self, request_id: int, home: int, op: str, keys: tuple[str, ...]) -> None:
        self.request_id, self.home, self.op, self.keys = request_id, home, op, keys
        self._arrived = threading.Lock()
        self._arrived.acquire()
        self._answer: Answer | None = None

    def complete(self, answer: Answer) -> None:
        self._answer = answer
        self._arrived.release()

    def result(self, within_s: float) -> Any:
        if not self._arrived.acquire(timeout=max(within_s, 0.001)):
            raise dist.DistStoreError(
                f"Wait timeout: rank {self.home}, which keeps the keys {list(self.keys)} of the mpi:// store, did not "
                f"answer {self.op!r} within the store's timeout: it hangs, or has stopped serving the store."
            )
        assert self._answer is not None
        if not self._answer.ok:
            raise (ValueError if self._answer.error_type == "ValueError" else dist.DistStoreError)(self._answer.result)
        return self._answer.result


def _active_pause(world_size: int) -> float:
    """The longest pause between polls while a rank is active: however many ranks a job has, all of them together
    poll ``1 / _ACTIVE_PAUSE_PER_RANK_S`` times a second at most, once every rank polls that seldom."""
    return max(_ACTIVE_PAUSE_MIN_S, world_size * _ACTIVE_PAUSE_PER_RANK_S)


def _wait_for_every_rank(
    request: MPI.Request, world: MPI.Comm, deadline: float, timeout: timedelta, longest_pause: float
) -> None:
    """Test ``request``, a collective of ``world`` (every rank must test it for it to progress), sleeping between
    tests from ``_FIRST_PAUSE_S`` doubling up to ``longest_pause``, until it completes or ``deadline`` passes."""
    pause = _FIRST_PAUSE_S
    while not request.Test():
        if time.monotonic() > deadline:
            raise dist.DistStoreError(
                f"Wait timeout: rank {world.Get_rank()} of {world.Get_size()} waited {timeout.total_seconds():g} s "
                "for every rank of the MPI job to reach the mpi:// rendezvous; some never did (MPI cannot tell "
                "which before they arrive). Check that every rank was started and creates its process group."
            )
        time.sleep(pause)
        pause = min(pause * 2, longest_pause)


def _by_home(store: MpiStore, keys: Sequence[str]) -> dict[int, list[str]]:
    groups: dict[int, list[str]] = {}
    for key in keys:
        groups.setdefault(store.home_of(key), []).append(key)
    return groups


def _complete_sends(sends: deque[MPI.Request]) -> None:
    """Forget the sends that have completed (mpi4py keeps each message's buffer alive until then)."""
    for _ in range(len(sends)):
        send = sends.popleft()
        if not send.Test():
            sends.append(send)


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
