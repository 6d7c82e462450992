"""Lazy access to mpi4py: importing ``mpi4py.MPI`` initialises MPI, so only a backend or rendezvous that is
actually used may do it."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from types import ModuleType

from lightning_dist_hooks.listening_sockets import MPI_LIBRARY, attributing_new_sockets
from lightning_dist_hooks.mpi._abort import install_abort_on_failure
from lightning_dist_hooks.supported_versions import SUPPORTED, warn_if_untested

INSTALL_HINT = f'pip install "mpi4py{SUPPORTED["mpi4py"]}" (from a clone of lightning-dist-hooks: pip install ".[mpi]")'


def mpi4py_importable() -> bool:
    """Return whether mpi4py is installed. Imports only the package: MPI starts with ``mpi4py.MPI``."""
    try:
        import mpi4py  # noqa: F401 - imported only to see whether it imports
    except ImportError:
        return False
    return True


def init_mpi() -> ModuleType:
    """Initialise MPI the way the backend needs it and return ``mpi4py.MPI``.

    From then on a rank that fails ends the whole job with ``MPI_Abort`` (see ``_abort``).

    Importing ``mpi4py.MPI`` initialises MPI (with ``MPI_THREAD_MULTIPLE``, which the backend requires)::

        MPI = init_mpi()
        rank = MPI.COMM_WORLD.Get_rank()
    """
    try:
        # MPI's start-up opens what listens for its transport (Open MPI's tcp BTL, unless --mca btl excludes it):
        # said here, so that the job's warning and the doctor name the MPI library for those sockets. Once started,
        # importing it again opens nothing, and /proc is not read again.
        started = "mpi4py.MPI" in sys.modules
        with nullcontext() if started else attributing_new_sockets(_mpi_library):
            from mpi4py import MPI
    except ImportError as error:
        raise ImportError(
            f"The 'mpi4py' torch.distributed backend needs the mpi4py package: {INSTALL_HINT}. "
            "It must be built against the MPI library that launches the job (mpirun/mpiexec)."
        ) from error
    warn_if_untested("mpi4py")
    # The training thread, the progress thread and each group's queue thread call MPI concurrently.
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            "The 'mpi4py' backend needs MPI initialised with MPI_THREAD_MULTIPLE, but it provides level "
            f"{MPI.Query_thread()}. Do not lower mpi4py.rc.thread_level, and use an MPI library built with "
            "thread support."
        )
    install_abort_on_failure(MPI)
    return MPI


def _mpi_library() -> str:
    """Who opened the sockets MPI's start-up opened: the MPI library, and whose transport it runs."""
    from mpi4py import MPI

    version = MPI.Get_library_version()
    if version.startswith("Open MPI"):
        return f"{MPI_LIBRARY} (Open MPI's tcp transport)"
    return f"{MPI_LIBRARY} ({version.split(',')[0].strip()}'s transport)"
