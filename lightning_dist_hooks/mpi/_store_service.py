"""What every handle on one ``mpi://`` store shares: its communicator, this rank's share of the keys, the callers
waiting for answers, and the service thread that answers the other ranks.

:class:`~lightning_dist_hooks.mpi._store.MpiStore` is torch's face of it (the method names, the argument checks);
each ``clone()`` of a store is one more face on the same service, as torch's stores clone.

Who does what. The keys are spread over the ranks: key ``K`` is kept by rank ``crc32(K) % world_size``, its
*home*. Every rank runs one service thread that keeps its share of the keys (a
:class:`~lightning_dist_hooks.mpi._key_table.KeyTable`) and answers what other ranks ask of them. An operation on
one key (``set``, ``get``, ``add``, ``append``, ``compare_set``, ``delete_key``, the queue operations) is one message
to the key's home and one answer back; one on several keys (``wait``, ``check``, ``multi_get``, ``multi_set``) is
one message to each home involved, sent together; ``num_keys`` and ``list_keys`` ask every rank. A home holds a
``get``, ``wait`` or blocking ``queue_pop`` whose keys are not there yet and answers it when they are, or at its
deadline with an error naming the keys and the ranks that never reached them. An operation on a key this rank keeps
itself sends no message. gloo's rendezvous (each rank sets its address, then waits for and gets every peer's) thus
costs every home about ``2 x world_size`` answers, and no rank more than another.

The messages go on a communicator of the store's own (``MPI_Comm_idup`` of ``COMM_WORLD``), so they never meet a
user's own MPI traffic. MPI offers no blocking wait that sleeps (Open MPI's spins on a core), so the service thread
polls with ``MPI_Improbe`` (twice when the first finds nothing: see ``_probe``), sleeping between polls
(:class:`PollPauses`). A rank waiting for an answer sleeps on a lock the service thread releases.

At exit every rank keeps answering until all ranks are done with the store (an ``MPI_Ibarrier`` on its
communicator, within the store's timeout), then stops its thread before mpi4py finalises MPI. A rank exiting after
a failure skips that: ``MPI_Abort`` ends the job instead (see ``_abort``).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from lightning_dist_hooks.launcher_variables import local_rank_count
from lightning_dist_hooks.mpi._abort import failure_recorded
from lightning_dist_hooks.mpi._key_table import Answer, KeyTable, Request
from lightning_dist_hooks.mpi._mpi import init_mpi

if TYPE_CHECKING:
    from mpi4py import MPI

_REQUEST_TAG = 1
_ANSWER_TAG = 2
_IDLE_PAUSE_S = 0.05
_ACTIVE_FOR_S = 1.0
# A home answers a held wait at its deadline; the asking rank gives up this much later, if the answer never comes.
_ANSWER_GRACE_S = 5.0
# The error classes an answer may name (``Answer.error_type``), as torch's own stores raise them.
_ERROR_TYPES: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "QueueEmptyError": dist.QueueEmptyError,
    "DistStoreError": dist.DistStoreError,
}

Operation = tuple[int, str, tuple[str, ...], tuple[Any, ...]]  # (home, op, keys, args)


@dataclass(frozen=True)
class PollPauses:
    """How long the service thread sleeps between polls: ``first`` after any traffic, doubling up to ``active``
    while this rank asked or was asked something in the last second, then up to the idle pause.

    Both grow with the ranks that share each core of this node, so that the idle ranks of an oversubscribed node do
    not poll the cores away from the ranks whose answers they wait for; with a core per rank the pauses are the
    shortest. On the 2-core machine the benchmark ran on, answering rather than polling took the cores, and this
    changed the time to a first barrier by less than the noise (docs/benchmarks.md, "The mpi:// store")."""

    first: float
    active: float

    FIRST_PER_RANK_PER_CORE_S = 20e-6
    ACTIVE_PER_RANK_S = 50e-6
    ACTIVE_MIN_S = 1e-3

    @classmethod
    def for_job(cls, world_size: int, ranks_on_node: int | None = None, cores: int | None = None) -> PollPauses:
        """The pauses for a job of ``world_size`` ranks, ``ranks_on_node`` of them (default: as the launcher says)
        sharing ``cores`` (default: the node's).

        >>> PollPauses.for_job(2, ranks_on_node=2, cores=16)
        PollPauses(first=2e-05, active=0.001)
        >>> pauses = PollPauses.for_job(128, ranks_on_node=128, cores=2)
        >>> round(pauses.first * 1e6), round(pauses.active * 1e6)  # microseconds
        (1280, 6400)
        """
        ranks_on_node = ranks_on_node or local_rank_count(os.environ) or 1
        # Not this rank's affinity: a launcher that binds each rank to one core still shares the node's cores.
        cores = cores or os.cpu_count() or 1
        ranks_per_core = max(1.0, ranks_on_node / cores)
        first = cls.FIRST_PER_RANK_PER_CORE_S * ranks_per_core
        active = max(cls.ACTIVE_MIN_S, world_size * cls.ACTIVE_PER_RANK_S, first)
        return cls(first, active)


class StoreService:
    """One rank's part of an ``mpi://`` store on ``comm`` (see the module's description); shared by every handle."""

    def __init__(self, comm: MPI.Comm, pauses: PollPauses | None = None) -> None:
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
        self._pauses = pauses or PollPauses.for_job(self.world_size)
        self._last_activity = time.monotonic()
        # Every handle given out by clone(): torch's C++ side keeps only the C++ half of a Python store alive, so a
        # clone whose Python half were collected would lose its methods ("pure virtual function") mid-job.
        self.handles: list[object] = []
        self.thread = threading.Thread(target=self._serve, name=f"mpi-store-rank{self.rank}", daemon=True)
        self.thread.start()

    def home_of(self, key: str) -> int:
        """The rank that keeps ``key``."""
        return zlib.crc32(key.encode("utf-8", "surrogateescape")) % self.world_size

    def by_home(self, keys: Sequence[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for key in keys:
            groups.setdefault(self.home_of(key), []).append(key)
        return groups

    # --- asking ---

    def ask_each_home(self, op: str, keys: Sequence[str], timeout_s: float) -> dict[int, Any]:
        """``op`` on ``keys``, one request to each home involved; each home's result."""
        groups = self.by_home(keys)
        results = self.ask_many([(home, op, tuple(home_keys), ()) for home, home_keys in groups.items()], timeout_s)
        return dict(zip(groups, results, strict=True))

    def ask_every_rank(self, op: str, timeout_s: float) -> list[Any]:
        return self.ask_many([(home, op, (), ()) for home in range(self.world_size)], timeout_s)

    def ask_many(self, requests: Iterable[Operation], timeout_s: float) -> list[Any]:
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

    # --- exit ---

    def close(self, timeout_s: float) -> None:
        """Stop answering once every rank is done with the store (see the module's description); idempotent."""
        if self._stopping or not self.thread.is_alive():
            return
        if not failure_recorded():
            self._serve_until_every_rank_closes(timeout_s)
        self._stopping = True
        self._wake.set()
        self.thread.join(timeout=_ANSWER_GRACE_S)

    def _serve_until_every_rank_closes(self, timeout_s: float) -> None:
        done = self._comm.Ibarrier()
        deadline = time.monotonic() + timeout_s
        while not done.Test():
            if time.monotonic() > deadline:
                # Not an error of this rank: a peer still uses the store (or hangs); it will time out on its own.
                return
            time.sleep(_IDLE_PAUSE_S / 5)

    # --- the service thread ---

    def _serve(self) -> None:
        pause = self._pauses.first
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
            longest = self._pauses.active if busy else _IDLE_PAUSE_S
            pause = self._pauses.first if received else min(pause * 2, longest)
            sleep = pause if next_deadline is None else max(0.0, min(pause, next_deadline - now))
            if self._wake.wait(sleep):
                self._wake.clear()
                pause = self._pauses.first

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


