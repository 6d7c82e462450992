"""Checking a ``torch_dist_backend`` value before any process starts.

A wrong backend name otherwise surfaces minutes later, inside every rank, as a C++ error from
``init_process_group``. Here it is a ``ValueError`` at ``Trainer(...)`` that lists what this build offers.
"""

from __future__ import annotations

import difflib
import logging
import os

import torch
import torch.distributed as dist

from lightning_dist_hooks import mpi
from lightning_dist_hooks.launcher_variables import LaunchSize, SizeMismatch

log = logging.getLogger(__name__)

# Backends whose ranks are started and numbered by MPI itself: torch's own and this package's transport.
MPI_BACKENDS = ("mpi", mpi.BACKEND_NAME)

# Backends torch itself knows; any of them may be missing from a given build (PyPI wheels lack mpi and ucc).
NATIVE_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")

_HOW_TO_GET_NATIVE = {
    "nccl": "install a CUDA build of torch and run on NVIDIA GPUs; for CPU training use torch_dist_backend='gloo'",
    "mpi": f"install mpi4py ({mpi.INSTALL_HINT}) and start the ranks with mpirun",
    "ucc": "build torch from source with USE_UCC=1, or use torch_dist_backend='gloo'",
    "xccl": "install an XPU build of torch and run on Intel GPUs",
    "gloo": "install a torch build with distributed support",
}


# Names torch lists that are not for training: its placeholder, and its test backend that moves no data.
_NOT_OFFERED = ("undefined", "fake")


def available_backends() -> list[str]:
    """Backend names a user can choose here, sorted: what this torch build can create (registered third-party
    backends included) and, where mpi4py is installed and torch is new enough, this package's MPI transport under
    both its names. The same list before and after the transport registers itself.

    >>> "gloo" in available_backends() and "fake" not in available_backends()
    True
    """
    offered = {
        name for name in dist.Backend.backend_list if name not in _NOT_OFFERED and dist.is_backend_available(name)
    }
    if mpi.is_available() and mpi.torch_fits_the_transport():
        offered |= set(MPI_BACKENDS)
    return sorted(offered)


def _did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name, available_backends() + list(NATIVE_BACKENDS), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def normalize_backend(backend: str) -> str:
    """Return ``backend`` lower-cased after checking that this torch build can create it.

    Composite values such as ``"cpu:gloo,cuda:nccl"`` are checked part by part.

    >>> normalize_backend("GLOO")
    'gloo'
    """
    if not isinstance(backend, str):
        raise TypeError(f"torch_dist_backend must be a string or None, got {backend!r} ({type(backend).__name__}).")
    name = backend.strip().lower()
    if name in MPI_BACKENDS:
        return _mpi_backend(backend, name)
    register_if_mpi4py(name)  # e.g. "cpu:mpi4py": torch must know the name before it is checked
    for part in name.split(","):
        _check_single_backend(backend, part.split(":")[-1].strip())
    return name


def register_if_mpi4py(backend: str | None) -> None:
    """Register the mpi4py transport with torch in this process if ``backend`` (plain or composite) uses it.

    Importing this package registers nothing with torch; the transport is registered when it is first asked for:
    here, when the Trainer checks ``torch_dist_backend`` and on every rank before its process group is created
    (a ``ddp_spawn`` child, or a strategy given ``process_group_backend="mpi4py"`` directly, never checks a flag).
    """
    if backend is not None and mpi.BACKEND_NAME in (part.split(":")[-1].strip() for part in backend.split(",")):
        mpi.register()


def _mpi_backend(given: str, name: str) -> str:
    """torch's own MPI where the build has it; else (and when asked by name) the mpi4py transport."""
    if name == "mpi" and dist.is_mpi_available():
        return "mpi"
    if not mpi.is_available():
        raise ValueError(
            f"torch_dist_backend={given!r}: this torch build ({torch.__version__}) has no native MPI, and the MPI "
            f"transport of lightning_dist_hooks needs mpi4py, which is not installed. Install it: {mpi.INSTALL_HINT}. "
            "Or use torch_dist_backend='gloo'."
        )
    if name == "mpi":
        log.info(
            "torch has no native MPI backend: torch_dist_backend='mpi' uses lightning_dist_hooks' mpi4py transport"
        )
    return mpi.backend_for_mpi()


def _check_single_backend(given: str, name: str) -> None:
    if name in NATIVE_BACKENDS and not dist.is_backend_available(name):
        raise ValueError(
            f"torch_dist_backend={given!r}: this torch build ({torch.__version__}) has no {name!r} backend. "
            f"To use it, {_HOW_TO_GET_NATIVE[name]}. Backends offered here: {', '.join(available_backends())}."
        )
    if name == "fake":
        raise ValueError(
            f"torch_dist_backend={given!r} is torch's test backend: its collectives move no data, so the ranks would "
            f"train apart. Backends offered here: {', '.join(available_backends())}."
        )
    if name not in dist.Backend.backend_list or name in _NOT_OFFERED:
        raise ValueError(
            f"torch_dist_backend={given!r} is not a torch.distributed backend.{_did_you_mean(name)} Backends "
            "offered here: "
            f"{', '.join(available_backends())}; a third-party backend must be registered with "
            "torch.distributed.Backend.register_backend(...) before Trainer(...) is created."
        )


