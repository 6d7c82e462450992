"""``MpiProcessGroup``: a ``torch.distributed.ProcessGroup`` whose collectives run on an mpi4py communicator."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed
from torch.distributed import ReduceOp

from ._buffers import bytes_in_pieces, bytes_of, copy_back, require_cpu_tensor, staged_copy, staged_output, values_of
from ._engine import (
    EAGER_COLLECTIVE_BYTES,
    BlockingCall,
    CollectiveQueue,
    GroupWatch,
    MpiCall,
    ProgressEngine,
    QueuedWork,
    RequestWork,
    completed_work,
    deadline_of,
)
from ._mpi import init_mpi
from ._reductions import Reduction, reduction_for

if TYPE_CHECKING:
    from mpi4py import MPI

BACKEND_NAME = "mpi4py"

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


class _Part(NamedTuple):
    """One MPI call of an operation and what to do with its result (copy back, average) once it completes."""

    call: MpiCall
    finish: Callable[[], object] | None = None


def _describe(tensors: Sequence[torch.Tensor]) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)


def _finish_all(parts: Sequence[_Part]) -> Callable[[], None] | None:
    finishes = [part.finish for part in parts if part.finish is not None]
    if not finishes:
        return None

    def finish() -> None:
        for step in finishes:
            step()

    return finish


def _copy_back_finish(staged: torch.Tensor, tensor: torch.Tensor) -> Callable[[], None] | None:
    return None if staged is tensor else partial(copy_back, staged, tensor)


def _reduction_finish(staged: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> Callable[[], None] | None:
    if staged is tensor and reduction.finish is None:
        return None

    def finish() -> None:
        copy_back(staged, tensor)
        if reduction.finish is not None:
            reduction.finish(tensor)

    return finish


def _copy_pieces(source: torch.Tensor, targets: Sequence[torch.Tensor]) -> None:
    offset = 0
    flat = source.reshape(-1)
    for target in targets:
        target.copy_(flat[offset : offset + target.numel()].view(target.shape))
        offset += target.numel()


def _check_same_size(tensors: Sequence[torch.Tensor], like: torch.Tensor, count: int, operation: str) -> None:
    if len(tensors) != count:
        raise ValueError(f"{operation}: expected a list of {count} tensors (one per rank), got {len(tensors)}.")
    for tensor in tensors:
        require_cpu_tensor(tensor, operation)
        if tensor.numel() != like.numel() or tensor.dtype != like.dtype:
            raise ValueError(
                f"{operation}: every tensor must match {like.dtype}{list(like.shape)}, got "
                f"{tensor.dtype}{list(tensor.shape)}."
            )


def _check_multiple(total: torch.Tensor, piece: torch.Tensor, count: int, operation: str) -> None:
    require_cpu_tensor(total, operation)
    require_cpu_tensor(piece, operation)
    if total.numel() != count * piece.numel() or total.dtype != piece.dtype:
        raise ValueError(
            f"{operation}: the whole tensor must hold {count} x {piece.dtype}{list(piece.shape)}, got "
            f"{total.dtype}{list(total.shape)}."
        )


class _DirectTarget(NamedTuple):
    """How a blocking allreduce reduces a tensor of one (op, dtype) in place: MPI's type and op, then ``finish``."""

    mpi_type: object
    mpi_op: object
    finish: Callable[[torch.Tensor], object] | None  # AVG's division


def _direct_target(mpi: ModuleType, op: ReduceOp, dtype: torch.dtype, size: int) -> _DirectTarget | None:
    try:
        reduction = reduction_for(mpi, op, dtype, size)
    except (TypeError, ValueError):  # the general path raises them with the operation's name
        return None
    if reduction.compute_dtype != dtype:  # float16, bfloat16, 8/16-bit sums: staged in a wider type
        return None
    return _DirectTarget(reduction.mpi_type, reduction.mpi_op, reduction.finish)


def _describe_barrier() -> str:
    return "barrier"


