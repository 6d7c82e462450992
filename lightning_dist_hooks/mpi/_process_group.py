"""``MpiProcessGroup``: a ``torch.distributed.ProcessGroup`` whose collectives run on an mpi4py communicator.

This module is the side torch sees: the group's names and the operations torch calls (the C++ virtuals). Each
operation reads torch's options, has its tensors translated into MPI calls (``_operation_parts``), and runs them on
the route its base class picks (``_routed_group``). The blocking single-tensor all-reduce, the most frequent call,
skips that translation where MPI can reduce the tensor in place (``_direct_allreduce``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed
from torch.distributed import ReduceOp
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.mpi._direct_allreduce import DirectTarget, direct_target
from lightning_dist_hooks.mpi._engine import ProgressEngine
from lightning_dist_hooks.mpi._operation_names import (
    BACKEND_NAME,
    describe_allreduce,
    describe_barrier,
    describe_tensors,
    reduce_op_name,
)
from lightning_dist_hooks.mpi._operation_parts import (
    Part,
    all_gather_single_part,
    all_to_all_single_part,
    allgather_parts,
    allreduce_part,
    alltoall_part,
    broadcast_parts,
    gather_part,
    recv_parts,
    reduce_part,
    reduce_scatter_part,
    reduce_scatter_single_part,
    scatter_part,
    send_parts,
)
from lightning_dist_hooks.mpi._operation_records import MpiCall
from lightning_dist_hooks.mpi._routed_group import RoutedGroup
from lightning_dist_hooks.mpi._sparse_parts import check_sparse_allreduce, sparse_sizes_part, sparse_sum_parts
from lightning_dist_hooks.mpi._work import completed_work

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["BACKEND_NAME", "MpiProcessGroup"]


class MpiProcessGroup(RoutedGroup):
    """Process group running torch.distributed collectives on an mpi4py communicator (CPU tensors).

    Created by torch through the registered ``"mpi4py"`` backend; not meant to be constructed directly.
    """

    def __init__(
        self, mpi: ModuleType, comm: MPI.Comm, engine: ProgressEngine, timeout: timedelta, description: str
    ) -> None:
        super().__init__(mpi, comm, engine, timeout, description)
        # Per op code, then dtype: what dist.all_reduce(t) on a contiguous tensor passes to MPI (None: not in place).
        self._direct_targets: dict[int, dict[torch.dtype, DirectTarget | None]] = {}
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

    @override
    def __repr__(self) -> str:
        return f"MpiProcessGroup(rank={self._rank}, size={self._size}, {self._description})"

    @override
    def _get_backend(self, device: torch.device) -> MpiProcessGroup:  # type: ignore[override]  # see the docstring
        """This group is its own (CPU) backend. torch 2.14's ``batch_isend_irecv`` asks every ``ProcessGroup``,
        subclasses too, for its device's backend (to read ``supports_coalescing``); torch's own lookup finds none
        registered for a group written in Python and raises."""
        del device
        return self

    # --- collectives --------------------------------------------------------------------------------------
    # Each implements the C++ virtual torch calls, ``(tensors, opts)``; torch's stub types the Python convenience
    # overloads instead, hence ``type: ignore[override]`` (and ``[assignment]`` for the ``_*_base`` aliases, whose
    # parameters torch's stub names otherwise).

    @override
    def allreduce(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions | None = None
    ) -> dist.Work:
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
                started = (time.monotonic(), self._watch, describe_allreduce, reduce_op, tensors)
                if self._runs_here(opts, tensor.nbytes):
                    self._engine.call_blocking(started, self._comm.Allreduce, self._mpi.IN_PLACE, values, mpi_op)
                    if finish is not None:
                        finish(tensor)
                    return completed_work(tensors)
                call = MpiCall("Allreduce", (self._mpi.IN_PLACE, values, mpi_op), (tensor,))
                finish_tensor = None if finish is None else partial(finish, tensor)
                return self._queue("all_reduce", started, tensors, tensors, [call], finish_tensor, opts)
        if any(tensor.is_sparse for tensor in tensors):
            return self._sparse_allreduce(tensors, opts)
        parts = [allreduce_part(self._mpi, self._size, tensor, opts.reduceOp) for tensor in tensors]
        return self._run(
            "all_reduce", partial(describe_allreduce, opts.reduceOp, tensors), tensors, tensors, parts, opts
        )

    def _sparse_allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work:
        """Sum sparse COO tensors as gloo does (``_sparse_parts``): the entry counts first, then the entries."""
        check_sparse_allreduce(tensors, opts.reduceOp)
        counts, size_parts = zip(*(sparse_sizes_part(self._mpi, self._size, tensor) for tensor in tensors), strict=True)
        counts_first = dist.AllreduceOptions()
        counts_first.asyncOp = False  # the entries' step needs the counts

        def describe_counts() -> str:
            return f"entry counts of the sparse allreduce of {describe_tensors(tensors)}"

        self._run("sparse_all_reduce_sizes", describe_counts, tensors, list(counts), list(size_parts), counts_first)
        parts = [part for tensor, count in zip(tensors, counts, strict=True)
                 for part in sparse_sum_parts(self._mpi, tensor, count)]  # fmt: skip

        def describe() -> str:
            return f"sparse allreduce(SUM) of {describe_tensors(tensors)}"

        return self._run("sparse_all_reduce", describe, tensors, tensors, parts, opts)

    @override
    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: dist.AllreduceCoalescedOptions | None = None
    ) -> dist.Work:
        return self.allreduce(tensors, opts or dist.AllreduceCoalescedOptions())

    @override
    def broadcast(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions | None = None
    ) -> dist.Work:
        opts = opts or dist.BroadcastOptions()
        root = opts.rootRank
        parts = broadcast_parts(self._mpi, self._rank, tensors, root)

        def describe() -> str:
            return f"broadcast from rank {root} of {describe_tensors(tensors)}"

        return self._run("broadcast", describe, tensors, tensors, parts, opts)

    @override
    def allgather(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: AllgatherOptions | None = None
    ) -> dist.Work:
        parts = allgather_parts(self._mpi, self._size, output_lists, inputs)
        all_outputs = [tensor for outputs in output_lists for tensor in outputs]
        return self._run(
            "all_gather", lambda: f"allgather of {describe_tensors(inputs)}", inputs, all_outputs, parts, opts
        )

    @override
    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        """``all_gather_coalesced``: ``output_lists[rank][i]`` receives ``inputs[i]`` of each rank."""
        if len(output_lists) != self._size:
            raise ValueError(
                f"all_gather_coalesced: output_tensor_lists needs one list per rank ({self._size}), got "
                f"{len(output_lists)}."
            )
        per_input = [[outputs[index] for outputs in output_lists] for index in range(len(inputs))]
        parts = allgather_parts(self._mpi, self._size, per_input, inputs)
        all_outputs = [tensor for outputs in output_lists for tensor in outputs]

        def describe() -> str:
            return f"coalesced allgather of {describe_tensors(inputs)}"

        return self._run("all_gather", describe, inputs, all_outputs, parts, opts)

    @override
    def all_gather_single(
        self, output: torch.Tensor, input_tensor: torch.Tensor, opts: AllgatherOptions | None = None
    ) -> dist.Work:
        part = all_gather_single_part(self._mpi, self._size, output, input_tensor)
        return self._run(
            "all_gather_into_tensor",
            lambda: f"all_gather_into_tensor of {describe_tensors([input_tensor])}",
            [input_tensor],
            [output],
            [part],
            opts,
        )

    _allgather_base = all_gather_single  # type: ignore[assignment]  # the stub's parameter names differ

    @override
    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllgatherOptions | None = None
    ) -> dist.Work:
        parts = [
            all_gather_single_part(self._mpi, self._size, out, inp) for out, inp in zip(outputs, inputs, strict=True)
        ]
        return self._run(
            "all_gather_into_tensor_coalesced",
            lambda: f"coalesced all_gather_into_tensor of {describe_tensors(inputs)}",
            inputs,
            outputs,
            parts,
            opts,
        )

    @override
    def gather(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: dist.GatherOptions | None = None
    ) -> dist.Work:
        opts = opts or dist.GatherOptions()
        root, (tensor,) = opts.rootRank, inputs
        outputs, part = gather_part(self._mpi, self._rank, self._size, output_lists, tensor, root)
        return self._run(
            "gather", lambda: f"gather to rank {root} of {describe_tensors(inputs)}", inputs, outputs, [part], opts
        )

    @override
    def scatter(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: dist.ScatterOptions | None = None,
    ) -> dist.Work:
        opts = opts or dist.ScatterOptions()
        root, (output,) = opts.rootRank, outputs
        part = scatter_part(self._mpi, self._rank, self._size, output, input_lists, root)
        scattered = [tensor for inputs in input_lists for tensor in inputs]

        def describe() -> str:
            return f"scatter from rank {root} of {describe_tensors(outputs)}"

        return self._run("scatter", describe, scattered, outputs, [part], opts)

    @override
    def reduce(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self, tensors: list[torch.Tensor], opts: dist.ReduceOptions | None = None
    ) -> dist.Work:
        opts = opts or dist.ReduceOptions()
        root, (tensor,) = opts.rootRank, tensors
        part = reduce_part(self._mpi, self._rank, self._size, tensor, opts.reduceOp, root)
        op_name = reduce_op_name(opts.reduceOp)

        def describe() -> str:
            return f"reduce({op_name}) to rank {root} of {describe_tensors(tensors)}"

        return self._run("reduce", describe, tensors, tensors, [part], opts)

    @override
    def reduce_scatter(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: dist.ReduceScatterOptions | None = None,
    ) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        (output,), (inputs,) = outputs, input_lists
        part = reduce_scatter_part(self._mpi, self._size, output, inputs, opts.reduceOp)
        op_name = reduce_op_name(opts.reduceOp)

        def describe() -> str:
            return f"reduce_scatter({op_name}) of {describe_tensors(outputs)}"

        return self._run("reduce_scatter", describe, inputs, outputs, [part], opts)

    @override
    def reduce_scatter_single(
        self, output: torch.Tensor, input_tensor: torch.Tensor, opts: dist.ReduceScatterOptions | None = None
    ) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        part = reduce_scatter_single_part(self._mpi, self._size, output, input_tensor, opts.reduceOp)
        op_name = reduce_op_name(opts.reduceOp)

        def describe() -> str:
            return f"reduce_scatter_tensor({op_name}) of {describe_tensors([input_tensor])}"

        return self._run("reduce_scatter_tensor", describe, [input_tensor], [output], [part], opts)

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]  # the stub's parameter names differ

    @override
    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: dist.ReduceScatterOptions | None = None
    ) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        parts = [
            reduce_scatter_single_part(self._mpi, self._size, output, tensor, opts.reduceOp)
            for output, tensor in zip(outputs, inputs, strict=True)
        ]
        op_name = reduce_op_name(opts.reduceOp)

        def describe() -> str:
            return f"coalesced reduce_scatter_tensor({op_name}) of {describe_tensors(inputs)}"

        return self._run("reduce_scatter_tensor_coalesced", describe, inputs, outputs, parts, opts)

    @override
    def all_to_all_single(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self,
        output: torch.Tensor,
        input_tensor: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: dist.AllToAllOptions | None = None,
    ) -> dist.Work:
        part = all_to_all_single_part(
            self._mpi, self._size, output, input_tensor, output_split_sizes, input_split_sizes
        )

        def describe() -> str:
            return f"all_to_all_single of {describe_tensors([input_tensor])}"

        return self._run("all_to_all", describe, [input_tensor], [output], [part], opts)

    @override
    def alltoall(  # type: ignore[override]  # the C++ (tensors, opts) form only: see the collectives' note
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: dist.AllToAllOptions | None = None
    ) -> dist.Work:
        part = alltoall_part(self._mpi, outputs, inputs)
        return self._run("all_to_all", lambda: f"alltoall of {describe_tensors(inputs)}", inputs, outputs, [part], opts)

    @override
    def barrier(  # type: ignore[override]  # the C++ (opts) form only: see the collectives' note
        self, opts: dist.BarrierOptions | None = None
    ) -> dist.Work:
        if self._runs_here(opts, 0):  # dist.barrier(): Lightning's sync_dist runs one per metric
            self._engine.call_blocking((time.monotonic(), self._watch, describe_barrier), self._comm.Barrier)
            return completed_work([])
        return self._run("barrier", describe_barrier, [], [], [Part(MpiCall("Barrier", (), ()))], opts)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """Refused, naming what to use instead: torch implements the monitored barrier for gloo only, and an MPI
        barrier can neither time out nor be cancelled, so it cannot report the ranks that did not arrive."""
        del timeout, wait_all_ranks
        raise RuntimeError(
            "monitored_barrier: the mpi4py backend has none (torch implements it for gloo only, and an MPI barrier "
            "can neither time out nor be cancelled). barrier() on this group is watched instead: one still waiting "
            "after the group's timeout ends the job with a message naming it. To learn within a timeout which "
            'ranks did not arrive, use a gloo group: dist.new_group(backend="gloo").monitored_barrier(timeout).'
        )

    # --- point to point (always non-blocking: blocking sends could deadlock send/send pairs) ---------------

    @override
    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> dist.Work:
        parts = send_parts(self._mpi, self._comm, tensors, dst_rank, tag)

        def describe() -> str:
            return f"send to rank {dst_rank} (tag {tag}) of {describe_tensors(tensors)}"

        return self._post("send", describe, tensors, parts)

    @override
    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> dist.Work:
        def describe() -> str:
            return f"recv from rank {src_rank} (tag {tag}) of {describe_tensors(tensors)}"

        return self._post("recv", describe, tensors, recv_parts(self._mpi, self._comm, tensors, src_rank, tag))

    @override
    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        def describe() -> str:
            return f"recv from any rank (tag {tag}) of {describe_tensors(tensors)}"

        return self._post(
            "recvAnySource",
            describe,
            tensors,
            recv_parts(self._mpi, self._comm, tensors, self._mpi.ANY_SOURCE, tag),
            wants_source=True,
        )

    def _add_direct_target(self, op_code: int, reduce_op: ReduceOp, dtype: torch.dtype) -> DirectTarget | None:
        target = direct_target(self._mpi, reduce_op, dtype, self._size)
        self._direct_targets.setdefault(op_code, {})[dtype] = target
        return target
