"""Routes every dataloader the Trainer prepares through ``configure_sampler``."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from lightning_dist_hooks import _lightning_internals
from lightning_dist_hooks._lightning_internals import Flavour
from lightning_dist_hooks.hooks import Stage, sampler_hook


class SamplerHookError(RuntimeError):
    """``configure_sampler`` raised; the message names the rank and the dataloader's stage."""


def _prepare_with_configure_sampler(self: Any, dataloader: object, shuffle: bool, mode: Any) -> object:
    """Lightning's preparation of a dataloader, except that a user's ``configure_sampler`` decides its sampler.

    Without an override, Lightning's own code runs untouched, so the default is bit-for-bit today's behaviour. The
    hook gets ``mode`` as a :class:`Stage`: it prints as ``"train"`` (not ``RunningStage.TRAINING``) and equals
    ``mode``.
    """
    configure_sampler = sampler_hook(self.trainer)
    if configure_sampler is None or not isinstance(dataloader, DataLoader):
        return _lightning_internals.lightning_prepare_dataloader(self, dataloader, shuffle, mode)
    try:
        sampler = configure_sampler(dataloader, Stage(mode))
    except Exception as error:
        raise SamplerHookError(
            f"configure_sampler raised {type(error).__name__} on rank {self.trainer.global_rank} of "
            f"{self.trainer.world_size} for the {mode.value} dataloader: {error}"
        ) from error
    if sampler is None:
        return dataloader
    return _lightning_internals.rebuild_dataloader(dataloader, sampler, mode)


def sampler_hook_data_connector(flavour: Flavour, module: str) -> type:
    """``flavour``'s data connector with ``configure_sampler``, named ``SamplerHookDataConnector`` in ``module``.

    The name must be importable: ``ddp_spawn`` pickles the trainer, data connector included, by reference.
    """
    return _lightning_internals.data_connector_class(
        flavour, "SamplerHookDataConnector", module, _prepare_with_configure_sampler
    )


def install_sampler_hook(trainer: Any) -> None:
    """Make ``trainer`` consult ``configure_sampler``; its data connector keeps all its state."""
    flavour = _lightning_internals.flavour_of(trainer)
    assert flavour is not None
    _lightning_internals.replace_data_connector_class(trainer, flavour.classes().SamplerHookDataConnector)
