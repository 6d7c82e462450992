"""End the whole MPI job as soon as one rank fails, instead of letting its peers wait in a collective.

A Python rank that ends with an exception still runs its exit handlers, and mpi4py's finalizer calls
``MPI_Finalize``, which waits for every peer. The peers meanwhile wait in a collective this rank will never join,
so the job would hang until the process group timeout. ``python -m mpi4py`` avoids this with ``MPI_Abort``; this
module does the same for ranks started as plain scripts:

* an unhandled exception (``sys.excepthook`` records it and prints the traceback);
* an exception that a trainer caught, tore down after and recorded with :func:`note_failure`, even if the script
  then swallowed it;

end the job with ``MPI_Abort`` and a message naming the rank and the exception when the process exits, before
``MPI_Finalize`` (Python runs exit handlers after the exception hook and after non-daemon threads ended).

A normal exit finalises MPI as usual (exit code 0).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from types import ModuleType, TracebackType
from typing import NoReturn

_PREFIX = "[lightning_dist_hooks.mpi]"
# Open MPI's mpirun drops what a rank wrote just before MPI_Abort unless it had a moment to read it.
_OUTPUT_DRAIN_S = 0.5

_install_lock = threading.Lock()
_installed = False
_recorded_failure: str | None = None  # how this rank failed, once it has


def abort_job(mpi: ModuleType, reason: str) -> NoReturn:
    """Write ``reason`` (prefixed with this rank) to stderr, then end every rank of the job with ``MPI_Abort``."""
    sys.stderr.write(f"{_PREFIX} rank {mpi.COMM_WORLD.Get_rank()}: {reason}\n")
    sys.stderr.flush()
    # The launcher forwards output through pipes it stops reading once it starts killing ranks.
    time.sleep(_OUTPUT_DRAIN_S)
    mpi.COMM_WORLD.Abort(1)
    raise AssertionError("MPI_Abort returned")  # never reached: MPI_Abort does not return


def install_abort_on_failure(mpi: ModuleType) -> None:
    """Make a failing rank abort the MPI job (idempotent). Called once MPI is initialised."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        previous_hook = sys.excepthook

        def record_unhandled_exception(
            kind: type[BaseException], error: BaseException, traceback: TracebackType | None
        ) -> None:
            # Only recorded: torch's own hook wraps this one and prints what it writes afterwards, so aborting
            # here would lose the traceback. The exit handler below aborts.
            previous_hook(kind, error, traceback)
            _record(f"ended with an unhandled exception: {_name(error)}")

        sys.excepthook = record_unhandled_exception
        # Registered after mpi4py.MPI was imported, so it runs before mpi4py finalises MPI.
        atexit.register(_abort_if_failure_recorded, mpi)


def note_failure(error: BaseException | None) -> None:
    """Record that this rank stopped on ``error`` (None: forget it, a new run starts); see the module docstring.

    The MPI transport's failure hooks (``MpiTransport.run_started``, ``run_failed``), which this package's strategies
    call, record it; a trainer of your own calls it when it tears down after an exception, e.g. from
    ``Strategy.on_exception``.
    """
    _record(None if error is None else f"is exiting after a trainer stopped on {_name(error)}")


def failure_recorded() -> bool:
    """Whether this rank will end the job with ``MPI_Abort`` at exit (so it must not wait for its peers first)."""
    return _recorded_failure is not None


def _record(failure: str | None) -> None:
    global _recorded_failure
    _recorded_failure = failure


def _abort_if_failure_recorded(mpi: ModuleType) -> None:
    if _recorded_failure is not None and _mpi_running(mpi):
        abort_job(mpi, f"{_recorded_failure.rstrip('.')}. {_WHY_ABORT}")


_WHY_ABORT = (
    "Ending the MPI job with MPI_Abort: its peers would otherwise wait in a collective until the process group timeout."
)


def _name(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _mpi_running(mpi: ModuleType) -> bool:
    return bool(mpi.Is_initialized() and not mpi.Is_finalized())
