"""Run MPI operations behind torch ``Work`` objects, complete them in the background, end the job on a hang.

Three ways to run an operation:

* on the caller's thread, with the blocking MPI call, when the caller waits right away (``async_op=False``
  arrives as ``opts.asyncOp == False``) or when the collective is so small that a thread hand-off would cost more
  than the transfer (``EAGER_COLLECTIVE_BYTES``). A :class:`CompletedWork` is returned.
* on the process group's :class:`CollectiveQueue` otherwise (DDP's bucket all-reduces, ``async_op=True``): one
  thread per group runs the *blocking* MPI call of each collective, in the order they were issued, and completes
  the work's future. This is the route of torch's own ``ProcessGroupMPI``. A blocking MPI collective runs Open
  MPI's tuned algorithms and drives its own progress; a non-blocking one (libnbc) only advances while some thread
  is inside MPI, so a background thread that polls it and sleeps in between advances it one round per poll
  (measured: 1 ms for any all-reduce up to 1 MiB, 10x the blocking call).
* point-to-point operations are posted as ``I...`` requests (blocking sends could deadlock send/send pairs) and
  complete in ``wait()`` or in the progress thread, which polls them with ``Testall``.

MPI operations cannot time out or be cancelled, so the progress thread is also a watchdog: an operation still
running after its process group's timeout ends the whole job with ``MPI_Abort`` and a message on stderr. An MPI
error (a peer that died, a broken connection) also ends the job, with a message saying so.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.distributed as dist

from ._abort import abort_job

if TYPE_CHECKING:
    from mpi4py import MPI

# A non-blocking collective of at most this many bytes runs to completion on the caller's thread: handing it to
# the group's thread and waking the waiter afterwards costs two thread switches (tens of microseconds on a loaded
# node), more than such a transfer takes (a 256 KiB all-reduce of 2 ranks: about 60 us on shared memory), and
# there is nothing worth overlapping. Larger ones are queued so that DDP overlaps them with backward.
EAGER_COLLECTIVE_BYTES = 256 << 10
# The progress thread sleeps between polls of point-to-point requests, doubling the pause while nothing completes.
_POLL_PAUSE_MIN_S = 20e-6
_POLL_PAUSE_MAX_S = 200e-6
# How often deadlines are checked while the thread has nothing to poll, or while a caller's blocking wait holds
# the request lock.
_WATCHDOG_PERIOD_S = 0.1
_STOP_JOIN_TIMEOUT_S = 5.0


class MpiCall(NamedTuple):
    """One MPI operation: a blocking ``mpi4py.MPI.Comm`` method name and its arguments.

    The non-blocking twin is ``"I" + method.lower()`` (``Send`` -> ``Isend``, ``Recv`` -> ``Irecv``).
    ``tensors`` own the memory the arguments point at and are kept alive until the operation completes.
    """

    method: str
    args: tuple
    tensors: tuple[torch.Tensor, ...]


class Deadline(NamedTuple):
    """When an operation must have completed, and how to name it if it has not."""

    at: float  # time.monotonic()
    timeout: timedelta
    describe: Callable[[], str]  # called only for the timeout message: formatting costs more than a small op
    group: str


class GroupWatch(NamedTuple):
    """What the watchdog needs to know of a process group to time and name its operations."""

    timeout: timedelta
    group: str


# A blocking call in progress: ``(started_at, watch, describe, *describe_args)``, where ``started_at`` is
# ``time.monotonic()``. A plain tuple, since it is built on every blocking call's path; the watchdog turns it into
# a ``Deadline`` (``deadline_of``) only when it checks it.
BlockingCall = tuple


def deadline_of(call: BlockingCall) -> Deadline:
    started_at, watch, describe, *describe_args = call
    return Deadline(
        started_at + watch.timeout.total_seconds(), watch.timeout, partial(describe, *describe_args), watch.group
    )


class CompletedWork(dist.Work):
    """The ``Work`` of an operation that ran to completion before the collective call returned.

    Built by :func:`completed_work` on every blocking collective's path: slots and no Python ``__init__`` make it
    cheaper than a work that sets its outputs in ``__init__``.
    """

    __slots__ = ("_outputs",)
    _outputs: list[torch.Tensor]  # set by completed_work()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._outputs


def completed_work(outputs: list[torch.Tensor]) -> CompletedWork:
    work = CompletedWork()
    work._outputs = outputs
    return work


class PendingWork(dist.Work):
    """The ``Work`` of an operation that completes in the background.

    ``wait()`` blocks until it completes; ``get_future()`` returns a future that completes with the output
    tensors also when nobody calls ``wait()``.
    """

    def __init__(self, outputs: list[torch.Tensor], deadline: Deadline, finish: Callable[[], object] | None) -> None:
        super().__init__()
        self.deadline = deadline
        self._outputs = outputs
        self._finish = finish
        self._done = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future = torch.futures.Future()

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def shorten_deadline(self, timeout: timedelta) -> None:
        """Honour ``wait(timeout)`` where it is shorter than the group's timeout: the watchdog ends the job then."""
        if timeout and timeout < self.deadline.timeout:
            self.deadline = self.deadline._replace(at=time.monotonic() + timeout.total_seconds(), timeout=timeout)

    def run_finish(self) -> None:
        """Mark the operation done after its MPI calls completed, running its finishing step (copy back, average)."""
        try:
            if self._finish is not None:
                self._finish()
        except Exception as error:  # surfaced through wait() and the future, like a failed collective
            self._error = error
        self._done = True

    def publish(self) -> None:
        if self._error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(self._error)


