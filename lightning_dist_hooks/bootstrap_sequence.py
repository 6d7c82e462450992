"""The one sequence by which ``Trainer(...)`` and ``Fabric(...)`` take the flags, around Lightning's ``__init__``.

Both mixins call :func:`start_with_flags`; only what is theirs stays in them (the Trainer's sampler hook, Fabric's
``setup_distributed_backend=`` callable passed through here into the plan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_dist_hooks import _lightning_internals
from lightning_dist_hooks._lightning_internals import Flavour, check_same_package
from lightning_dist_hooks.bootstrap_plan import BootstrapPlan, Flags, devices_left_at_auto
from lightning_dist_hooks.environment_plugin import with_detected_cluster_environment
from lightning_dist_hooks.hooks import check_setup_callable, expected_parameters
from lightning_dist_hooks.strategy import hook_strategy


def mixed_flavour(cls: type, mixin: type, lightning_classes: str) -> Flavour:
    """The Lightning package of ``cls``, which puts ``mixin`` in front of one of ``lightning_classes`` (as the
    message names them); ``TypeError`` where ``cls`` is no subclass of a Lightning class."""
    flavour = _lightning_internals.flavour_of(cls)
    if flavour is None:
        kind = lightning_classes.rpartition(".")[2]
        raise TypeError(
            f"{cls.__name__} mixes in {mixin.__name__} but is no Lightning {kind}: put the mixin in front of a "
            f"{lightning_classes} subclass."
        )
    return flavour


def start_with_flags(
    owner: Any,
    mixin: type,
    lightning_classes: str,
    lightning_init: Callable[..., None],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    torch_dist_backend: str | None,
    torch_dist_init_method: str | None,
    setup_distributed_backend: Callable[..., None] | None = None,
) -> None:
    """Run Lightning's ``__init__`` on ``owner`` (a Trainer or a Fabric) with the flags taken:

    1. check both flags (and Fabric's callable), before Lightning's ``__init__`` so that a bad value costs nothing;
    2. find ``owner``'s Lightning package, and 3. check that every object passed is of that package;
    4. run Lightning's ``__init__``, with the launcher's cluster environment added to ``plugins`` where needed;
    5. fit the flags to the strategy Lightning built (:meth:`BootstrapPlan.for_strategy`);
    6. hook that strategy where it creates a process group, and keep the plan on ``owner``.
    """
    flags = Flags.checked(torch_dist_backend, torch_dist_init_method)
    if setup_distributed_backend is not None:
        if not callable(setup_distributed_backend):
            raise TypeError(
                f"setup_distributed_backend={setup_distributed_backend!r} is not callable. Pass a function "
                f"({expected_parameters('setup_distributed_backend')}) that creates the default process group, or "
                "None."
            )
        check_setup_callable(setup_distributed_backend, f"{type(owner).__name__}(...)")
    flavour = mixed_flavour(type(owner), mixin, lightning_classes)
    check_same_package(owner, kwargs)
    lightning_init(*args, **with_detected_cluster_environment(kwargs, flavour))
    plan = BootstrapPlan.for_strategy(
        flags,
        owner.strategy,
        flavour,
        owner=type(owner).__name__,
        setup_distributed_backend=setup_distributed_backend,
        devices_left_at_auto=devices_left_at_auto(kwargs),
    )
    if plan.creates_process_group:
        hook_strategy(owner.strategy, plan)
    owner._bootstrap_plan = plan
