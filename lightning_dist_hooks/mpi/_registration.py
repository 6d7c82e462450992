"""Registering the ``"mpi4py"`` backend and the ``mpi://`` rendezvous with torch, when first asked for, and choosing
between torch's own MPI and this transport."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
from packaging.specifiers import SpecifierSet

from lightning_dist_hooks.mpi._group_creation import new_mpi_process_group
from lightning_dist_hooks.mpi._mpi import mpi4py_importable
from lightning_dist_hooks.mpi._process_group import BACKEND_NAME
from lightning_dist_hooks.mpi._rendezvous import INIT_METHOD, SCHEME, mpi_rendezvous
from lightning_dist_hooks.supported_versions import MPI_TRANSPORT_TORCH
from lightning_dist_hooks.torch_rendezvous import register_once

# The backend names that mean MPI: torch's own and this package's transport.
MPI_BACKENDS = ("mpi", BACKEND_NAME)

_registration_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register the ``"mpi4py"`` backend and the ``mpi://`` rendezvous with torch (idempotent, MPI untouched).

    Not done at import: a library import should not change torch's process-wide registries (torch refuses a
    second handler for a scheme, so two packages both registering ``mpi://`` at import could not be imported
    together). Call it once before the backend name or ``mpi://`` is used.
    """
    global _registered
    check_torch_for_the_transport()
    register_rendezvous()
    with _registration_lock:
        if _registered:
            return
        dist.Backend.register_backend(BACKEND_NAME, new_mpi_process_group, extended_api=True, devices=["cpu"])
        _registered = True


def register_rendezvous() -> None:
    """Register the ``mpi://`` rendezvous alone with torch (idempotent, MPI untouched): what gloo, NCCL and the other
    backends need to meet through :class:`MpiStore`; unlike the transport, it works on every supported torch."""
    register_once(SCHEME, mpi_rendezvous)


def torch_fits_the_transport(torch_version: str | None = None) -> bool:
    """Whether this torch (or ``torch_version``) lies in the transport's range, ``MPI_TRANSPORT_TORCH``."""
    return (torch_version or torch.__version__) in SpecifierSet(MPI_TRANSPORT_TORCH)


def check_torch_for_the_transport(torch_version: str | None = None) -> None:
    """Raise ``RuntimeError``, naming the fix, when this torch (or ``torch_version``) is older than the transport needs.

    >>> check_torch_for_the_transport("2.13.0+cpu")
    """
    torch_version = torch_version or torch.__version__
    if not torch_fits_the_transport(torch_version):
        raise RuntimeError(
            f"The MPI transport of lightning_dist_hooks (backend {BACKEND_NAME!r}, init method {INIT_METHOD!r}) needs "
            f"torch{MPI_TRANSPORT_TORCH}, but this is torch {torch_version}: older releases never hand a process "
            "group written in Python the single-tensor collectives (all_to_all_single, all_gather_single, "
            f"reduce_scatter_single). Upgrade torch (pip install 'torch{MPI_TRANSPORT_TORCH}'), or use "
            "torch_dist_backend='gloo'."
        )


def is_available() -> bool:
    """Return whether the backend can run: mpi4py is installed (checked without importing it)."""
    return mpi4py_importable()


def mpi_init_method() -> str:
    """Return the ``init_method`` URL (``"mpi://"``) that creates no TCP store and takes rank/size from MPI.

    Pass it to ``init_process_group`` with any backend: ``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``, this
    package's ``"mpi4py"`` (or torch's native ``"mpi"``). The ``mpi://`` rendezvous is registered on the way, and
    the ``"mpi4py"`` backend too where this torch can run it. Every backend meets through an :class:`MpiStore`
    (collective: every rank of the MPI job must call ``init_process_group``)::

        dist.init_process_group("gloo", init_method=mpi.mpi_init_method())
    """
    register_rendezvous()
    if torch_fits_the_transport():
        register()
    return INIT_METHOD


def backend_for_mpi() -> str:
    """Return the torch backend name to use when MPI is requested.

    torch's own ``"mpi"`` backend when torch was built with MPI, otherwise this module's ``"mpi4py"`` (registered
    on the way). A trainer asked for ``"mpi"`` can pass the result to ``init_process_group`` together with
    :func:`mpi_init_method`.
    """
    if dist.is_mpi_available():
        return dist.Backend.MPI
    register()
    return BACKEND_NAME
