"""One process group's queue of collectives, run in issue order as *blocking* MPI calls by a thread of its own.

The route of a collective that the caller does not wait for and that is too large to run on the caller's thread
(DDP's gradient buckets, ``async_op=True``), and the route of torch's own ``ProcessGroupMPI``. A blocking MPI
collective runs Open MPI's tuned algorithms and drives its own progress; a non-blocking one (libnbc) only advances
while some thread is inside MPI, so a background thread that polls it and sleeps in between advances it one round
per poll (measured: 1 ms for any all-reduce up to 1 MiB, 10x the blocking call).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mpi4py import MPI

    from lightning_dist_hooks.mpi._operation_records import Deadline
    from lightning_dist_hooks.mpi._work import QueuedWork

# How long stopping waits for a thread (a queue's, the progress thread) to finish what it has before moving on.
STOP_JOIN_TIMEOUT_S = 5.0


class QueueKeeper(Protocol):
    """What a queue needs of the progress engine (``_engine``), which watches every queue's collectives."""

    mpi: ModuleType

    def adopt(self, queue: CollectiveQueue) -> None:
        """Watch ``queue``'s collectives from now on, and stop its thread at exit."""

    def abort_failed(self, deadline: Deadline, error: BaseException) -> None:
        """End the job: the collective of ``deadline`` failed with an MPI error."""


class CollectiveQueue:
    """One process group's queued collectives, run in issue order as blocking MPI calls by a thread of its own.

    MPI requires every rank to call a communicator's collectives in the same order; the queue keeps the order the
    caller issued them in, and a blocking collective issued while the queue is not empty joins the queue too
    (:meth:`is_idle`). The thread starts with the first queued collective.
    """

    def __init__(self, engine: QueueKeeper, comm: MPI.Comm) -> None:
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
                self._thread.join(STOP_JOIN_TIMEOUT_S)

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
