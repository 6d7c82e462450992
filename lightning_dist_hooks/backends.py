"""Checking a ``torch_dist_backend`` value before any process starts.

A wrong backend name otherwise surfaces minutes later, inside every rank, as a C++ error from
``init_process_group``. Here it is a ``ValueError`` at ``Trainer(...)`` that lists what this build offers. What each
backend needs is its transport's to say (:mod:`lightning_dist_hooks.transports`); nothing here names one.
"""

from __future__ import annotations

import difflib

import torch
import torch.distributed as dist

from lightning_dist_hooks.transports import (
    backend_parts,
    register_backend_with_torch,
    registered_transports,
    transport_named,
)

# Names torch lists that are not for training: its placeholder, and its test backend that moves no data.
_NOT_OFFERED = ("undefined", "fake")


def available_backends() -> list[str]:
    """Backend names a user can choose here, sorted: what this torch build can create (backends registered with torch
    directly included) and every name of each registered transport that can run here. The same list before and
    after a transport registers itself with torch.

    >>> "gloo" in available_backends() and "fake" not in available_backends()
    True
    """
    offered = {
        name for name in dist.Backend.backend_list if name not in _NOT_OFFERED and dist.is_backend_available(name)
    }
    for transport in registered_transports():
        if transport.is_available():
            offered |= set(transport.names)
    return sorted(offered)


def _did_you_mean(name: str) -> str:
    known = [name for transport in registered_transports() for name in transport.names]
    close = difflib.get_close_matches(name, available_backends() + known, n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def normalize_backend(backend: str) -> str:
    """Return the backend to create for ``torch_dist_backend=backend`` after checking that this torch build can create
    it: lower-cased, or what its transport turns the name into (:meth:`Transport.backend_for`); the transports it
    names are registered with torch on the way.

    Composite values such as ``"cpu:gloo,cuda:nccl"`` are checked part by part.

    >>> normalize_backend("GLOO")
    'gloo'
    """
    if not isinstance(backend, str):
        raise TypeError(f"torch_dist_backend must be a string or None, got {backend!r} ({type(backend).__name__}).")
    name = backend.strip().lower()
    transport = transport_named(name)
    if transport is not None:
        name = transport.backend_for(backend, name)
    register_backend_with_torch(name)  # torch must know a transport's name before it is checked
    for part in backend_parts(name):
        _check_single_backend(backend, part)
    return name


def _check_single_backend(given: str, name: str) -> None:
    transport = transport_named(name)
    if transport is not None and transport.install_hint and not dist.is_backend_available(name):
        raise ValueError(
            f"torch_dist_backend={given!r}: this torch build ({torch.__version__}) has no {name!r} backend. "
            f"To use it, {transport.install_hint}. Backends offered here: {', '.join(available_backends())}."
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
            "torch.distributed.Backend.register_backend(...) (or lightning_dist_hooks.register_transport(...)) "
            "before Trainer(...) is created."
        )


def backend_flag(backend: str, given: str | None = None) -> str:
    """``torch_dist_backend`` as messages name it: as the user wrote it (``given``), and, where its transport made it
    another backend, saying which; ``backend`` (the normalized name) where ``given`` is not known.

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
    if transport_named(backend) is not None:
        return f"{written} (the {backend} transport)"
    return f"{written} (used as {backend!r})"


def check_backend_fits_devices(backend: str, uses_cuda: bool, *, given: str | None = None) -> None:
    """A plain backend's transport moves the tensors of some device types only (``Transport.devices``: NCCL's CUDA,
    the mpi4py transport's CPU): say so before a run tries. A composite backend names a backend per device itself.

    ``given`` is the value as the user wrote it, for the message (see :func:`backend_flag`).
    """
    transport = transport_named(backend) if ":" not in backend else None
    if transport is None or transport.devices is None:
        return
    flag = backend_flag(backend, given)
    served = " and ".join(device.upper() for device in transport.devices)
    if uses_cuda and "cuda" not in transport.devices:
        raise ValueError(
            f"{flag} moves {served} tensors only, but this Trainer runs on CUDA. Use "
            "torch_dist_backend='nccl' on GPUs, or Trainer(accelerator='cpu')."
        )
    if not uses_cuda and "cpu" not in transport.devices:
        raise ValueError(
            f"{flag} needs {served} devices, but this Trainer's accelerator is not CUDA. "
            "Use torch_dist_backend='gloo' for CPU training, or Trainer(accelerator='cuda')."
        )
