"""Routes every dataloader the Trainer prepares through ``configure_sampler``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytorch_lightning.trainer.states import RunningStage
from torch.utils.data import DataLoader

from lightning_dist_hooks import _lightning_internals
from lightning_dist_hooks.hooks import sampler_hook

if TYPE_CHECKING:
    import pytorch_lightning as pl


class SamplerHookError(RuntimeError):
    """``configure_sampler`` raised; the message names the rank and the dataloader's stage."""


class SamplerHookDataConnector(_lightning_internals.LightningDataConnector):
    """Lightning's data connector, except that a user's ``configure_sampler`` decides each loader's sampler.

    Without an override, Lightning's own code runs untouched, so the default is bit-for-bit today's behaviour.
    """

    def _prepare_dataloader(self, dataloader: object, shuffle: bool, mode: RunningStage) -> object:
        configure_sampler = sampler_hook(self.trainer)
        if configure_sampler is None or not isinstance(dataloader, DataLoader):
            return super()._prepare_dataloader(dataloader, shuffle, mode)
        try:
            sampler = configure_sampler(dataloader, mode)
        except Exception as error:
            raise SamplerHookError(
                f"configure_sampler raised {type(error).__name__} on rank {self.trainer.global_rank} of "
                f"{self.trainer.world_size} for the {mode.value} dataloader: {error}"
            ) from error
        if sampler is None:
            return dataloader
        return _lightning_internals.rebuild_dataloader(dataloader, sampler, mode)


def install_sampler_hook(trainer: "pl.Trainer") -> None:
    """Make ``trainer`` consult ``configure_sampler``; its data connector keeps all its state."""
    _lightning_internals.replace_data_connector_class(trainer, SamplerHookDataConnector)
