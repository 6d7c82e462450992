"""The plain records one MPI operation is passed around as: the MPI calls it makes and the deadline it must meet.

The process group builds them, the work objects, the collective queues and the progress engine read them; they
import nothing of the transport, so every one of those modules can. A blocking call's record is a bare tuple
(:data:`BlockingCall`), built on the path of every blocking collective, and becomes a :class:`Deadline` only when
the watchdog checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import NamedTuple

import torch


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
