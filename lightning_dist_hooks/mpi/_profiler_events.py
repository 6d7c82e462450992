"""The profiler's view of the transport: one event per operation, named as torch's own backends name theirs.

gloo, NCCL and torch's MPI backend record each operation as ``"<backend>:<operation>"`` (``gloo:all_reduce``) with
its input tensors' shapes, from the call until the operation completes, so a trace from ``torch.profiler`` or
``Trainer(profiler="pytorch")`` shows the communication; torch's own backend tests check exactly that. This
transport records ``mpi4py:all_reduce`` and so on the same way.

Without a profiler running, an operation pays one C call (``profiler_active``, about 50 ns) on its path. With one,
the process group runs every collective on its queue's thread (``_routed_group``): the event then ends on another
thread than it started on, which is what makes the profiler file it as asynchronous, as it files every other
backend's communication.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# torch's record_function without its context manager, so that another thread can end it; the profiler's own check.
from torch._C._autograd import _profiler_enabled, _record_function_with_args_enter, _record_function_with_args_exit

from lightning_dist_hooks.mpi._operation_names import BACKEND_NAME

__all__ = ["ProfilerEvent", "end_event", "profiler_active", "start_event"]

# An event in progress: torch's handle for it (a script object; torch's stub types it as a Tensor).
ProfilerEvent = torch.Tensor

# Whether a profiler records now (torch.profiler, torch.autograd.profiler, Lightning's PyTorchProfiler).
profiler_active = _profiler_enabled


def start_event(operation: str, inputs: Sequence[torch.Tensor]) -> ProfilerEvent:
    """Start the event ``mpi4py:<operation>``, recording the shapes of ``inputs`` as gloo does (a complex tensor as
    its real view, the form gloo communicates it in). Call only while ``profiler_active()``."""
    shown = [torch.view_as_real(tensor) if tensor.is_complex() else tensor for tensor in inputs]
    return _record_function_with_args_enter(f"{BACKEND_NAME}:{operation}", *shown)


def end_event(event: ProfilerEvent) -> None:
    _record_function_with_args_exit(event)
