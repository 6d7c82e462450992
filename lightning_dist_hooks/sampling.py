"""Routes every dataloader the Trainer prepares through ``configure_sampler``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch.utils.data import DataLoader, Sampler

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
    check_sampler(sampler, configure_sampler, Stage(mode))
    return _lightning_internals.rebuild_dataloader(dataloader, sampler, mode)


def check_sampler(sampler: object, hook: Any, stage: Stage) -> None:
    """Raise ``TypeError`` unless ``sampler`` is what a ``DataLoader`` takes as one: a ``Sampler``, or an iterable of
    indices (a list, a range, a generator); not a string, a mapping, a number or a ``DataLoader``, which would fail
    deep inside torch (``new(): invalid data type 'str'``), naming neither the hook nor what it must return.

    >>> from enum import Enum
    >>> train = Stage(Enum("RunningStage", {"TRAINING": "train"}).TRAINING)
    >>> check_sampler([2, 0, 1], None, train)
    >>> check_sampler("random", None, train)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: configure_sampler returned 'random' (str) for the train dataloader; it must return a ...
    """
    if isinstance(sampler, Sampler) or (
        isinstance(sampler, Iterable) and not isinstance(sampler, (str, bytes, Mapping, DataLoader))
    ):
        return
    owner = getattr(hook, "__self__", None)
    of = f" of {type(owner).__name__}" if owner is not None else ""
    shown = repr(sampler)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise TypeError(
        f"configure_sampler{of} returned {shown} ({type(sampler).__name__}) for the {stage} dataloader; it must "
        "return a torch.utils.data.Sampler, an iterable of indices, or None (the dataloader as given)"
    )


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
