"""The drop-in Fabric mixin: Lightning's ``Fabric`` (of either package) with the Trainer's flags and setup hook."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional

from lightning_dist_hooks import _lightning_internals
from lightning_dist_hooks._lightning_internals import check_same_package
from lightning_dist_hooks.config import ProcessGroupConfig
from lightning_dist_hooks.wiring import apply_flags, with_detected_cluster_environment

SetupDistributedBackend = Callable[[str, str, int, int, timedelta], None]


class DistributedHooksFabricMixin:
    """Adds ``torch_dist_backend``, ``torch_dist_init_method`` and ``setup_distributed_backend`` to a Fabric class.

    Fabric has no LightningModule to hold a hook, so the hook is a constructor argument::

        def setup_distributed_backend(backend, init_method, rank, world_size, timeout):
            torch.distributed.init_process_group(backend, init_method=init_method, rank=rank,
                                                 world_size=world_size, timeout=timeout)

        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="gloo",
                        torch_dist_init_method="file:///shared/runs/", setup_distributed_backend=setup_distributed_backend)
        fabric.launch()

    Args:
        torch_dist_backend: as the Trainer's.
        torch_dist_init_method: as the Trainer's.
        setup_distributed_backend: called on every rank, with the signature and contract of the LightningModule hook
            of that name, to create the default process group; None calls ``init_process_group`` once. With
            ``strategy="ddp_spawn"`` it must be picklable (a module-level function).

    Samplers: Fabric already lets you choose. ``fabric.setup_dataloaders(loader, use_distributed_sampler=False)``
    keeps the loader's own sampler, so give it your distributed sampler (built with ``fabric.global_rank`` and
    ``fabric.world_size`` after ``fabric.launch()``); with the default ``True``, Fabric injects a
    ``DistributedSampler`` as Lightning's Trainer does.
    """

    def __init__(
        self,
        *args: Any,
        torch_dist_backend: Optional[str] = None,
        torch_dist_init_method: Optional[str] = None,
        setup_distributed_backend: Optional[SetupDistributedBackend] = None,
        **kwargs: Any,
    ) -> None:
        config = ProcessGroupConfig.validated(torch_dist_backend, torch_dist_init_method)
        if setup_distributed_backend is not None and not callable(setup_distributed_backend):
            raise TypeError(
                f"setup_distributed_backend={setup_distributed_backend!r} is not callable. Pass a function "
                "(backend, init_method, rank, world_size, timeout) that creates the default process group, or None."
            )
        flavour = _lightning_internals.flavour_of(type(self))
        if flavour is None:
            raise TypeError(
                f"{type(self).__name__} mixes in DistributedHooksFabricMixin but is no Lightning Fabric: put the mixin "
                "in front of a lightning_fabric.Fabric or lightning.fabric.Fabric subclass."
            )
        check_same_package(self, kwargs)
        super().__init__(*args, **with_detected_cluster_environment(kwargs, flavour))
        strategy = self.strategy  # type: ignore[attr-defined]
        self._process_group_config = apply_flags(self, strategy, config, flavour, setup_distributed_backend)

    @property
    def torch_dist_backend(self) -> Optional[str]:
        """The validated ``torch_dist_backend`` (lower-cased), or None for Lightning's choice."""
        return self._process_group_config.backend

    @property
    def torch_dist_init_method(self) -> Optional[str]:
        """The validated ``torch_dist_init_method`` (``file:///DIR/`` resolved to this launch's file), or None."""
        return self._process_group_config.init_method
