"""The drop-in Fabric mixin: Lightning's ``Fabric`` (of either package) with the Trainer's flags and setup hook."""

from __future__ import annotations

from typing import Any, Callable, Optional  # noqa: UP035 - see above

# typing's Callable and Optional, not collections.abc's and `X | None`: they are runtime annotations in the generated
# signature, next to Lightning's own (typing's), for help() and LightningCLI.
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.bootstrap_plan import BootstrapPlan
from lightning_dist_hooks.bootstrap_sequence import start_with_flags
from lightning_dist_hooks.flag_docs import FLAG_DOCS, FLAG_PARAMETERS
from lightning_dist_hooks.signatures import (
    keyword_parameter,
    set_signature,
    with_documented_arguments,
    with_keyword_parameters,
)

# Called with hooks.default_setup_distributed_backend's parameters (device_id where it takes it), checked at
# construction; the annotation help() and LightningCLI show stays a plain Callable, like Lightning's own.
SetupDistributedBackend = Callable[..., None]
# The classes the mixin goes in front of, as the error for a class with none of them names them.
_LIGHTNING_FABRICS = "lightning_fabric.Fabric or lightning.fabric.Fabric"

# Our parameters, as they appear in the Fabric's signature and ``help()``.
FABRIC_PARAMETER_DOCS = {
    **FLAG_DOCS,
    "setup_distributed_backend": (
        "called on every rank, with the signature and contract of the LightningModule hook of that name, to create "
        'the default process group; None calls ``init_process_group`` once. With ``strategy="ddp_spawn"`` it must '
        "be picklable (a module-level function)."
    ),
}


class DistributedHooksFabricMixin:
    """Adds ``torch_dist_backend``, ``torch_dist_init_method`` and ``setup_distributed_backend`` to a Fabric class.

    Fabric has no LightningModule to hold a hook, so the hook is a constructor argument::

        def setup_distributed_backend(backend, init_method, rank, world_size, timeout, device_id=None):
            torch.distributed.init_process_group(backend, init_method=init_method, rank=rank,
                                                 world_size=world_size, timeout=timeout, device_id=device_id)

        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="gloo",
                        torch_dist_init_method="file:///shared/runs/",
                        setup_distributed_backend=setup_distributed_backend)
        fabric.launch()

    Args:
        torch_dist_backend: as the Trainer's.
        torch_dist_init_method: as the Trainer's.
        setup_distributed_backend: see ``FABRIC_PARAMETER_DOCS``.

    Samplers: Fabric already lets you choose. ``fabric.setup_dataloaders(loader, use_distributed_sampler=False)``
    keeps the loader's own sampler, so give it your distributed sampler (built with ``fabric.global_rank`` and
    ``fabric.world_size`` after ``fabric.launch()``); with the default ``True``, Fabric injects a
    ``DistributedSampler`` as Lightning's Trainer does.

    A class with this mixin in front of a Fabric gets an ``__init__`` whose signature and docstring are the parent's
    plus ours.
    """

    _bootstrap_plan: BootstrapPlan  # set by start_with_flags

    @override
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if DistributedHooksFabricMixin in cls.__bases__ and "__init__" not in cls.__dict__:
            cls.__init__ = _init_with_full_signature(cls)  # type: ignore[method-assign]  # generated on purpose

    def __init__(
        self,
        *args: Any,
        torch_dist_backend: str | None = None,
        torch_dist_init_method: str | None = None,
        setup_distributed_backend: SetupDistributedBackend | None = None,
        **kwargs: Any,
    ) -> None:
        start_with_flags(
            self,
            DistributedHooksFabricMixin,
            _LIGHTNING_FABRICS,
            super().__init__,
            args,
            kwargs,
            torch_dist_backend,
            torch_dist_init_method,
            setup_distributed_backend,
        )

    @property
    def torch_dist_backend(self) -> str | None:
        """The validated ``torch_dist_backend`` (lower-cased), or None for Lightning's choice."""
        return self._bootstrap_plan.backend

    @property
    def torch_dist_init_method(self) -> str | None:
        """The validated ``torch_dist_init_method`` where the ranks really meet, or None: ``file:///DIR/`` resolved
        to this launch's file, and a file inside this user's private directory ``DIR/ldh-uid-<UID>/``."""
        return self._bootstrap_plan.location


def _init_with_full_signature(cls: type) -> Callable[..., None]:
    """An ``__init__`` for ``cls``: the mixin's, with the parent Fabric's signature and docstring plus ours.

    Lightning documents Fabric's arguments on the class, not on ``__init__``: that is the docstring extended.
    """
    parent = cls.__mro__[cls.__mro__.index(DistributedHooksFabricMixin) + 1]
    parent_init = parent.__init__  # type: ignore[misc]  # the parent's, on purpose

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - becomes cls.__init__
        DistributedHooksFabricMixin.__init__(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    signature = with_keyword_parameters(
        parent_init,
        {
            **FLAG_PARAMETERS,
            "setup_distributed_backend": keyword_parameter(
                "setup_distributed_backend",
                Optional[SetupDistributedBackend],  # noqa: UP045 - see the import
            ),
        },
    )
    set_signature(__init__, signature)
    __init__.__doc__ = with_documented_arguments(parent_init.__doc__ or parent.__doc__ or "", FABRIC_PARAMETER_DOCS)
    return __init__
