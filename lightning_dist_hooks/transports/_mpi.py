"""MPI as two registry entries (``lightning_dist_hooks.transports``): torch's own ``"mpi"``, which falls back to this
package's transport where the build has no MPI, and the ``"mpi4py"`` transport, which also speaks for any job an MPI
launcher started (the listener warning, the doctor's checks, ending the job on a failure)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.launcher_variables import started_by_an_mpi_launcher
from lightning_dist_hooks.listening_sockets import MPI_LIBRARY
from lightning_dist_hooks.mpi import (
    BACKEND_NAME,
    INSTALL_HINT,
    MPI_BACKENDS,
    backend_for_mpi,
    check_mpi4py,
    check_mpi_sockets,
    is_available,
    note_failure,
    register,
    torch_fits_the_transport,
    warn_if_ranks_listen_needlessly,
)
from lightning_dist_hooks.transports._base import CreatedGroup, Transport
from lightning_dist_hooks.verdict import Verdict

log = logging.getLogger(__name__)


def _backend_for_mpi(given: str, name: str) -> str:
    """torch's own MPI where the build has it; else (and when asked by name) the mpi4py transport."""
    if name == "mpi" and dist.is_mpi_available():
        return "mpi"
    if not is_available():
        raise ValueError(
            f"torch_dist_backend={given!r}: this torch build ({torch.__version__}) has no native MPI, and the MPI "
            f"transport of lightning_dist_hooks needs mpi4py, which is not installed. Install it: {INSTALL_HINT}. "
            "Or use torch_dist_backend='gloo'."
        )
    if name == "mpi":
        log.info(
            "torch has no native MPI backend: torch_dist_backend='mpi' uses lightning_dist_hooks' mpi4py transport"
        )
    return backend_for_mpi()


class TorchMpiTransport(Transport):
    """torch's native ``"mpi"`` (CPU and, with a CUDA-aware MPI, CUDA): where this torch build lacks it, the name
    means the ``"mpi4py"`` transport."""

    names = ("mpi",)
    needs_mpi_launch = True
    install_hint = f"install mpi4py ({INSTALL_HINT}) and start the ranks with mpirun"

    @override
    def is_available(self) -> bool:
        return dist.is_mpi_available() or (is_available() and torch_fits_the_transport())

    @override
    def backend_for(self, given: str, name: str) -> str:
        return _backend_for_mpi(given, name)


class MpiTransport(Transport):
    """This package's ``"mpi4py"`` backend (CPU tensors over an MPI communicator); it speaks for every job an MPI
    launcher started, whatever its backend: the listening sockets MPI or a TCP store opened, and ``MPI_Abort``
    at exit after a failure, which its peers would otherwise wait out in a collective."""

    names = (BACKEND_NAME,)
    form = f'``"{BACKEND_NAME}"`` (this package\'s MPI transport, with mpi4py, for torch builds without MPI)'
    devices = ("cpu",)
    needs_mpi_launch = True
    install_hint = f"install mpi4py ({INSTALL_HINT})"
    reads_listeners = True

    @override
    def is_available(self) -> bool:
        return is_available() and torch_fits_the_transport()

    @override
    def backend_for(self, given: str, name: str) -> str:
        return _backend_for_mpi(given, name)

    @override
    def register_with_torch(self, name: str) -> None:
        register()

    @override
    def takes_part(self, backend: str) -> bool:
        return backend in MPI_BACKENDS or started_by_an_mpi_launcher(os.environ)

    @override
    def after_group_created(self, group: CreatedGroup) -> None:
        warn_if_ranks_listen_needlessly(group.backend, group.tcp_store_port, group.warn)

    @override
    def run_started(self) -> None:
        note_failure(None)

    @override
    def run_failed(self, error: BaseException) -> None:
        note_failure(error)

    @override
    def doctor_checks_before(self, backend: str | None) -> list[Verdict]:
        verdict = check_mpi4py(backend, is_available(), INSTALL_HINT)
        return [] if verdict is None else [verdict]

    @override
    def doctor_facts(self) -> dict[str, Any]:
        return {"mpi_launched": started_by_an_mpi_launcher(os.environ)}

    @override
    def doctor_checks_after(self, backend: str, ranks: list[dict[str, Any]], spans_nodes: bool) -> list[Verdict]:
        verdict = check_mpi_sockets(backend, ranks, spans_nodes)
        return [] if verdict is None else [verdict]

    @override
    def opened_before_rendezvous(self) -> str | None:
        if "mpi4py.MPI" in sys.modules:
            # Lightning's MPIEnvironment.detect() imports mpi4py.MPI (initialising MPI) whenever mpi4py is installed:
            # then MPI started before anything could watch it.
            return f"{MPI_LIBRARY}, initialised before the rendezvous"
        return None
