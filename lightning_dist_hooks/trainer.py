"""The drop-in Trainer: ``pytorch_lightning.Trainer`` plus two flags and two LightningModule hooks."""

from __future__ import annotations

import inspect
from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.accelerators import CUDAAccelerator
from pytorch_lightning.utilities.rank_zero import rank_zero_warn

from lightning_dist_hooks.config import ProcessGroupConfig
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
        torch_dist_init_method: how ranks meet: ``"env://"``, ``"tcp://HOST:PORT"`` or ``"file:///PATH"``.
            None keeps Lightning's ``env://`` with the address and port of the cluster environment.

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
        super().__init__(*args, **kwargs)
        trainer: Any = self
        strategy = trainer.strategy
        if creates_process_group(strategy):
            attach_process_group_config(strategy, config, uses_cuda=isinstance(trainer.accelerator, CUDAAccelerator))
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
        """The validated ``torch_dist_init_method``, or None for Lightning's ``env://``."""
        return self._process_group_config.init_method


class Trainer(DistributedHooksTrainerMixin, pl.Trainer):
    """``pytorch_lightning.Trainer`` with ``torch_dist_backend``, ``torch_dist_init_method`` and the hooks.

    Example::

        from lightning_dist_hooks import Trainer

        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp",
                          torch_dist_backend="gloo", torch_dist_init_method="file:///shared/run42/rdzv")
        trainer.fit(model)
    """