def _op_name(op: ReduceOp) -> str:
    return op.op.name  # type: ignore[attr-defined]  # torch's stub omits ReduceOp.op (its RedOpType)


def _describe_allreduce(op: ReduceOp, tensors: Sequence[torch.Tensor]) -> str:
    return f"allreduce({_op_name(op)}) of {_describe(tensors)}"


def _payload_bytes(calls: Sequence[MpiCall]) -> int:
    return sum(tensor.nbytes for call in calls for tensor in call.tensors)


def _row_bytes(tensor: torch.Tensor) -> int:
    return tensor[0].numel() * tensor.element_size() if tensor.dim() and tensor.shape[0] else 0


class MpiProcessGroup(dist.ProcessGroup):
    """Process group running torch.distributed collectives on an mpi4py communicator (CPU tensors).

    Created by torch through the registered ``"mpi4py"`` backend; not meant to be constructed directly.
    """

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
        # Per op code, then dtype: what dist.all_reduce(t) on a contiguous tensor passes to MPI (None: not in place).
        self._direct_targets: dict[int, dict[torch.dtype, _DirectTarget | None]] = {}
        self._group_name = ""  # torch sets both right after creation
        self._group_description = ""

    # The C++ ProcessGroup keeps its name and description in its backends, and a Python group has none: keep
    # them here (DeviceMesh, FSDP2 and functional collectives look groups up by name).

    def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802 - the C++ virtual's name
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return self._group_name

    def setGroupDesc(self, description: str) -> None:  # noqa: N802 - the C++ virtual's name
        self._group_description = description

    def getGroupDesc(self) -> str:  # noqa: N802 - the C++ virtual's name
        return self._group_description

    def __repr__(self) -> str:
        return f"MpiProcessGroup(rank={self._rank}, size={self._size}, {self._description})"

    def shutdown(self) -> None:
        """Release the communicator (``destroy_process_group``); MPI completes what is still in flight first."""
        self._engine.release(self._collectives)
        if self._comm != self._mpi.COMM_NULL:
            self._comm.Free()

    def _get_backend(self, device: torch.device) -> MpiProcessGroup:  # type: ignore[override]  # see the docstring
        """This group is its own (CPU) backend. torch 2.14's ``batch_isend_irecv`` asks every ``ProcessGroup``,
        subclasses too, for its device's backend (to read ``supports_coalescing``); torch's own lookup finds none
        registered for a group written in Python and raises."""
        del device
        return self

    # --- collectives --------------------------------------------------------------------------------------
    # Each implements the C++ virtual torch calls, ``(tensors, opts)``; torch's stub types the Python convenience
    # overloads instead, hence ``type: ignore[override]`` (and ``[assignment]`` for the ``_*_base`` aliases).

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions | None = None) -> dist.Work:  # type: ignore[override]
        opts = opts or dist.AllreduceOptions()
        # dist.all_reduce(t) of metrics, sync_dist, and DDP's buckets: frequent, so every line here costs. A
        # contiguous tensor whose (op, dtype) MPI reduces as is goes straight to MPI: the blocking call on this
        # thread, under the watchdog, when the caller waits for it anyway or it is small; else to the queue.
        if len(tensors) == 1:
            reduce_op = opts.reduceOp  # a C++ property that builds a new ReduceOp: read once
            tensor = tensors[0]
            # A ReduceOp hashes to its RedOpType's value: the cheapest key. Comparing ReduceOp or RedOpType objects
            # (a dict keyed by them does) costs about 0.5 us per comparison.
            op_code = hash(reduce_op)
            try:
                target = self._direct_targets[op_code][tensor.dtype]
            except KeyError:
                target = self._add_direct_target(op_code, reduce_op, tensor.dtype)
            if target is not None and tensor.is_cpu and tensor.layout is torch.strided and tensor.is_contiguous():
                mpi_type, mpi_op, finish = target
                values = [self._mpi.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes), tensor.numel(), mpi_type]
                started = (time.monotonic(), self._watch, _describe_allreduce, reduce_op, tensors)
                if self._runs_here(opts, tensor.nbytes):
                    self._engine.call_blocking(started, self._comm.Allreduce, self._mpi.IN_PLACE, values, mpi_op)
                    if finish is not None:
                        finish(tensor)
                    return completed_work(tensors)
                call = MpiCall("Allreduce", (self._mpi.IN_PLACE, values, mpi_op), (tensor,))
                return self._queue(started, tensors, [call], None if finish is None else partial(finish, tensor), opts)
        parts = [self._allreduce_part(tensor, opts.reduceOp) for tensor in tensors]
        return self._run(partial(_describe_allreduce, opts.reduceOp, tensors), tensors, parts, opts)

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: dist.AllreduceCoalescedOptions | None = None
    ) -> dist.Work:
        return self.allreduce(tensors, opts or dist.AllreduceCoalescedOptions())

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions | None = None) -> dist.Work:  # type: ignore[override]
        opts = opts or dist.BroadcastOptions()
        root = opts.rootRank
        parts = []
        for tensor in tensors:
            require_cpu_tensor(tensor, "broadcast")
            staged = staged_copy(tensor) if root == self._rank else staged_output(tensor)
            call = MpiCall("Bcast", (bytes_of(self._mpi, staged), root), (staged,))
            parts.append(_Part(call, _copy_back_finish(staged, tensor)))
        return self._run(lambda: f"broadcast from rank {root} of {_describe(tensors)}", tensors, parts, opts)

    def allgather(  # type: ignore[override]
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: AllgatherOptions | None = None
    ) -> dist.Work:
        parts = []
        for outputs, tensor in zip(output_lists, inputs, strict=True):
            _check_same_size(outputs, tensor, self._size, "allgather")
            send = staged_copy(tensor)
            gathered = torch.empty((self._size, *tensor.shape), dtype=tensor.dtype)
            args = (bytes_of(self._mpi, send), bytes_of(self._mpi, gathered, parts=self._size))
            parts.append(_Part(MpiCall("Allgather", args, (send, gathered)), partial(_copy_pieces, gathered, outputs)))
        all_outputs = [tensor for outputs in output_lists for tensor in outputs]
        return self._run(lambda: f"allgather of {_describe(inputs)}", all_outputs, parts, opts)

    def all_gather_single(
        self, output: torch.Tensor, input_tensor: torch.Tensor, opts: AllgatherOptions | None = None
    ) -> dist.Work:
        part = self._all_gather_single_part(output, input_tensor)
        return self._run(lambda: f"all_gather_into_tensor of {_describe([input_tensor])}", [output], [part], opts)

    _allgather_base = all_gather_single  # type: ignore[assignment]

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllgatherOptions | None = None
    ) -> dist.Work:
        parts = [self._all_gather_single_part(out, inp) for out, inp in zip(outputs, inputs, strict=True)]
        return self._run(lambda: f"coalesced all_gather_into_tensor of {_describe(inputs)}", outputs, parts, opts)

    def gather(  # type: ignore[override]
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: dist.GatherOptions | None = None
    ) -> dist.Work:
        opts = opts or dist.GatherOptions()
        root, (tensor,) = opts.rootRank, inputs
        require_cpu_tensor(tensor, "gather")
        send = staged_copy(tensor)
        if self._rank != root:
            call = MpiCall("Gather", (bytes_of(self._mpi, send), None, root), (send,))
            return self._run(lambda: f"gather to rank {root} of {_describe(inputs)}", [], [_Part(call)], opts)
        (outputs,) = output_lists
        _check_same_size(outputs, tensor, self._size, "gather")
        gathered = torch.empty((self._size, *tensor.shape), dtype=tensor.dtype)
        args = (bytes_of(self._mpi, send), bytes_of(self._mpi, gathered, parts=self._size), root)
        part = _Part(MpiCall("Gather", args, (send, gathered)), partial(_copy_pieces, gathered, outputs))
        return self._run(lambda: f"gather to rank {root} of {_describe(inputs)}", outputs, [part], opts)

    def scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: dist.ScatterOptions | None = None,
    ) -> dist.Work:
        opts = opts or dist.ScatterOptions()
        root, (output,) = opts.rootRank, outputs
        require_cpu_tensor(output, "scatter")
        received = staged_output(output)
        send_spec: list | None = None
        keep: tuple[torch.Tensor, ...] = (received,)
        if self._rank == root:
            (inputs,) = input_lists
            _check_same_size(inputs, output, self._size, "scatter")
            packed = torch.stack([tensor.reshape(output.shape) for tensor in inputs])
            send_spec, keep = bytes_of(self._mpi, packed, parts=self._size), (received, packed)
        call = MpiCall("Scatter", (send_spec, bytes_of(self._mpi, received), root), keep)
        part = _Part(call, _copy_back_finish(received, output))
        return self._run(lambda: f"scatter from rank {root} of {_describe(outputs)}", outputs, [part], opts)

    def reduce(self, tensors: list[torch.Tensor], opts: dist.ReduceOptions | None = None) -> dist.Work:  # type: ignore[override]
        opts = opts or dist.ReduceOptions()
        root, (tensor,) = opts.rootRank, tensors
        require_cpu_tensor(tensor, "reduce")
        reduction = reduction_for(self._mpi, opts.reduceOp, tensor.dtype, self._size)
        staged = staged_copy(tensor, reduction.compute_dtype)
        values = values_of(self._mpi, staged, reduction.mpi_type)
        if self._rank == root:
            args = (self._mpi.IN_PLACE, values, reduction.mpi_op, root)
            part = _Part(MpiCall("Reduce", args, (staged,)), _reduction_finish(staged, tensor, reduction))
        else:  # only the root's tensor receives the result
            part = _Part(MpiCall("Reduce", (values, None, reduction.mpi_op, root), (staged,)))
        op_name = _op_name(opts.reduceOp)
        return self._run(lambda: f"reduce({op_name}) to rank {root} of {_describe(tensors)}", tensors, [part], opts)

    def reduce_scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: dist.ReduceScatterOptions | None = None,
    ) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        (output,), (inputs,) = outputs, input_lists
        require_cpu_tensor(output, "reduce_scatter")
        _check_same_size(inputs, output, self._size, "reduce_scatter")
        reduction = reduction_for(self._mpi, opts.reduceOp, output.dtype, self._size)
        packed = torch.empty((self._size, *output.shape), dtype=reduction.compute_dtype)
        for piece, tensor in zip(packed, inputs, strict=True):
            piece.copy_(tensor.reshape(output.shape))
        part = self._reduce_scatter_part(output, packed, reduction)
        op_name = _op_name(opts.reduceOp)
        return self._run(lambda: f"reduce_scatter({op_name}) of {_describe(outputs)}", outputs, [part], opts)

    def reduce_scatter_single(
        self, output: torch.Tensor, input_tensor: torch.Tensor, opts: dist.ReduceScatterOptions | None = None
    ) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        part = self._reduce_scatter_single_part(output, input_tensor, opts.reduceOp)
        op_name = _op_name(opts.reduceOp)

        def describe() -> str:
            return f"reduce_scatter_tensor({op_name}) of {_describe([input_tensor])}"

        return self._run(describe, [output], [part], opts)

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: dist.ReduceScatterOptions | None = None
    ) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        parts = [
            self._reduce_scatter_single_part(output, tensor, opts.reduceOp)
            for output, tensor in zip(outputs, inputs, strict=True)
        ]
        op_name = _op_name(opts.reduceOp)

        def describe() -> str:
            return f"coalesced reduce_scatter_tensor({op_name}) of {_describe(inputs)}"

        return self._run(describe, outputs, parts, opts)

    def all_to_all_single(  # type: ignore[override]
        self,
        output: torch.Tensor,
        input_tensor: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: dist.AllToAllOptions | None = None,
    ) -> dist.Work:
        require_cpu_tensor(output, "all_to_all_single")
        require_cpu_tensor(input_tensor, "all_to_all_single")
        send, received = staged_copy(input_tensor), staged_output(output)
        if not output_split_sizes and not input_split_sizes:
            if input_tensor.numel() != output.numel() or input_tensor.numel() % self._size:
                raise ValueError(
                    "all_to_all_single without split sizes needs input and output of equal size divisible by the "
                    f"group size {self._size}, got {_describe([input_tensor, output])}."
                )
            args = (bytes_of(self._mpi, send, parts=self._size), bytes_of(self._mpi, received, parts=self._size))
            call = MpiCall("Alltoall", args, (send, received))
        else:
            args = (
                bytes_in_pieces(self._mpi, send, self._split_bytes(input_tensor, input_split_sizes)),
                bytes_in_pieces(self._mpi, received, self._split_bytes(output, output_split_sizes)),
            )
            call = MpiCall("Alltoallv", args, (send, received))
        part = _Part(call, _copy_back_finish(received, output))
        return self._run(lambda: f"all_to_all_single of {_describe([input_tensor])}", [output], [part], opts)

    def alltoall(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: dist.AllToAllOptions | None = None
    ) -> dist.Work:
        for tensor in (*outputs, *inputs):
            require_cpu_tensor(tensor, "alltoall")
        send = torch.cat([tensor.reshape(-1) for tensor in inputs])
        received = torch.empty(sum(tensor.numel() for tensor in outputs), dtype=send.dtype)
        args = (
            bytes_in_pieces(self._mpi, send, [t.numel() * t.element_size() for t in inputs]),
            bytes_in_pieces(self._mpi, received, [t.numel() * t.element_size() for t in outputs]),
        )
        part = _Part(MpiCall("Alltoallv", args, (send, received)), partial(_copy_pieces, received, outputs))
        return self._run(lambda: f"alltoall of {_describe(inputs)}", outputs, [part], opts)

    def barrier(self, opts: dist.BarrierOptions | None = None) -> dist.Work:  # type: ignore[override]
        if self._runs_here(opts, 0):  # dist.barrier(): Lightning's sync_dist runs one per metric
            self._engine.call_blocking((time.monotonic(), self._watch, _describe_barrier), self._comm.Barrier)
            return completed_work([])
        return self._run(_describe_barrier, [], [_Part(MpiCall("Barrier", (), ()))], opts)

    # --- point to point (always non-blocking: blocking sends could deadlock send/send pairs) ---------------

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> dist.Work:
        self._check_tag(tag)
        parts = []
        for tensor in tensors:
            require_cpu_tensor(tensor, "send")
            staged = staged_copy(tensor)
            parts.append(_Part(MpiCall("Send", (bytes_of(self._mpi, staged), dst_rank, tag), (staged,))))
        return self._post(lambda: f"send to rank {dst_rank} (tag {tag}) of {_describe(tensors)}", tensors, parts)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> dist.Work:
        def describe() -> str:
            return f"recv from rank {src_rank} (tag {tag}) of {_describe(tensors)}"

        return self._post(describe, *self._recv(tensors, src_rank, tag))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        def describe() -> str:
            return f"recv from any rank (tag {tag}) of {_describe(tensors)}"

        return self._post(describe, *self._recv(tensors, self._mpi.ANY_SOURCE, tag), wants_source=True)

    # --- helpers ------------------------------------------------------------------------------------------

    def _run(
        self,
        describe: Callable[[], str],
        outputs: list[torch.Tensor],
        parts: Sequence[_Part],
        opts: _Options | None = None,
    ) -> dist.Work:
        """Run a collective: on this thread when the caller waits for it anyway or when it is small, else queued."""
        if len(parts) == 1:  # the common case, kept cheap
            calls, finish = [parts[0].call], parts[0].finish
        else:
            calls, finish = [part.call for part in parts], _finish_all(parts)
        if self._runs_here(opts, _payload_bytes(calls)):
            self._engine.run_blocking(self._comm, calls, (time.monotonic(), self._watch, describe))
            if finish is not None:
                finish()
            return completed_work(outputs)
        return self._queue((time.monotonic(), self._watch, describe), outputs, calls, finish, opts)

    def _runs_here(self, opts: _Options | None, payload_bytes: int) -> bool:
        """Whether a collective runs on the caller's thread: the caller waits for it anyway, or it is too small to
        be worth a thread hand-off; and nothing queued before it is still to run (MPI's order is the issue order)."""
        # ``asyncOp`` is False only when torch.distributed's Python API waits right after the call; C++ callers
        # (DDP's reducer) and async_op=True leave it True.
        wanted_here = (opts is not None and not opts.asyncOp) or payload_bytes <= EAGER_COLLECTIVE_BYTES
        return wanted_here and self._collectives.is_idle()

    def _queue(
        self,
        started: BlockingCall,
        outputs: list[torch.Tensor],
        calls: Sequence[MpiCall],
        finish: Callable[[], object] | None,
        opts: _Options | None,
    ) -> dist.Work:
        """Hand a collective to the group's queue thread; wait for it if the caller asked to."""
        work = QueuedWork(outputs, deadline_of(started), finish, calls)
        self._collectives.submit(work)
        if opts is not None and not opts.asyncOp:  # a blocking collective issued behind queued ones
            work.wait()
        return work

    def _post(
        self,
        describe: Callable[[], str],
        outputs: list[torch.Tensor],
        parts: Sequence[_Part],
        *,
        wants_source: bool = False,
    ) -> dist.Work:
        """Post a point-to-point operation as non-blocking requests (blocking ones could deadlock send/send)."""
        work = RequestWork(
            self._engine, outputs, deadline_of((time.monotonic(), self._watch, describe)), _finish_all(parts)
        )
        if wants_source:
            work.want_source(self._mpi)
        self._engine.post(work, self._comm, [part.call for part in parts])
        return work

    def _add_direct_target(self, op_code: int, reduce_op: ReduceOp, dtype: torch.dtype) -> _DirectTarget | None:
        target = _direct_target(self._mpi, reduce_op, dtype, self._size)
        self._direct_targets.setdefault(op_code, {})[dtype] = target
        return target

    def _allreduce_part(self, tensor: torch.Tensor, op: ReduceOp) -> _Part:
        require_cpu_tensor(tensor, "allreduce")
        reduction = reduction_for(self._mpi, op, tensor.dtype, self._size)
        staged = staged_copy(tensor, reduction.compute_dtype)
        args = (self._mpi.IN_PLACE, values_of(self._mpi, staged, reduction.mpi_type), reduction.mpi_op)
        return _Part(MpiCall("Allreduce", args, (staged,)), _reduction_finish(staged, tensor, reduction))

    def _all_gather_single_part(self, output: torch.Tensor, tensor: torch.Tensor) -> _Part:
        _check_multiple(output, tensor, self._size, "all_gather_into_tensor")
        send, received = staged_copy(tensor), staged_output(output)
        args = (bytes_of(self._mpi, send), bytes_of(self._mpi, received, parts=self._size))
        return _Part(MpiCall("Allgather", args, (send, received)), _copy_back_finish(received, output))

    def _reduce_scatter_single_part(self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp) -> _Part:
        _check_multiple(tensor, output, self._size, "reduce_scatter_tensor")
        reduction = reduction_for(self._mpi, op, output.dtype, self._size)
        return self._reduce_scatter_part(output, staged_copy(tensor, reduction.compute_dtype), reduction)

    def _reduce_scatter_part(self, output: torch.Tensor, packed: torch.Tensor, reduction: Reduction) -> _Part:
        received = staged_output(output, reduction.compute_dtype)
        args = (
            values_of(self._mpi, packed, reduction.mpi_type, parts=self._size),  # mpi4py: count per rank
            values_of(self._mpi, received, reduction.mpi_type),
            reduction.mpi_op,
        )
        finish = _reduction_finish(received, output, reduction)
        return _Part(MpiCall("Reduce_scatter_block", args, (packed, received)), finish)

    def _recv(self, tensors: list[torch.Tensor], source: int, tag: int) -> tuple[list[torch.Tensor], list[_Part]]:
        self._check_tag(tag)
        parts = []
        for tensor in tensors:
            require_cpu_tensor(tensor, "recv")
            staged = staged_output(tensor)
            call = MpiCall("Recv", (bytes_of(self._mpi, staged), source, tag), (staged,))
            parts.append(_Part(call, _copy_back_finish(staged, tensor)))
        return tensors, parts

    def _split_bytes(self, tensor: torch.Tensor, split_sizes: list[int]) -> list[int]:
        rows = list(split_sizes) or [tensor.shape[0] // self._size] * self._size
        return [rows_count * _row_bytes(tensor) for rows_count in rows]

    def _check_tag(self, tag: int) -> None:
        upper_bound = cast(int, self._comm.Get_attr(self._mpi.TAG_UB))  # MPI always sets TAG_UB
        if not 0 <= tag <= upper_bound:
            raise ValueError(f"MPI message tags must lie in [0, {upper_bound}], got {tag}.")


def _communicator(mpi: ModuleType, options: dist.distributed_c10d._DistributedBackendOptions) -> tuple[MPI.Comm, str]:
    world = mpi.COMM_WORLD
    ranks = list(options.global_ranks_in_group)
    if not ranks:  # the default group: every rank of the job is creating it
        if (options.group_rank, options.group_size) != (world.Get_rank(), world.Get_size()):
            raise RuntimeError(
                f"init_process_group(rank={options.group_rank}, world_size={options.group_size}) does not match "
                f"MPI (rank {world.Get_rank()} of {world.Get_size()}). Start every rank with mpirun/mpiexec and "
                "let the rank and world size come from MPI (init_method=mpi_init_method())."
            )
        return world.Dup(), "the default process group"
    if (dist.get_rank(), dist.get_world_size()) != (world.Get_rank(), world.Get_size()):
        raise RuntimeError(
            f"Subgroups of the mpi4py backend need torch's global rank ({dist.get_rank()} of "
            f"{dist.get_world_size()}) to equal the MPI rank ({world.Get_rank()} of {world.Get_size()})."
        )
    # new_group() runs only on members, so use the constructor that only members call; members pass equal tags.
    world_group = world.Get_group()
    try:
        member_group = world_group.Incl(ranks)
        tag = zlib.crc32(",".join(map(str, ranks)).encode()) % 32768
        comm = world.Create_group(member_group, tag)
        member_group.Free()
    finally:
        world_group.Free()
    return comm, f"the process group of global ranks {ranks}"


def new_mpi_process_group(
    options: dist.distributed_c10d._DistributedBackendOptions, backend_options: object = None
) -> MpiProcessGroup:
    """Backend creator registered with ``torch.distributed.Backend.register_backend(..., extended_api=True)``."""
    del backend_options  # the backend has no options; torch passes the group's pg_options through
    mpi = init_mpi()
    comm, description = _communicator(mpi, options)
    if (comm.Get_rank(), comm.Get_size()) != (options.group_rank, options.group_size):
        raise RuntimeError(
            f"MPI placed this process at rank {comm.Get_rank()} of {comm.Get_size()} in {description}, but torch "
            f"expects rank {options.group_rank} of {options.group_size}."
        )
    return MpiProcessGroup(mpi, comm, ProgressEngine.instance(mpi), options.timeout, description)