def backend_flag(backend: str, given: str | None = None) -> str:
    """``torch_dist_backend`` as messages name it: as the user wrote it (``given``), and, where that became this
    package's MPI transport, saying so; ``backend`` (the normalized name) where ``given`` is not known.

    >>> backend_flag("mpi4py", given="mpi")
    "torch_dist_backend='mpi' (the mpi4py transport)"
    >>> backend_flag("gloo", given="GLOO"), backend_flag("mpi4py")
    ("torch_dist_backend='GLOO'", "torch_dist_backend='mpi4py'")
    """
    if given is None:
        return f"torch_dist_backend={backend!r}"
    written = f"torch_dist_backend={given!r}"
    if given.strip().lower() == backend:
        return written
    if backend == mpi.BACKEND_NAME:
        return f"{written} (the {mpi.BACKEND_NAME} transport)"
    return f"{written} (used as {backend!r})"


def check_backend_fits_devices(backend: str, uses_cuda: bool, *, given: str | None = None) -> None:
    """NCCL runs only between CUDA devices, the mpi4py transport only on CPU: say so before a run tries.

    ``given`` is the value as the user wrote it, for the message (see :func:`backend_flag`).
    """
    flag = backend_flag(backend, given)
    if backend == mpi.BACKEND_NAME and uses_cuda:
        raise ValueError(
            f"{flag} moves CPU tensors only, but this Trainer runs on CUDA. Use "
            "torch_dist_backend='nccl' on GPUs, or Trainer(accelerator='cpu')."
        )
    if "nccl" in backend and not uses_cuda and ":" not in backend:
        raise ValueError(
            f"{flag} needs CUDA devices, but this Trainer's accelerator is not CUDA. "
            "Use torch_dist_backend='gloo' for CPU training, or Trainer(accelerator='cuda')."
        )


def _processes(count: int) -> str:
    return f"{count} process{'' if count == 1 else 'es'}"


def check_mpi_launch(
    backend: str | None,
    init_method: str | None,
    needs_mpi_launch: bool,
    num_devices: int,
    num_nodes: int,
    *,
    given_backend: str | None = None,
    devices_by_default: str | None = None,
    owner: str = "Trainer",
) -> None:
    """An MPI backend, or an init method whose scheme ``needs_mpi_launch`` (``mpi://``), needs ranks started by an
    MPI launcher, as many as the Trainer expects.

    Checked from the launcher's environment variables (:func:`lightning_dist_hooks.mpi.detect_mpi_launch`), so
    MPI is not initialised. Does nothing when neither the backend nor the init method needs MPI. For the messages:
    ``given_backend`` is ``torch_dist_backend`` as the user wrote it; ``devices_by_default``, where the user left
    ``devices`` at Lightning's default ``'auto'``, what that gave (e.g. ``"1 process per node on CPU"``); ``owner``
    names the class (``Trainer``, ``Fabric``).
    """
    uses_backend = backend in MPI_BACKENDS
    if not uses_backend and not needs_mpi_launch:
        return
    flag = (
        backend_flag(backend, given_backend)
        if backend is not None and uses_backend
        else f"torch_dist_init_method={init_method!r}"
    )
    expected = num_devices * num_nodes
    launch = mpi.detect_mpi_launch()
    if launch is None and "PMIX_RANK" in os.environ:
        return  # a PMIx launcher (srun --mpi=pmix) exports the rank but no job size to compare with
    if launch is None:
        otherwise = "torch_dist_backend='gloo'" if uses_backend else "another init method, e.g. 'dir:///shared/rdzv/'"
        raise ValueError(
            f"{flag} needs every rank started by an MPI launcher, but this process was not (no variable of Open MPI, "
            f"MPICH/Intel MPI, MVAPICH or PMIx is set). Start the script with `mpirun -n {expected} python ...` (or "
            f"`srun --mpi=pmix --ntasks-per-node={num_devices} python ...` under SLURM), or use {otherwise}."
        )
    if SizeMismatch.WORLD_SIZE not in LaunchSize(launch.world_size).mismatches(num_devices, num_nodes):
        return
    if devices_by_default is not None:
        raise ValueError(
            f"{owner}(num_nodes={num_nodes}) leaves devices at its default ('auto': {devices_by_default}), which "
            f"makes a world of {_processes(expected)}, but the MPI launcher started {launch.world_size} ({flag}). "
            f"{_devices_fix(launch.world_size, launch.local_world_size, num_nodes, owner)}"
        )
    raise ValueError(
        f"{owner}(devices={num_devices}, num_nodes={num_nodes}) makes a world of {_processes(expected)}, but the "
        f"MPI launcher started {launch.world_size} ({flag}). Start the job with `mpirun -n {expected}`, or set "
        f"devices x num_nodes to {launch.world_size}."
    )


def _devices_fix(world_size: int, ranks_per_node: int, num_nodes: int, owner: str) -> str:
    """What to pass for ``devices`` (and ``num_nodes``) to match a launcher of ``world_size`` ranks, this node's
    ``ranks_per_node`` of them (1 may only mean that the launcher does not say).

    >>> _devices_fix(2, 2, 1, "Trainer")
    "Pass devices=2, the launcher's ranks per node: Trainer(devices=2, num_nodes=1)."
    >>> _devices_fix(8, 4, 1, "Fabric")
    "Pass devices=4, the launcher's ranks per node, and num_nodes=2: Fabric(devices=4, num_nodes=2)."
    >>> _devices_fix(6, 1, 2, "Trainer")
    "Pass devices=N, N the launcher's ranks per node, with N x num_nodes = 6."
    """
    if ranks_per_node > 1 and world_size % ranks_per_node == 0:
        nodes = world_size // ranks_per_node
        also = f", and num_nodes={nodes}" if nodes != num_nodes else ""
        return (
            f"Pass devices={ranks_per_node}, the launcher's ranks per node{also}: "
            f"{owner}(devices={ranks_per_node}, num_nodes={nodes})."
        )
    return f"Pass devices=N, N the launcher's ranks per node, with N x num_nodes = {world_size}."
