"""The drop-in Trainer mixin: a Lightning ``Trainer`` (of either package) plus two flags and two module hooks."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks._lightning_internals import check_same_package
from lightning_dist_hooks.bootstrap_plan import BootstrapPlan, creates_process_group
from lightning_dist_hooks.bootstrap_sequence import mixed_flavour, start_with_flags
from lightning_dist_hooks.flag_docs import FLAG_DOCS, FLAG_PARAMETERS
from lightning_dist_hooks.hooks import check_hooks
from lightning_dist_hooks.sampling import install_sampler_hook
from lightning_dist_hooks.signatures import (
    presented_as,
    set_signature,
    with_documented_arguments,
    with_keyword_parameters,
)


class DistributedHooksTrainerMixin:
    """Adds ``torch_dist_backend``, ``torch_dist_init_method`` and the two hooks to a Trainer class.

    Put it in front of any Trainer subclass you already have, of ``pytorch_lightning`` or of ``lightning``::

        class MyTrainer(DistributedHooksTrainerMixin, MyExistingTrainer):
            pass

        trainer = MyTrainer(accelerator="cpu", devices=2, strategy="ddp",
                            torch_dist_backend="gloo", torch_dist_init_method="file:///shared/run42/rdzv")

    Args:
        torch_dist_backend: see ``FLAG_DOCS``.
        torch_dist_init_method: see ``FLAG_DOCS``.

    Unless ``plugins`` or the strategy already hold a ``ClusterEnvironment``, the environment of the launcher that
    started this process (``lightning_dist_hooks.environments.detection_order()``) is added to ``plugins``.

    Both are checked here, before any process starts; a bad value raises ``ValueError`` naming it and the fix.
    ``fit``, ``validate``, ``test`` and ``predict`` check the signatures of the module's and the datamodule's hooks
    before Lightning starts any process; one that cannot take the documented arguments raises ``TypeError``.
    All other arguments are the parent Trainer's, unchanged. The class gets an ``__init__`` whose signature is the
    parent's plus ours, so that ``inspect.signature``, ``PL_TRAINER_*`` defaults and ``LightningCLI`` see both, and
    ``fit``, ``validate``, ``test`` and ``predict`` with the parent's signatures and docstrings.
    """

    _bootstrap_plan: BootstrapPlan  # set by start_with_flags

    @override
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if DistributedHooksTrainerMixin not in cls.__bases__:
            return
        if "__init__" not in cls.__dict__:
            cls.__init__ = _init_with_full_signature(cls)  # type: ignore[method-assign]  # generated on purpose
        parent = super()
        for name in _RUN_METHODS:
            if name not in cls.__dict__:
                implementation = getattr(DistributedHooksTrainerMixin, name)
                setattr(cls, name, presented_as(getattr(parent, name), implementation, cls))

    def __init__(
        self,
        *args: Any,
        torch_dist_backend: str | None = None,
        torch_dist_init_method: str | None = None,
        **kwargs: Any,
    ) -> None:
        _initialize(self, super().__init__, args, kwargs, torch_dist_backend, torch_dist_init_method)

    @property
    def torch_dist_backend(self) -> str | None:
        """The validated ``torch_dist_backend`` (lower-cased), or None for Lightning's choice."""
        return self._bootstrap_plan.backend

    @property
    def torch_dist_init_method(self) -> str | None:
        """The validated ``torch_dist_init_method`` where the ranks really meet, or None: ``file:///DIR/`` resolved
        to this launch's file, and a file inside this user's private directory ``DIR/ldh-uid-<UID>/``."""
        return self._bootstrap_plan.location

    def fit(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        check_same_package(self, {"model": model, **kwargs})
        _check_hooks(self, "fit", model, args, kwargs)
        return super().fit(model, *args, **kwargs)  # type: ignore[misc]  # the Trainer's, after the mixin

    def validate(self, model: Any = None, *args: Any, **kwargs: Any) -> Any:
        check_same_package(self, {"model": model, **kwargs})
        _check_hooks(self, "validate", model, args, kwargs)
        return super().validate(model, *args, **kwargs)  # type: ignore[misc]  # the Trainer's, after the mixin

    def test(self, model: Any = None, *args: Any, **kwargs: Any) -> Any:
        check_same_package(self, {"model": model, **kwargs})
        _check_hooks(self, "test", model, args, kwargs)
        return super().test(model, *args, **kwargs)  # type: ignore[misc]  # the Trainer's, after the mixin

    def predict(self, model: Any = None, *args: Any, **kwargs: Any) -> Any:
        check_same_package(self, {"model": model, **kwargs})
        _check_hooks(self, "predict", model, args, kwargs)
        return super().predict(model, *args, **kwargs)  # type: ignore[misc]  # the Trainer's, after the mixin


_RUN_METHODS = ("fit", "validate", "test", "predict")


def _check_hooks(trainer: Any, method: str, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Check the hooks' signatures of the module (the trainer's own where ``model`` is None, as Lightning then uses
    it) and of a datamodule among the other arguments, here in the launching process, before Lightning's launcher
    starts any: a wrong signature is then one ``TypeError`` here, not one traceback per rank."""
    module = model if model is not None else trainer.lightning_module
    where = f"{type(trainer).__name__}.{method}()"
    check_hooks(module, [*args, *kwargs.values()], where, creates_process_group(trainer.strategy))


# The classes the mixin goes in front of, as the error for a class with none of them names them.
_LIGHTNING_TRAINERS = "pytorch_lightning.Trainer or lightning.pytorch.Trainer"


def _initialize(
    trainer: Any,
    lightning_init: Callable[..., None],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    torch_dist_backend: str | None,
    torch_dist_init_method: str | None,
) -> None:
    start_with_flags(
        trainer,
        DistributedHooksTrainerMixin,
        _LIGHTNING_TRAINERS,
        lightning_init,
        args,
        kwargs,
        torch_dist_backend,
        torch_dist_init_method,
    )
    install_sampler_hook(trainer)


def _init_with_full_signature(cls: type[DistributedHooksTrainerMixin]) -> Callable[..., None]:
    """An ``__init__`` for ``cls`` whose signature and docstring are the parent Trainer's plus our two flags.

    ``LightningCLI`` (jsonargparse) builds ``--trainer.*`` from the ``__init__`` it finds; it cannot follow
    ``**kwargs`` through the mixin. Lightning's ``PL_<CLASS>_*`` defaults wrap this ``__init__`` as they wrap
    Lightning's, for all parameters ours included; the parent's own wrapper is then skipped, since it would add
    our parameters, read again from the environment, to a call that does not take them.

    Where a Trainer subclass of the user's sits between the mixin and Lightning's Trainer, its ``__init__`` calls
    Lightning's wrapper itself, which cannot be skipped: the class then keeps its parent's signature (our flags
    stay keyword arguments), so that no ``PL_<CLASS>_TORCH_DIST_*`` reaches a Lightning ``__init__``.
    """
    flavour = mixed_flavour(cls, DistributedHooksTrainerMixin, _LIGHTNING_TRAINERS)
    parent_init = super(DistributedHooksTrainerMixin, cls).__init__
    parent_is_lightnings = parent_init is flavour.Trainer.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - becomes cls.__init__
        backend, init_method = kwargs.pop("torch_dist_backend", None), kwargs.pop("torch_dist_init_method", None)
        lightning_init = flavour.without_env_defaults(super(DistributedHooksTrainerMixin, type(self)).__init__)
        _initialize(self, lightning_init.__get__(self), args, kwargs, backend, init_method)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    if not parent_is_lightnings:
        set_signature(__init__, inspect.signature(parent_init))
        __init__.__doc__ = parent_init.__doc__
        return __init__
    set_signature(__init__, with_keyword_parameters(parent_init, FLAG_PARAMETERS))
    __init__.__doc__ = with_documented_arguments(parent_init.__doc__ or "", FLAG_DOCS)
    return flavour.with_env_defaults(__init__)