class QueuedWork(PendingWork):
    """A collective run by its group's :class:`CollectiveQueue`."""

    def __init__(
        self,
        outputs: list[torch.Tensor],
        deadline: Deadline,
        finish: Callable[[], object] | None,
        calls: Sequence[MpiCall],
    ) -> None:
        super().__init__(outputs, deadline, finish)
        self.calls = calls  # keeps the tensors the MPI calls point at alive until they ran

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self.shorten_deadline(timeout)
        if not self._done:
            # Blocks without the GIL; the watchdog bounds the wait. A failed finishing step is raised below.
            with contextlib.suppress(Exception):
                self._future.wait()
        if self._error is not None:
            raise self._error
        return True


class RequestWork(PendingWork):
    """A point-to-point operation posted as non-blocking MPI requests."""

    def __init__(
        self,
        engine: ProgressEngine,
        outputs: list[torch.Tensor],
        deadline: Deadline,
        finish: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(outputs, deadline, finish)
        self._engine = engine
        self._calls: Sequence[MpiCall] = ()
        self._requests: list[MPI.Request] = []
        self._statuses: list[MPI.Status] | None = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self.shorten_deadline(timeout)
        self._engine.complete(self)
        if self._error is not None:
            raise self._error
        return True

    def source_rank(self) -> int:
        """The sender of a receive from any source (``torch.distributed.recv(src=None)``)."""
        if self._statuses is None:
            raise RuntimeError(f"{self.deadline.describe()} has no source rank: it is not a receive from any rank.")
        self._engine.complete(self)
        return self._statuses[0].Get_source()

    _source_rank = source_rank

    # --- used by ProgressEngine ---------------------------------------------------------------------------

    def want_source(self, mpi: ModuleType) -> None:
        self._statuses = [mpi.Status()]

    def post(self, comm: MPI.Comm, calls: Sequence[MpiCall]) -> None:
        self._calls = calls  # keeps the tensors the MPI calls point at alive
        self._requests = [getattr(comm, "I" + call.method.lower())(*call.args) for call in calls]

    def complete_requests(self, mpi: ModuleType, block: bool) -> bool:
        """Test (or wait for) the requests; return True if this call completed the work.

        The caller holds the engine's request lock: MPI forbids two threads completing the same request.
        """
        if self._done:
            return False
        if block:
            mpi.Request.Waitall(self._requests, self._statuses)
        elif not mpi.Request.Testall(self._requests, self._statuses):
            return False
        self.run_finish()
        self._calls = ()
        return True


class CollectiveQueue:
    """One process group's queued collectives, run in issue order as blocking MPI calls by a thread of its own.

    MPI requires every rank to call a communicator's collectives in the same order; the queue keeps the order the
    caller issued them in, and a blocking collective issued while the queue is not empty joins the queue too
    (:meth:`is_idle`). The thread starts with the first queued collective.
    """

    def __init__(self, engine: ProgressEngine, comm: MPI.Comm) -> None:
        self._engine = engine
        self._comm = comm
        # The hand-over: a C queue whose get() waits without the GIL and wakes at once (a Condition costs more).
        self._to_run: queue.SimpleQueue[QueuedWork | None] = queue.SimpleQueue()  # None: stop
        # Submitted and not finished, oldest first (for the watchdog). Appended by the issuing thread, popped by the
        # queue's thread: deque's append and popleft are atomic.
        self._unfinished: deque[QueuedWork] = deque()
        self._thread: threading.Thread | None = None

    def is_idle(self) -> bool:
        """Whether every queued collective has completed: a new one may then run on the caller's thread."""
        return not self._unfinished

    def submit(self, work: QueuedWork) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mpi4py-collectives", daemon=True)
            self._thread.start()
            self._engine.adopt(self)
        self._unfinished.append(work)
        self._to_run.put(work)

    def unfinished(self) -> list[QueuedWork]:
        """The running and the queued collectives (for the watchdog)."""
        return list(self._unfinished)

    def stop(self) -> None:
        """Let the thread finish what is queued, then end it."""
        if self._thread is not None:
            self._to_run.put(None)
            if self._thread is not threading.current_thread():
                self._thread.join(_STOP_JOIN_TIMEOUT_S)

    def _run(self) -> None:
        mpi_error = self._engine.mpi.Exception
        while (work := self._to_run.get()) is not None:
            try:
                for call in work.calls:
                    getattr(self._comm, call.method)(*call.args)  # mpi4py releases the GIL inside
            except mpi_error as error:
                self._engine.abort_failed(work.deadline, error)
            work.calls = ()
            work.run_finish()
            self._unfinished.popleft()
            work.publish()


class ProgressEngine:
    """Watches the deadlines of every mpi4py process group's operations and completes point-to-point requests.

    One engine per process: MPI progress is global, so one thread can drive the requests of all groups.
    """

    _instance: ProgressEngine | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def instance(cls, mpi: ModuleType) -> ProgressEngine:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls(mpi)
            return cls._instance

    def __init__(self, mpi: ModuleType) -> None:
        self.mpi = mpi
        self._request_lock = threading.Lock()
        self._state = threading.Condition()
        self._posted: dict[int, RequestWork] = {}  # posted and not completed; guarded by _state
        # Blocking calls in progress, by thread. Plain dict updates (atomic under the GIL) keep them cheap.
        self._blocking: dict[int, BlockingCall] = {}
        self._queues: list[CollectiveQueue] = []  # those whose thread started
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mpi4py-progress", daemon=True)
        self._thread.start()
        # Python's atexit handlers run before mpi4py finalises MPI: no MPI call may follow MPI_Finalize.
        atexit.register(self.stop)

    def adopt(self, queue: CollectiveQueue) -> None:
        """Watch ``queue``'s collectives and stop its thread at exit."""
        with self._state:
            self._queues.append(queue)

    def release(self, queue: CollectiveQueue) -> None:
        """Stop ``queue``'s thread once its collectives completed (its group is being destroyed)."""
        queue.stop()
        with self._state:
            if queue in self._queues:
                self._queues.remove(queue)

    def run_blocking(self, comm: MPI.Comm, calls: Sequence[MpiCall], blocking_call: BlockingCall) -> None:
        """Run ``calls`` to completion on the calling thread, under the watchdog."""
        for call in calls:
            self.call_blocking(blocking_call, getattr(comm, call.method), *call.args)

    def call_blocking(self, blocking_call: BlockingCall, function: Callable[..., object], *args: object) -> None:
        """Call the blocking MPI ``function(*args)`` on the calling thread, watched as ``blocking_call``."""
        thread = threading.get_ident()
        self._blocking[thread] = blocking_call
        try:
            function(*args)
        except self.mpi.Exception as error:
            self.abort_failed(deadline_of(blocking_call), error)
        finally:
            del self._blocking[thread]

    def post(self, work: RequestWork, comm: MPI.Comm, calls: Sequence[MpiCall]) -> None:
        """Post ``calls`` as non-blocking operations completing ``work``."""
        work.post(comm, calls)
        with self._state:
            self._posted[id(work)] = work
            self._state.notify()

    def complete(self, work: RequestWork) -> None:
        """Block the calling thread until ``work`` completes (or the watchdog ends the job)."""
        if work.is_completed():
            return
        # The lock is held for one Testall by the progress thread, or by another caller's Waitall, which its own
        # deadline bounds: this wait is bounded too.
        with self._request_lock:
            try:
                completed_here = work.complete_requests(self.mpi, block=True)
            except self.mpi.Exception as error:
                self.abort_failed(work.deadline, error)
        if completed_here:
            self._retire(work)

    def stop(self) -> None:
        with self._state:
            self._stopping = True
            queues, self._queues = self._queues, []
            self._state.notify()
        for collective_queue in queues:
            collective_queue.stop()
        self._thread.join(_STOP_JOIN_TIMEOUT_S)

    def abort_failed(self, deadline: Deadline, error: BaseException) -> None:
        abort_job(
            self.mpi,
            f"{deadline.describe()} on {deadline.group} failed with an MPI error ({error}). The other ranks cannot "
            "complete it now (most often a peer process died or its connection broke), so the job is ended with "
            "MPI_Abort.",
        )

    def _retire(self, work: RequestWork) -> None:
        with self._state:
            self._posted.pop(id(work), None)
        work.publish()

    def _run(self) -> None:
        pause = _POLL_PAUSE_MIN_S
        while True:
            with self._state:
                while not self._posted and not self._stopping:
                    self._abort_if_overdue()
                    self._state.wait(_WATCHDOG_PERIOD_S)
                if self._stopping:
                    return
                self._abort_if_overdue()
                posted = list(self._posted.values())
            completed = self._test(posted)
            for work in completed:
                self._retire(work)
            pause = _POLL_PAUSE_MIN_S if completed else min(2 * pause, _POLL_PAUSE_MAX_S)
            time.sleep(pause)

    def _test(self, works: list[RequestWork]) -> list[RequestWork]:
        # A caller blocked in Waitall holds the lock and drives MPI progress itself; come back for the deadlines.
        if not self._request_lock.acquire(timeout=_WATCHDOG_PERIOD_S):
            return []
        completed = []
        try:
            for work in works:
                if work.complete_requests(self.mpi, block=False):
                    completed.append(work)
        except self.mpi.Exception as error:
            self.abort_failed(work.deadline, error)
        finally:
            self._request_lock.release()
        return completed

    def _abort_if_overdue(self) -> None:
        now = time.monotonic()
        deadlines = [work.deadline for work in self._posted.values()]
        deadlines += [work.deadline for queue in self._queues for work in queue.unfinished()]
        deadlines += [deadline_of(call) for call in list(self._blocking.values())]  # list(): one atomic copy
        for deadline in deadlines:
            if now > deadline.at:
                self._abort_overdue(deadline)

    def _abort_overdue(self, deadline: Deadline) -> None:
        abort_job(
            self.mpi,
            f"{deadline.describe()} on {deadline.group} did not complete within the process group timeout "
            f"({deadline.timeout.total_seconds():g} s), and MPI reported no error: the peers are alive as far as "
            "MPI knows (a rank that dies or fails ends the job at once), so one of them is stuck or skipped or "
            "reordered this collective. MPI operations cannot time out or be cancelled, so the job is ended with "
            "MPI_Abort.",
        )
