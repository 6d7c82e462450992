"""Letting the flags and ``setup_distributed_backend`` create the process group of any strategy that makes one.

The Trainer (or Fabric) gets its strategy from a string (``"ddp_spawn"``, ``"fsdp"``, ...) or from the user's own
instance, possibly of the user's own subclass. To keep every setting and the instance itself, the Trainer gives that
instance a generated subclass of its own class whose only change is that ``setup_environment`` first creates
the process group our way. Lightning's code that follows then finds the
group initialised and skips its own ``env://`` bootstrap, which it does by design.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed

from lightning_dist_hooks import _lightning_internals
from lightning_dist_hooks.backends import check_backend_fits_devices, register_if_mpi4py
from lightning_dist_hooks.config import ProcessGroupConfig
from lightning_dist_hooks.hooks import default_setup_distributed_backend, user_hook
from lightning_dist_hooks.mpi import note_failure
from lightning_dist_hooks.process_group.create import create_process_group
from lightning_dist_hooks.process_group.exit_grace import hand_the_gil_to_backend_threads_at_exit
from lightning_dist_hooks.process_group.lost_peers import is_collective_timeout, lost_peers_message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StrategySettings:
    """What a hooked strategy carries of ours (in ``_lightning_internals``' one attribute): the flags, checked,
    and Fabric's ``setup_distributed_backend=`` callable."""

    config: ProcessGroupConfig
    setup_distributed_backend: Callable[..., None] | None


def _settings(strategy: object) -> StrategySettings:
    settings = _lightning_internals.ours(strategy)
    assert isinstance(settings, StrategySettings), "attach_process_group_config hooks a strategy before its use"
    return settings


def _setup_hook(strategy: Any) -> Callable[..., None] | None:
    """The user's ``setup_distributed_backend``: Fabric's from its constructor, the Trainer's from the
    LightningModule (Fabric strategies have none); None when there is none."""
    return _settings(strategy).setup_distributed_backend or user_hook(
        getattr(strategy, "lightning_module", None), "setup_distributed_backend"
    )


def _takes_over(strategy: Any) -> bool:
    """Whether the flags or the hook make the process group ours; otherwise everything stays Lightning's."""
    return not _settings(strategy).config.is_default or _setup_hook(strategy) is not None


def _setup_environment(self: Any) -> None:
    """``setup_environment`` of a hooked strategy: our process group first, then the strategy's own setup."""
    register_if_mpi4py(_lightning_internals.requested_process_group_backend(self))
    note_failure(None)  # a new run: an exception an earlier run stopped on was handled
    if self.world_size > 1:
        hand_the_gil_to_backend_threads_at_exit()
    if _takes_over(self) and not torch.distributed.is_initialized():
        _lightning_internals.set_world_ranks(self)
        hook = _setup_hook(self) or default_setup_distributed_backend
        create_process_group(self, _settings(self).config, hook)
    self._unhooked_class.setup_environment(self)


def _on_exception(self: Any, exception: BaseException) -> None:
    """``on_exception`` of a hooked strategy: name the peers lost after a collective timeout; under MPI, make a rank
    exiting after this end the job at once."""
    if _takes_over(self) and self.world_size > 1 and is_collective_timeout(exception):
        message = lost_peers_message(self.global_rank, self.world_size)
        if message is not None:
            log.error(message)
    self._unhooked_class.on_exception(self, exception)
    note_failure(exception)


def _reduce_ex(self: Any, protocol: Any) -> tuple[Callable[[type], Any], tuple[type], Any]:
    # ``ddp_spawn`` pickles the strategy to its children; the generated class has no importable name,
    # so pickle the original class and generate the subclass again on the other side.
    return _new_hooked_strategy, (self._unhooked_class,), self.__getstate__()


_hooked_classes: dict[type, type] = {}


def _hooked_class(strategy_class: type) -> type:
    if strategy_class in _hooked_classes.values():
        return strategy_class
    if strategy_class not in _hooked_classes:
        # The methods go in the class body rather than in a mixin base placed first: CPython refuses
        # ``__class__`` assignment when such a base changes the instance layout flags.
        _hooked_classes[strategy_class] = type(
            strategy_class.__name__,  # logs and messages keep naming the user's strategy
            (strategy_class,),
            {
                "__module__": __name__,
                "_unhooked_class": strategy_class,
                "setup_environment": _setup_environment,
                "on_exception": _on_exception,
                "__reduce_ex__": _reduce_ex,
            },
        )
    return _hooked_classes[strategy_class]


def _new_hooked_strategy(strategy_class: type) -> Any:
    hooked: type[object] = _hooked_class(strategy_class)
    return hooked.__new__(hooked)


def creates_process_group(strategy: object) -> bool:
    """Whether ``strategy`` creates the default process group (DDP, FSDP, ModelParallel, of either side or package)."""
    flavour = _lightning_internals.flavour_of(strategy)
    return flavour is not None and isinstance(strategy, flavour.process_group_strategies(strategy))


def attach_process_group_config(
    strategy: Any,
    config: ProcessGroupConfig,
    uses_cuda: bool,
    setup_distributed_backend: Callable[..., None] | None = None,
) -> None:
    """Check ``config`` against ``strategy`` and make the strategy create its group through the hooks.

    ``setup_distributed_backend`` (Fabric's constructor argument) is used instead of the LightningModule's hook.

    Raises ``ValueError`` when the strategy was given a different ``process_group_backend``, or when the backend
    does not fit the devices. The strategy's other settings are untouched.
    """
    if config.backend is not None:
        requested = _lightning_internals.requested_process_group_backend(strategy)
        if requested is not None and requested.lower() != config.backend:
            raise ValueError(
                f"torch_dist_backend={config.backend!r} conflicts with {type(strategy).__name__}("
                f"process_group_backend={requested!r}). Give the backend in one place only: drop one of them."
            )
        check_backend_fits_devices(config.backend, uses_cuda)
        _lightning_internals.set_process_group_backend(strategy, config.backend)
    strategy.__class__ = _hooked_class(type(strategy))
    _lightning_internals.keep_ours(strategy, StrategySettings(config, setup_distributed_backend))
