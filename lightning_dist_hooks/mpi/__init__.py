"""MPI transport for ``torch.distributed`` on stock (PyPI) torch, which ships without native MPI support.

Importing this module registers the ``"mpi4py"`` backend and the ``mpi://`` init method with torch. It neither
imports mpi4py nor initialises MPI: that happens when a process group is created. Under ``mpirun -n N``::

    import torch.distributed as dist
    from lightning_dist_hooks import mpi

    dist.init_process_group(backend=mpi.BACKEND_NAME, init_method=mpi.mpi_init_method())
    model = torch.nn.parallel.DistributedDataParallel(model)

Collectives run on an MPI communicator (CPU tensors only) and no TCP port is opened. An operation that does not
complete within the process group's ``timeout`` ends the job with ``MPI_Abort`` and a message on stderr.
"""

from __future__ import annotations

import threading

import torch.distributed as dist

from ._launch import MpiLaunch, detect_mpi_launch, launched_by_mpi
from ._mpi import INSTALL_HINT, init_mpi, mpi4py_importable
from ._process_group import BACKEND_NAME, MpiProcessGroup, create_process_group
from ._rendezvous import INIT_METHOD, SCHEME, mpi_rendezvous

__all__ = [
    "BACKEND_NAME",
    "INIT_METHOD",
    "INSTALL_HINT",
    "MpiLaunch",
    "MpiProcessGroup",
    "backend_for_mpi",
    "detect_mpi_launch",
    "init_mpi",
    "is_available",
    "launched_by_mpi",
    "mpi_init_method",
    "register",
]

_registration_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register the ``"mpi4py"`` backend and the ``mpi://`` rendezvous with torch (idempotent, MPI untouched).

    Importing this module already calls it; call it again after anything that resets torch's registries.
    """
    global _registered
    with _registration_lock:
        if _registered:
            return
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu"])
        dist.register_rendezvous_handler(SCHEME, mpi_rendezvous)
        _registered = True


def is_available() -> bool:
    """Return whether the backend can run: mpi4py is installed (checked without importing it)."""
    return mpi4py_importable()


def mpi_init_method() -> str:
    """Return the ``init_method`` URL (``"mpi://"``) that creates no TCP store and takes rank/size from MPI.

    Pass it to ``init_process_group`` with backend ``"mpi4py"`` (or torch's native ``"mpi"``). It yields a
    process-local store, so backends that rendezvous through the store (gloo, nccl) cannot use it.
    """
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


register()
