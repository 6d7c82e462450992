"""lightning_dist_hooks for the unified ``lightning`` package (``import lightning as L``): change one import::

    from lightning_dist_hooks.lightning import Trainer  # instead of: from lightning import Trainer

``Trainer``, ``LightningModule`` and ``Fabric`` here subclass ``lightning.pytorch.Trainer``,
``lightning.pytorch.LightningModule`` and ``lightning.fabric.Fabric``, and accept that package's modules,
strategies, callbacks and plugins. Importing this module imports ``lightning`` and never ``pytorch_lightning``
or ``lightning_fabric``. Everything else (environments, hooks, errors) is the same object as in
``lightning_dist_hooks`` and is re-exported here for one-import convenience.
"""

from lightning_dist_hooks import (
    DistributedHooksFabricMixin,
    DistributedHooksMixin,
    DistributedHooksTrainerMixin,
    DistributedSetupError,
    FluxEnvironment,
    HydraEnvironment,
    LauncherEnvironment,
    LauncherVariables,
    MixedLightningPackagesError,
    MVAPICH2Environment,
    OpenMPIEnvironment,
    PALSEnvironment,
    SamplerHookError,
    default_setup_distributed_backend,
    detect_cluster_environment,
    lightning_default_sampler,
    register_cluster_environment,
    register_init_method,
)
from lightning_dist_hooks._flavoured import classes_for
from lightning_dist_hooks._lightning_internals import LIGHTNING

_classes = classes_for(LIGHTNING, __name__)
Trainer = _classes.Trainer
LightningModule = _classes.LightningModule
Fabric = _classes.Fabric
SamplerHookDataConnector = _classes.SamplerHookDataConnector

__all__ = [
    "DistributedHooksFabricMixin",
    "DistributedHooksMixin",
    "DistributedHooksTrainerMixin",
    "DistributedSetupError",
    "Fabric",
    "FluxEnvironment",
    "HydraEnvironment",
    "LauncherEnvironment",
    "LauncherVariables",
    "LightningModule",
    "MVAPICH2Environment",
    "MixedLightningPackagesError",
    "OpenMPIEnvironment",
    "PALSEnvironment",
    "SamplerHookError",
    "Trainer",
    "default_setup_distributed_backend",
    "detect_cluster_environment",
    "lightning_default_sampler",
    "register_cluster_environment",
    "register_init_method",
]
