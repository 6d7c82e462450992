"""How a rank's run ends, told to the parts that must act on it, without the strategy knowing who they are.

The strategy glue announces that a run starts on this rank and that it stopped on an exception. A transport that
must end the job its own way after a failure (the MPI transport calls ``MPI_Abort`` at exit, see
:mod:`lightning_dist_hooks.mpi`) subscribes here when it is imported; a user's transport can too::

    from lightning_dist_hooks import failure_notices

    def remember(error: BaseException | None) -> None:
        ...  # None: a new run starts, so an earlier run's failure was handled

    failure_notices.subscribe(remember)
"""

from __future__ import annotations

from collections.abc import Callable

FailureListener = Callable[[BaseException | None], None]

_listeners: list[FailureListener] = []


def subscribe(listener: FailureListener) -> None:
    """Call ``listener(None)`` when a run starts on this rank and ``listener(error)`` when one stops on ``error``
    (idempotent)."""
    if listener not in _listeners:
        _listeners.append(listener)


def announce_run_started() -> None:
    """A new run starts on this rank: whatever an earlier run stopped on was handled."""
    for listener in list(_listeners):
        listener(None)


def announce_failure(error: BaseException) -> None:
    """The run on this rank stopped on ``error`` and is tearing down."""
    for listener in list(_listeners):
        listener(error)