def duplicate_world(timeout: timedelta) -> MPI.Comm:
    """A communicator of its own for a store, duplicated from ``COMM_WORLD``: collective, within ``timeout``.

    Raises ``torch.distributed.DistStoreError`` if not every rank of the MPI job calls it within ``timeout``.
    """
    mpi = init_mpi()
    world = mpi.COMM_WORLD
    deadline = time.monotonic() + timeout.total_seconds()
    # Every rank first waits for all to arrive (ranks start seconds apart), backing off to the idle pause; an
    # MPI_Ibarrier needs few rounds of messages. MPI_Idup then agrees on a context id in about twenty rounds, each of
    # which moves on only when the ranks involved test it again: polled at the idle pause, that took 0.8 s with 32
    # ranks and 1.2 s with 128 on 2 cores. Every rank is there by then, so it polls as the service thread does while
    # active.
    pauses = PollPauses.for_job(world.Get_size())
    _wait_for_every_rank(world.Ibarrier(), world, deadline, timeout, pauses.first, _IDLE_PAUSE_S)
    comm, duplicated = world.Idup()
    _wait_for_every_rank(duplicated, world, deadline, timeout, pauses.first, pauses.active)
    return comm


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
            raise _ERROR_TYPES.get(self._answer.error_type, dist.DistStoreError)(self._answer.result)
        return self._answer.result


def _wait_for_every_rank(
    request: MPI.Request, world: MPI.Comm, deadline: float, timeout: timedelta, first: float, longest: float
) -> None:
    """Test ``request``, a collective of ``world`` (every rank must test it for it to progress), sleeping between
    tests from ``first`` doubling up to ``longest``, until it completes or ``deadline`` passes."""
    pause = first
    while not request.Test():
        if time.monotonic() > deadline:
            raise dist.DistStoreError(
                f"Wait timeout: rank {world.Get_rank()} of {world.Get_size()} waited {timeout.total_seconds():g} s "
                "for every rank of the MPI job to reach the mpi:// rendezvous; some never did (MPI cannot tell "
                "which before they arrive). Check that every rank was started and creates its process group."
            )
        time.sleep(pause)
        pause = min(pause * 2, longest)


def _complete_sends(sends: deque[MPI.Request]) -> None:
    """Forget the sends that have completed (mpi4py keeps each message's buffer alive until then)."""
    for _ in range(len(sends)):
        send = sends.popleft()
        if not send.Test():
            sends.append(send)
