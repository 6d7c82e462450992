"""The drop-in Trainer: ``pytorch_lightning.Trainer`` plus two flags and two LightningModule hooks."""

from __future__ import annotations

import inspect
from typing import Any, Optional

import pytorch_lightning as pl
from lightning_fabric.plugins.environments import ClusterEnvironment
from pytorch_lightning.accelerators import CUDAAccelerator
from pytorch_lightning.utilities.rank_zero import rank_zero_warn

from lightning_dist_hooks.backends import check_mpi_launch
from lightning_dist_hooks.config import ProcessGroupConfig
from lightning_dist_hooks.environments import detect_cluster_environment, lightning_would_choose
from lightning_dist_hooks.sampling import install_sampler_hook
from lightning_dist_hooks.strategy import attach_process_group_config, creates_process_group


class DistributedHooksTrainerMixin:
    """Adds ``torch_dist_backend``, ``torch_dist_init_method`` and the two hooks to a Trainer class.

    Put it in front of any ``pytorch_lightning.Trainer`` subclass you already have::

        class MyTrainer(DistributedHooksTrainerMixin, MyExistingTrainer):
            pass

        trainer = MyTrainer(accelerator="cpu", devices=2, strategy="ddp",
                            torch_dist_backend="gloo", torch_dist_init_method="file:///shared/run42/rdzv")

    Args:
        torch_dist_backend: the ``torch.distributed`` backend (``"gloo"``, ``"nccl"``, ``"mpi"``, ``"ucc"``,
            ``"xccl"`` or a registered name; case-insensitive). None keeps Lightning's choice: nccl on CUDA,
            gloo on CPU, or the strategy's ``process_group_backend``.
        torch_dist_init_method: how ranks meet: ``"env://"``, ``"tcp://HOST:PORT"``, ``"file:///PATH"`` or
            ``"file:///DIR/"`` (one file per launch inside DIR, named from the job identity; ``ValueError`` when
            the launcher gives none). None keeps Lightning's ``env://`` with the address and port of the cluster
            environment.

    Unless ``plugins`` or the strategy already hold a ``ClusterEnvironment``, the environment of the launcher that
    started this process (``lightning_dist_hooks.environments.detection_order()``) is added to ``plugins``.

    Both are checked here, before any process starts; a bad value raises ``ValueError`` naming it and the fix.
    All other arguments are the parent Trainer's, unchanged.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Lightning reads ``PL_TRAINER_*`` defaults for the parameters in the class signature; show it the
        # parent's parameters, not this mixin's ``**kwargs``.
        parent_init = next(base.__init__ for base in cls.__mro__[1:] if issubclass(base, pl.Trainer))
        cls.__signature__ = inspect.signature(parent_init).replace(  # type: ignore[attr-defined]
            parameters=list(inspect.signature(parent_init).parameters.values())[1:]
        )

    def __init__(
        self,
        *args: Any,
        torch_dist_backend: Optional[str] = None,
        torch_dist_init_method: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        config = ProcessGroupConfig.validated(torch_dist_backend, torch_dist_init_method)
        super().__init__(*args, **_with_detected_cluster_environment(kwargs))
        trainer: Any = self
        strategy = trainer.strategy
        if creates_process_group(strategy):
            config = config.resolved(strategy.cluster_environment, num_nodes=strategy.num_nodes)
            attach_process_group_config(strategy, config, uses_cuda=isinstance(trainer.accelerator, CUDAAccelerator))
            check_mpi_launch(config.backend, config.init_method, trainer.num_devices, trainer.num_nodes)
        elif not config.is_default:
            rank_zero_warn(
                f"torch_dist_backend={config.backend!r} and torch_dist_init_method={config.init_method!r} are "
                f"ignored: {type(strategy).__name__} creates no process group. Use a multi-process strategy, "
                "e.g. Trainer(strategy='ddp', devices=2), for them to take effect."
            )
        self._process_group_config = config
        install_sampler_hook(trainer)

    @property
    def torch_dist_backend(self) -> Optional[str]:
        """The validated ``torch_dist_backend`` (lower-cased), or None for Lightning's choice."""
        return self._process_group_config.backend

    @property
    def torch_dist_init_method(self) -> Optional[str]:
        """The validated ``torch_dist_init_method`` (``file:///DIR/`` resolved to this launch's file), or None."""
        return self._process_group_config.init_method


def _with_detected_cluster_environment(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the detected cluster environment added to ``plugins``, unless the user chose one.

    The public route: Lightning takes a ``ClusterEnvironment`` from ``plugins`` before its own detection. Nothing
    is added where Lightning's own detection picks the same class, so Lightning's choice stays bit for bit its own.
    """
    plugins = kwargs.get("plugins")
    plugin_list = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    strategy = kwargs.get("strategy")
    chosen_already = any(isinstance(plugin, ClusterEnvironment) for plugin in plugin_list) or (
        getattr(strategy, "cluster_environment", None) is not None
    )
    detected = None if chosen_already else detect_cluster_environment()
    if detected is None or lightning_would_choose(detected):
        return kwargs
    return {**kwargs, "plugins": [*plugin_list, detected()]}


class Trainer(DistributedHooksTrainerMixin, pl.Trainer):
    """``pytorch_lightning.Trainer`` with ``torch_dist_backend``, ``torch_dist_init_method`` and the hooks.

    Example::

        from lightning_dist_hooks import Trainer

        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp",
                          torch_dist_backend="gloo", torch_dist_init_method="file:///shared/run42/rdzv")
        trainer.fit(model)
    """
