"""Letting the flags and ``setup_distributed_backend`` create the process group of any strategy that makes one.

The Trainer (or Fabric) gets its strategy from a string (``"ddp_spawn"``, ``"fsdp"``, ...) or from the user's own
instance, possibly of the user's own subclass. To keep every setting and the instance itself, the Trainer gives that
instance a generated subclass of its own class whose only change is that ``setup_environment`` first creates
the process group as the bootstrap plan says (:mod:`lightning_dist_hooks.bootstrap_plan`, decided in ``Trainer(...)``).
Lightning's code that follows then finds the group initialised and skips its own ``env://`` bootstrap, which it does by
design. A plain subclass cannot do this: the instance may be of any class, the user's own included, and must stay that
instance with every setting.

The glue knows no transport: the backend is registered with torch, and the start of a run and a failure are
announced, through the registry of transports (:mod:`lightning_dist_hooks.transports`), whichever are registered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch.distributed

from lightning_dist_hooks import _lightning_internals, transports
from lightning_dist_hooks.bootstrap_plan import BootstrapPlan
from lightning_dist_hooks.hooks import default_setup_distributed_backend, user_hook
from lightning_dist_hooks.process_group.create import create_process_group
from lightning_dist_hooks.process_group.exit_grace import hand_the_gil_to_backend_threads_at_exit
from lightning_dist_hooks.process_group.lost_peers import is_collective_timeout, lost_peers_message

log = logging.getLogger(__name__)


def _plan(strategy: object) -> BootstrapPlan:
    plan = _lightning_internals.ours(strategy)
    assert isinstance(plan, BootstrapPlan), "hook_strategy hooks a strategy before its use"
    return plan


def _module_hook(strategy: Any) -> Callable[..., None] | None:
    """The LightningModule's ``setup_distributed_backend`` override, or None (Fabric strategies have no module)."""
    return user_hook(getattr(strategy, "lightning_module", None), "setup_distributed_backend")


def _setup_environment(self: Any) -> None:
    """``setup_environment`` of a hooked strategy: our process group first, then the strategy's own setup."""
    plan = _plan(self)
    # A ddp_spawn child, or a strategy given process_group_backend=... directly, registered nothing yet.
    transports.register_backend_with_torch(plan.process_group_backend)
    transports.announce_run_started()
    if self.world_size > 1:
        hand_the_gil_to_backend_threads_at_exit()
    module_hook = _module_hook(self)
    if plan.takes_over(module_hook) and not torch.distributed.is_initialized():
        _lightning_internals.set_world_ranks(self)
        hook = plan.setup_distributed_backend or module_hook or default_setup_distributed_backend
        create_process_group(self, plan, hook)
    self._unhooked_class.setup_environment(self)


def _on_exception(self: Any, exception: BaseException) -> None:
    """``on_exception`` of a hooked strategy: name the peers lost after a collective timeout, then tell the
    transports that this rank failed (:meth:`Transport.run_failed`)."""
    if _plan(self).takes_over(_module_hook(self)) and self.world_size > 1 and is_collective_timeout(exception):
        message = lost_peers_message(self.global_rank, self.world_size)
        if message is not None:
            log.error(message)
    self._unhooked_class.on_exception(self, exception)
    transports.announce_failure(exception)


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


def hook_strategy(strategy: Any, plan: BootstrapPlan) -> None:
    """Make ``strategy`` create its process group as ``plan`` says, through the hooks; its other settings stay.

    The backend becomes the strategy's ``process_group_backend`` too, so that Lightning's own code that reads it (its
    logs, a group it makes itself) agrees with ours.
    """
    if plan.backend is not None:
        _lightning_internals.set_process_group_backend(strategy, plan.backend)
    strategy.__class__ = _hooked_class(type(strategy))
    _lightning_internals.keep_ours(strategy, plan)
