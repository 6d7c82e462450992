"""The two LightningModule hooks, their documented defaults, and how the Trainer finds a user's override.

Hooks are found by name, so any LightningModule (of either Lightning package) can define them; inheriting
:class:`DistributedHooksMixin` (or ``lightning_dist_hooks.LightningModule``) only adds the defaults and their type
hints. This module imports no Lightning package: the mixin serves both.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed
from torch.utils.data import DataLoader, Sampler

from lightning_dist_hooks import _lightning_internals

if TYPE_CHECKING:
    from lightning_dist_hooks._lightning_internals import RunningStage, Trainer


def default_setup_distributed_backend(
    backend: str,
    init_method: str,
    rank: int,
    world_size: int,
    timeout: timedelta,
    device_id: torch.device | None = None,
) -> None:
    """What ``setup_distributed_backend`` does unless overridden: exactly one ``init_process_group`` call, with the
    arguments Lightning passes (``device_id`` binds an NCCL group to the rank's GPU; None on CPU)."""
    torch.distributed.init_process_group(
        backend=backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
    )


def takes_device_id(hook: Callable[..., Any]) -> bool:
    """Whether ``hook`` accepts ``device_id``: hooks written with the five-argument signature are called without it.

    >>> takes_device_id(default_setup_distributed_backend)
    True
    >>> takes_device_id(lambda backend, init_method, rank, world_size, timeout: None)
    False
    """
    parameters = inspect.signature(hook).parameters.values()
    return any(p.name == "device_id" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def lightning_default_sampler(trainer: Trainer, dataloader: DataLoader, stage: RunningStage) -> Sampler | None:
    """The sampler Lightning's Trainer would give ``dataloader`` today, or None where it keeps the loader.

    Honours ``use_distributed_sampler``, wraps custom samplers in ``DistributedSamplerWrapper`` and uses the
    predict-time wrapper, as Lightning does. Call it from a ``configure_sampler`` override (a datamodule's too)
    to fall back to Lightning's choice for some loaders.
    """
    return _lightning_internals.lightning_sampler_choice(trainer, dataloader, stage)


class DistributedHooksMixin:
    """Adds the documented defaults of both hooks to a ``LightningModule`` subclass.

    Example::

        class Model(DistributedHooksMixin, pl.LightningModule):  # or L.LightningModule
            def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout, device_id=None):
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "ib0")
                super().setup_distributed_backend(backend, init_method, rank, world_size, timeout, device_id)

            def configure_sampler(self, dataloader, stage):
                if stage == "train":
                    return MyDistributedSampler(dataloader.dataset, self.trainer.world_size, self.global_rank)
                return super().configure_sampler(dataloader, stage)
    """

    trainer: Trainer

    def setup_distributed_backend(
        self,
        backend: str,
        init_method: str,
        rank: int,
        world_size: int,
        timeout: timedelta,
        device_id: torch.device | None = None,
    ) -> None:
        """Create the default process group of this rank. Called once per rank, before any collective.

        Args:
            backend: the resolved backend, e.g. ``"gloo"`` or ``"nccl"``.
            init_method: the resolved rendezvous URL: ``"env://"`` (``MASTER_ADDR``/``MASTER_PORT`` already set),
                ``"tcp://HOST:PORT"`` or ``"file:///PATH"``.
            rank: this process's global rank.
            world_size: the number of processes.
            timeout: the strategy's process-group timeout.
            device_id: this rank's device when it is an accelerator (``torch.device("cuda", local_rank)``), None on
                CPU: what Lightning passes to ``init_process_group(device_id=...)``, so that NCCL binds the group to
                the rank's GPU at once. It is already the current CUDA device. An override declared without this
                parameter (the five-argument form) is called without it.

        An override may build the group any way it likes; when it returns, the default group must exist with
        this ``rank`` and ``world_size``. On GPUs, pass ``device_id`` on as Lightning does::

            def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout, device_id=None):
                torch.distributed.init_process_group(backend, init_method=init_method, rank=rank,
                                                     world_size=world_size, timeout=timeout, device_id=device_id)
        """
        default_setup_distributed_backend(backend, init_method, rank, world_size, timeout, device_id)

    def configure_sampler(self, dataloader: DataLoader, stage: RunningStage) -> Sampler | None:
        """Choose the sampler of ``dataloader``; called for every DataLoader the Trainer prepares.

        Args:
            dataloader: the loader as the user's ``*_dataloader`` returned it.
            stage: ``"train"``, ``"validate"`` (also when prepared for the sanity check), ``"test"`` or
                ``"predict"``.

        Returns:
            A ``Sampler``: the loader is rebuilt with it (batch size, workers, collate kept).
            ``None``: the loader is used exactly as given (no distributed sampler is injected).

        The process group exists when this is called: ``self.global_rank`` and ``self.trainer.world_size`` are
        valid. The default returns what Lightning chooses today.
        """
        return lightning_default_sampler(self.trainer, dataloader, stage)


def user_hook(owner: object, name: str) -> Callable[..., Any] | None:
    """``owner``'s own implementation of hook ``name``, bound; None if it has none or only the default."""
    if owner is None:
        return None
    implementation = getattr(type(owner), name, None)
    if implementation is None or implementation is getattr(DistributedHooksMixin, name):
        return None
    return getattr(owner, name)


def sampler_hook(trainer: Trainer) -> Callable[[DataLoader, RunningStage], Sampler | None] | None:
    """The ``configure_sampler`` to call: the datamodule's wins over the LightningModule's."""
    datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning's data connector
    return user_hook(datamodule, "configure_sampler") or user_hook(trainer.lightning_module, "configure_sampler")
