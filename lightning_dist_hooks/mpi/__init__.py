"""MPI transport for ``torch.distributed`` on stock (PyPI) torch, which ships without native MPI support.

It adds the ``"mpi4py"`` backend and the ``mpi://`` init method to torch. Importing it changes nothing in torch:
they are registered when first asked for, by :func:`register`, :func:`mpi_init_method` or :func:`backend_for_mpi`
(and by ``lightning_dist_hooks.Trainer`` when ``torch_dist_backend`` names MPI). It neither imports mpi4py nor
initialises MPI: that happens when a process group is created. Under ``mpirun -n N``::

    import torch.distributed as dist
    from lightning_dist_hooks import mpi

    mpi.register()
    dist.init_process_group(backend=mpi.BACKEND_NAME, init_method=mpi.mpi_init_method())
    model = torch.nn.parallel.DistributedDataParallel(model)

Call :func:`register` before naming the backend anywhere else too, e.g. ``dist.new_group(backend="mpi4py")`` or
``pytorch_lightning.Trainer(strategy=DDPStrategy(process_group_backend="mpi4py"))``.

Collectives run on an MPI communicator (CPU tensors only) and no TCP port is opened. An operation that does not
complete within the process group's ``timeout`` ends the job with ``MPI_Abort`` and a message on stderr.
"""

from __future__ import annotations

from lightning_dist_hooks.mpi._abort import note_failure
from lightning_dist_hooks.mpi._doctor_checks import check_mpi4py, check_mpi_sockets
from lightning_dist_hooks.mpi._launch import MpiLaunch, check_mpi_launch, detect_mpi_launch, launched_by_mpi
from lightning_dist_hooks.mpi._listeners import warn_if_ranks_listen_needlessly
from lightning_dist_hooks.mpi._mpi import INSTALL_HINT, init_mpi
from lightning_dist_hooks.mpi._process_group import BACKEND_NAME, MpiProcessGroup
from lightning_dist_hooks.mpi._registration import (
    MPI_BACKENDS,
    backend_for_mpi,
    check_torch_for_the_transport,
    is_available,
    mpi_init_method,
    register,
    register_rendezvous,
    torch_fits_the_transport,
)
from lightning_dist_hooks.mpi._rendezvous import INIT_METHOD, mpi_rendezvous
from lightning_dist_hooks.mpi._store import MpiStore

__all__ = [
    "BACKEND_NAME",
    "INIT_METHOD",
    "INSTALL_HINT",
    "MPI_BACKENDS",
    "MpiLaunch",
    "MpiProcessGroup",
    "MpiStore",
    "backend_for_mpi",
    "check_mpi4py",
    "check_mpi_launch",
    "check_mpi_sockets",
    "check_torch_for_the_transport",
    "detect_mpi_launch",
    "init_mpi",
    "is_available",
    "launched_by_mpi",
    "mpi_init_method",
    "mpi_rendezvous",
    "note_failure",
    "register",
    "register_rendezvous",
    "torch_fits_the_transport",
    "warn_if_ranks_listen_needlessly",
]
