"""The torch ``Work`` objects the process group returns, one class per route an operation takes.

* :class:`CompletedWork`: the operation ran to completion on the caller's thread before the call returned.
* :class:`QueuedWork`: a collective run by its group's ``CollectiveQueue`` (``_collective_queue``); ``wait()``
  waits for the queue's thread to complete its future.
* :class:`RequestWork`: a point-to-point operation posted as non-blocking MPI requests, completed by ``wait()`` or
  by the ``ProgressEngine``'s thread (``_engine``).

The two that complete in the background share :class:`PendingWork`: the deadline the watchdog holds them to, the
finishing step (copy back, average) and the future torch's callers (DDP's reducer) chain onto.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.mpi._operation_records import Deadline, MpiCall
from lightning_dist_hooks.mpi._profiler_events import ProfilerEvent, end_event

if TYPE_CHECKING:
    from mpi4py import MPI


class CompletedWork(dist.Work):
    """The ``Work`` of an operation that ran to completion before the collective call returned.

    Built by :func:`completed_work` on every blocking collective's path: slots and no Python ``__init__`` make it
    cheaper than a work that sets its outputs in ``__init__``.
    """

    __slots__ = ("_outputs",)
    _outputs: list[torch.Tensor]  # set by completed_work()

    @override
    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    @override
    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future

    @override
    def is_completed(self) -> bool:
        return True

    @override
    def is_success(self) -> bool:
        return True

    @override
    def exception(self) -> BaseException | None:
        return None

    @override
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

    def __init__(
        self,
        outputs: list[torch.Tensor],
        deadline: Deadline,
        finish: Callable[[], object] | None,
        event: ProfilerEvent | None,
    ) -> None:
        super().__init__()
        self.deadline = deadline
        self._event = event  # the profiler's, ended when the operation completes; None without a profiler
        self._outputs = outputs
        self._finish = finish
        self._done = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future = torch.futures.Future()

    @override
    def get_future(self) -> torch.futures.Future:
        return self._future

    @override
    def is_completed(self) -> bool:
        return self._done

    @override
    def is_success(self) -> bool:
        return self._done and self._error is None

    @override
    def exception(self) -> BaseException | None:
        return self._error

    @override
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
        if self._event is not None:
            end_event(self._event)
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
        event: ProfilerEvent | None,
    ) -> None:
        super().__init__(outputs, deadline, finish, event)
        self.calls = calls  # keeps the tensors the MPI calls point at alive until they ran

    @override
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
        complete_here: Callable[[RequestWork], None],
        outputs: list[torch.Tensor],
        deadline: Deadline,
        finish: Callable[[], object] | None,
        event: ProfilerEvent | None,
    ) -> None:
        super().__init__(outputs, deadline, finish, event)
        # Completes the work on the calling thread: the progress engine's ``complete``, which holds MPI's request lock
        # (passed in, so that the work objects need not know the engine that watches them).
        self._complete_here = complete_here
        self._calls: Sequence[MpiCall] = ()
        self._requests: list[MPI.Request] = []
        self._statuses: list[MPI.Status] | None = None

    @override
    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self.shorten_deadline(timeout)
        self._complete()
        if self._error is not None:
            raise self._error
        return True

    @override
    def source_rank(self) -> int:
        """The sender of a receive from any source (``torch.distributed.recv(src=None)``)."""
        if self._statuses is None:
            raise RuntimeError(f"{self.deadline.describe()} has no source rank: it is not a receive from any rank.")
        self._complete()
        return self._statuses[0].Get_source()

    def _complete(self) -> None:
        if self._event is None:
            self._complete_here(self)  # on this thread: the quickest
        elif not self._done:
            # Profiled: the progress thread completes it, so that its event ends on another thread than it started
            # on and the profiler files it as asynchronous, as it files other backends' communication. Blocks
            # without the GIL; the watchdog bounds the wait. A failed finishing step is raised by the caller.
            with contextlib.suppress(Exception):
                self._future.wait()

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
