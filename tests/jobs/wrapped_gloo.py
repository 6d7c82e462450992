"""Transports from outside the package, as a user's package would write them: gloo under names of its own.

Registered by a call (:func:`register`, what ``transport_job.py`` does) or through the entry point group
``lightning_dist_hooks.transports`` (what the doctor's test writes), never by this package. Each says what it hears
on stdout, so that a test can see its hooks called in every rank.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist
from typing_extensions import override

from lightning_dist_hooks import Transport, register_transport
from lightning_dist_hooks.verdict import OK, Verdict


def _new_gloo_group(store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroupGloo:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class WrappedGlooTransport(Transport):
    """gloo, CPU tensors only, under the name ``"wrapped-gloo"``."""

    names = ("wrapped-gloo",)
    devices = ("cpu",)

    @override
    def register_with_torch(self, name: str) -> None:
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _new_gloo_group, devices=["cpu"])

    @override
    def run_started(self) -> None:
        print(f"{self.names[0]} heard: a run starts in pid {os.getpid()}", flush=True)

    @override
    def run_failed(self, error: BaseException) -> None:
        print(f"{self.names[0]} heard: pid {os.getpid()} failed on {type(error).__name__}: {error}", flush=True)

    @override
    def doctor_checks_before(self, backend: str | None) -> list[Verdict]:
        return [Verdict(self.names[0], OK, f"torch_dist_backend={backend!r}: gloo under a name of its own")]


class CudaGlooTransport(WrappedGlooTransport):
    """The same, claiming to move CUDA tensors only: a CPU Trainer must refuse it."""

    names = ("cuda-gloo",)
    devices = ("cuda",)


class MpiLaunchedGlooTransport(WrappedGlooTransport):
    """The same, claiming to need ranks an MPI launcher started: a Trainer started without one must refuse it."""

    names = ("mpi-launched-gloo",)
    needs_mpi_launch = True


def register() -> None:
    for transport in (WrappedGlooTransport(), CudaGlooTransport(), MpiLaunchedGlooTransport()):
        register_transport(transport)
