"""The progress engine: one thread per process that completes point-to-point requests and is the watchdog.

Point-to-point operations are posted as non-blocking ``I...`` requests (blocking sends could deadlock send/send
pairs) and complete in ``wait()`` or in the progress thread, which polls them with ``Testall``. MPI progress is
global, so this one thread serves the requests of every group.

MPI operations cannot time out or be cancelled, so the progress thread is also a watchdog over all three routes an
operation takes (the caller's thread, a group's :class:`CollectiveQueue`, posted requests): an operation still
running after its process group's timeout ends the whole job with ``MPI_Abort`` and a message on stderr. An MPI
error (a peer that died, a broken connection) also ends the job, with a message saying so.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from lightning_dist_hooks.mpi._abort import abort_job
from lightning_dist_hooks.mpi._collective_queue import STOP_JOIN_TIMEOUT_S, CollectiveQueue
from lightning_dist_hooks.mpi._operation_records import BlockingCall, Deadline, MpiCall, deadline_of
from lightning_dist_hooks.mpi._work import RequestWork

if TYPE_CHECKING:
    from mpi4py import MPI

# The progress thread sleeps between polls of point-to-point requests, doubling the pause while nothing completes.
_POLL_PAUSE_MIN_S = 20e-6
_POLL_PAUSE_MAX_S = 200e-6
# How often deadlines are checked while the thread has nothing to poll, or while a caller's blocking wait holds
# the request lock.
_WATCHDOG_PERIOD_S = 0.1


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
        self._thread.join(STOP_JOIN_TIMEOUT_S)

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
