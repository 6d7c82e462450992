"""Distributed hooks for PyTorch Lightning: choose the backend, the rendezvous and the sampler.

Change one import::

    from lightning_dist_hooks import Trainer            # pytorch_lightning
    from lightning_dist_hooks.lightning import Trainer  # the unified lightning package (import lightning as L)

and everything behaves as Lightning's ``Trainer`` until you use the new flags (``torch_dist_backend``,
``torch_dist_init_method``) or override the LightningModule hooks ``setup_distributed_backend`` and
``configure_sampler``. ``Fabric`` takes the same flags and a ``setup_distributed_backend`` callable.

Importing this package imports no Lightning package: ``Trainer``, ``LightningModule`` and ``Fabric`` here are
``pytorch_lightning``'s and import it on first use; ``lightning_dist_hooks.lightning`` has ``lightning``'s.
"""

from typing import Any

from lightning_dist_hooks._lightning_internals import MixedLightningPackagesError
from lightning_dist_hooks.environments import (
    FluxEnvironment,
    HydraEnvironment,
    LauncherEnvironment,
    MVAPICH2Environment,
    OpenMPIEnvironment,
    PALSEnvironment,
    detect_cluster_environment,
    register_cluster_environment,
    register_launcher,
)
from lightning_dist_hooks.fabric import DistributedHooksFabricMixin
from lightning_dist_hooks.hooks import (
    DistributedHooksMixin,
    default_setup_distributed_backend,
    lightning_default_sampler,
)
from lightning_dist_hooks.init_methods import (
    InitMethod,
    Rendezvous,
    RendezvousDiagnostics,
    launch_identity,
    register_init_method,
)
from lightning_dist_hooks.launcher_variables import LauncherVariables
from lightning_dist_hooks.process_group.create import DistributedSetupError
from lightning_dist_hooks.sampling import SamplerHookError
from lightning_dist_hooks.trainer import DistributedHooksTrainerMixin
from lightning_dist_hooks.transports import CreatedGroup, Transport, register_transport

__version__ = "0.1.0"

# The classes each Lightning package has its own of: here pytorch_lightning's, made (and pytorch_lightning
# imported) on first access; lightning_dist_hooks.lightning has lightning's.
PER_PACKAGE_CLASSES = ("Fabric", "LightningModule", "Trainer")


def __getattr__(name: str) -> Any:
    if name in PER_PACKAGE_CLASSES:
        from lightning_dist_hooks import _pytorch_lightning

        return getattr(_pytorch_lightning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CreatedGroup",
    "DistributedHooksFabricMixin",
    "DistributedHooksMixin",
    "DistributedHooksTrainerMixin",
    "DistributedSetupError",
    "Fabric",
    "FluxEnvironment",
    "HydraEnvironment",
    "InitMethod",
    "LauncherEnvironment",
    "LauncherVariables",
    "LightningModule",
    "MVAPICH2Environment",
    "MixedLightningPackagesError",
    "OpenMPIEnvironment",
    "PALSEnvironment",
    "Rendezvous",
    "RendezvousDiagnostics",
    "SamplerHookError",
    "Trainer",
    "Transport",
    "default_setup_distributed_backend",
    "detect_cluster_environment",
    "launch_identity",
    "lightning_default_sampler",
    "register_cluster_environment",
    "register_init_method",
    "register_launcher",
    "register_transport",
]
