"""Every use of a private Lightning name lives here, and nowhere else.

Lightning offers no public extension point for two things this package changes: which sampler a
dataloader gets (``_DataConnector._prepare_dataloader``) and the process-group settings a strategy keeps
(``_process_group_backend``, ``_timeout``). Keeping the private names in one module means a Lightning
upgrade breaks exactly one file, and ``TESTED_LIGHTNING`` says which releases this file was checked against.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Optional

from pytorch_lightning.strategies import Strategy
from pytorch_lightning.trainer.connectors.data_connector import _DataConnector
from pytorch_lightning.trainer.states import RunningStage
from pytorch_lightning.utilities.data import _is_dataloader_shuffled, _update_dataloader
from torch.utils.data import DataLoader, Sampler

if TYPE_CHECKING:
    import pytorch_lightning as pl

# The Lightning releases whose private names below were read and tested.
TESTED_LIGHTNING = (">=2.6.6", "<2.7")


def requested_process_group_backend(strategy: Strategy) -> Optional[str]:
    """The backend the user gave the strategy (``DDPStrategy(process_group_backend=...)``), or None."""
    return getattr(strategy, "_process_group_backend", None)


def set_process_group_backend(strategy: Strategy, backend: str) -> None:
    """Equivalent to having passed ``process_group_backend=backend`` to the strategy's constructor."""
    strategy._process_group_backend = backend  # type: ignore[attr-defined]


def resolved_process_group_backend(strategy: Strategy) -> str:
    """The backend the strategy would hand to ``init_process_group`` (its choice for the root device)."""
    return strategy._get_process_group_backend()  # type: ignore[attr-defined]


def process_group_timeout(strategy: Strategy) -> timedelta:
    """The strategy's ``timeout=`` (Lightning's default is torch's default process-group timeout)."""
    return strategy._timeout  # type: ignore[attr-defined]


def lightning_sampler_choice(trainer: "pl.Trainer", dataloader: DataLoader, stage: RunningStage) -> Optional[Sampler]:
    """The sampler Lightning itself would give ``dataloader``, or None where it leaves the loader as it is.

    Mirrors ``_DataConnector._prepare_dataloader`` and ``_process_dataloader`` (which decides ``shuffle``), so
    that the default ``configure_sampler`` is exactly today's behaviour: ``use_distributed_sampler``, the
    predict-time wrapper and the wrapper around custom samplers included.
    """
    connector = trainer._data_connector
    if not (connector._requires_distributed_sampler(dataloader) or stage == RunningStage.PREDICTING):
        return None
    shuffle = True if stage == RunningStage.TRAINING else _is_dataloader_shuffled(dataloader)
    return connector._resolve_sampler(dataloader, shuffle=shuffle, mode=stage)


def rebuild_dataloader(dataloader: DataLoader, sampler: Sampler, stage: RunningStage) -> DataLoader:
    """Lightning's own re-instantiation: batch size, workers, collate and subclass arguments are kept."""
    return _update_dataloader(dataloader, sampler, mode=stage)


# Subclassed by ``lightning_dist_hooks.sampling``: ``_prepare_dataloader`` is the one place every train, validation,
# sanity-check, test and predict loader passes through after the process group exists, and it has no public hook.
LightningDataConnector = _DataConnector


def replace_data_connector_class(trainer: "pl.Trainer", connector_class: type) -> None:
    """Give the trainer's data connector a subclass of ``LightningDataConnector``, keeping its state."""
    connector: Any = trainer._data_connector
    connector.__class__ = connector_class
