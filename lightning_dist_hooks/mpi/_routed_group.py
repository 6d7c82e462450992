"""How an operation of an mpi4py process group runs: the base of ``MpiProcessGroup``, which adds the operations.

It holds what every operation needs (the communicator, the group's collective queue, the progress engine, the
watchdog's view of the group) and takes each operation one of three routes:

* on the caller's thread, with the blocking MPI call, when the caller waits right away (``async_op=False``
  arrives as ``opts.asyncOp == False``) or when the collective is so small that a thread hand-off would cost more
  than the transfer (``EAGER_COLLECTIVE_BYTES``). A ``CompletedWork`` is returned.
* on the group's ``CollectiveQueue`` otherwise (DDP's bucket all-reduces, ``async_op=True``): its thread runs the
  blocking MPI call of each collective, in the order they were issued (``_collective_queue``).
* point-to-point operations are posted as non-blocking requests (blocking sends could deadlock send/send pairs),
  completed by ``wait()`` or the progress thread (``_engine``).

A collective runs on the caller's thread only while the queue is idle: MPI's order is the issue order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.mpi._collective_queue import CollectiveQueue
from lightning_dist_hooks.mpi._engine import ProgressEngine
from lightning_dist_hooks.mpi._operation_parts import Part, finish_all
from lightning_dist_hooks.mpi._operation_records import BlockingCall, GroupWatch, MpiCall, deadline_of
from lightning_dist_hooks.mpi._profiler_events import profiler_active, start_event
from lightning_dist_hooks.mpi._work import QueuedWork, RequestWork, completed_work

if TYPE_CHECKING:
    from mpi4py import MPI

# A non-blocking collective of at most this many bytes runs to completion on the caller's thread: handing it to
# the group's thread and waking the waiter afterwards costs two thread switches (tens of microseconds on a loaded
# node), more than such a transfer takes (a 256 KiB all-reduce of 2 ranks: about 60 us on shared memory), and
# there is nothing worth overlapping. Larger ones are queued so that DDP overlaps them with backward.
EAGER_COLLECTIVE_BYTES = 256 << 10

# Every torch options struct carries ``asyncOp``, which is all ``_run`` reads.
_Options = (
    dist.AllreduceOptions
    | dist.AllreduceCoalescedOptions
    | dist.BroadcastOptions
    | AllgatherOptions
    | dist.GatherOptions
    | dist.ScatterOptions
    | dist.ReduceOptions
    | dist.ReduceScatterOptions
    | dist.AllToAllOptions
    | dist.BarrierOptions
)


def _payload_bytes(calls: Sequence[MpiCall]) -> int:
    return sum(tensor.nbytes for call in calls for tensor in call.tensors)


class RoutedGroup(dist.ProcessGroup):
    """A ``torch.distributed.ProcessGroup`` on one MPI communicator that runs operations on their route."""

    def __init__(
        self, mpi: ModuleType, comm: MPI.Comm, engine: ProgressEngine, timeout: timedelta, description: str
    ) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())  # type: ignore[call-arg]  # the stub lacks (rank, size)
        self._rank = comm.Get_rank()  # rank()/size() are C++ calls, too slow for every collective's path
        self._size = comm.Get_size()
        self._mpi = mpi
        self._comm = comm
        self._engine = engine
        self._collectives = CollectiveQueue(engine, comm)
        self._description = description
        self._watch = GroupWatch(timeout, description)

    @override
    def shutdown(self) -> None:
        """Release the communicator (``destroy_process_group``); MPI completes what is still in flight first."""
        self._engine.release(self._collectives)
        if self._comm != self._mpi.COMM_NULL:
            self._comm.Free()

    def _run(
        self,
        operation: str,
        describe: Callable[[], str],
        inputs: Sequence[torch.Tensor],
        outputs: list[torch.Tensor],
        parts: Sequence[Part],
        opts: _Options | None = None,
    ) -> dist.Work:
        """Run a collective: on this thread when the caller waits for it anyway or when it is small, else queued.

        ``operation`` names it for the profiler (``_profiler_events``), ``describe`` for the watchdog's messages.
        """
        if len(parts) == 1:  # the common case, kept cheap
            calls, finish = [parts[0].call], parts[0].finish
        else:
            calls, finish = [part.call for part in parts], finish_all(parts)
        if self._runs_here(opts, _payload_bytes(calls)):
            self._engine.run_blocking(self._comm, calls, (time.monotonic(), self._watch, describe))
            if finish is not None:
                finish()
            return completed_work(outputs)
        return self._queue(operation, (time.monotonic(), self._watch, describe), inputs, outputs, calls, finish, opts)

    def _runs_here(self, opts: _Options | None, payload_bytes: int) -> bool:
        """Whether a collective runs on the caller's thread: the caller waits for it anyway, or it is too small to
        be worth a thread hand-off; and nothing queued before it is still to run (MPI's order is the issue order).
        While a profiler runs, every collective is queued: its event then ends on the queue's thread, and the
        profiler files it as asynchronous, as it files other backends' communication (``_profiler_events``)."""
        # ``asyncOp`` is False only when torch.distributed's Python API waits right after the call; C++ callers
        # (DDP's reducer) and async_op=True leave it True.
        wanted_here = (opts is not None and not opts.asyncOp) or payload_bytes <= EAGER_COLLECTIVE_BYTES
        return wanted_here and self._collectives.is_idle() and not profiler_active()

    def _queue(
        self,
        operation: str,
        started: BlockingCall,
        inputs: Sequence[torch.Tensor],
        outputs: list[torch.Tensor],
        calls: Sequence[MpiCall],
        finish: Callable[[], object] | None,
        opts: _Options | None,
    ) -> dist.Work:
        """Hand a collective to the group's queue thread; wait for it if the caller asked to."""
        event = start_event(operation, inputs) if profiler_active() else None
        work = QueuedWork(outputs, deadline_of(started), finish, calls, event)
        self._collectives.submit(work)
        if opts is not None and not opts.asyncOp:  # a blocking collective issued behind queued ones
            work.wait()
        return work

    def _post(
        self,
        operation: str,
        describe: Callable[[], str],
        tensors: list[torch.Tensor],
        parts: Sequence[Part],
        *,
        wants_source: bool = False,
    ) -> dist.Work:
        """Post a point-to-point operation as non-blocking requests (blocking ones could deadlock send/send)."""
        event = start_event(operation, tensors) if profiler_active() else None
        deadline = deadline_of((time.monotonic(), self._watch, describe))
        work = RequestWork(self._engine.complete, tensors, deadline, finish_all(parts), event)
        if wants_source:
            work.want_source(self._mpi)
        self._engine.post(work, self._comm, [part.call for part in parts])
        return work
