"""Distributed hooks for PyTorch Lightning: choose the backend, the rendezvous and the sampler.

Change one import::

    from lightning_dist_hooks import Trainer

and everything behaves as ``pytorch_lightning.Trainer`` until you use the new flags
(``torch_dist_backend``, ``torch_dist_init_method``) or override the LightningModule hooks
``setup_distributed_backend`` and ``configure_sampler``.
"""

import warnings

from lightning_dist_hooks.environments import (
    FluxEnvironment,
    HydraEnvironment,
    LauncherEnvironment,
    MVAPICH2Environment,
    OpenMPIEnvironment,
    PALSEnvironment,
    detect_cluster_environment,
    register_cluster_environment,
)
from lightning_dist_hooks.hooks import (
    DistributedHooksMixin,
    LightningModule,
    default_setup_distributed_backend,
    lightning_default_sampler,
)
from lightning_dist_hooks.init_methods import InitMethod, Rendezvous, register_init_method
from lightning_dist_hooks.launcher_variables import LauncherVariables
from lightning_dist_hooks.launches import launch_identity
from lightning_dist_hooks.process_group import DistributedSetupError
from lightning_dist_hooks.sampling import SamplerHookError
from lightning_dist_hooks.trainer import DistributedHooksTrainerMixin, Trainer

__version__ = "0.1.0"


__all__ = [
    "DistributedHooksMixin",
    "DistributedHooksTrainerMixin",
    "DistributedSetupError",
    "FluxEnvironment",
    "HydraEnvironment",
    "InitMethod",
    "LauncherEnvironment",
    "LauncherVariables",
    "LightningModule",
    "MVAPICH2Environment",
    "OpenMPIEnvironment",
    "PALSEnvironment",
    "Rendezvous",
    "SamplerHookError",
    "Trainer",
    "default_setup_distributed_backend",
    "detect_cluster_environment",
    "launch_identity",
    "lightning_default_sampler",
    "register_cluster_environment",
    "register_init_method",
]


def __getattr__(name: str) -> object:
    if name == "SchedulerEnvironment":  # deprecated: it also covers MPI launchers, which are not schedulers
        warnings.warn("lightning_dist_hooks.SchedulerEnvironment is deprecated; use LauncherEnvironment.",
                      DeprecationWarning, stacklevel=2)
        return LauncherEnvironment
    if name == "job_identity":  # deprecated: it was also the name of its module
        warnings.warn("lightning_dist_hooks.job_identity is deprecated; use lightning_dist_hooks.launch_identity",
                      DeprecationWarning, stacklevel=2)
        return launch_identity
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
