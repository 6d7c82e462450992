"""Every Lightning name this package uses, public or private, for both Lightning packages, and nowhere else.

Lightning ships the same code under two names (its "flavours"): ``pytorch_lightning`` + ``lightning_fabric``
(pip ``pytorch-lightning``) and ``lightning.pytorch`` + ``lightning.fabric`` (pip ``lightning``). Their objects do
not mix: a ``lightning.pytorch.Trainer`` rejects a ``pytorch_lightning.LightningModule``. So the rest of this
package never imports Lightning: it asks a :class:`Flavour` for a name, and a flavour imports its package only
when first asked. Importing ``lightning_dist_hooks`` therefore imports neither package, and
``lightning_dist_hooks.lightning`` imports only ``lightning``.

Lightning offers no public extension point for three things this package changes: which sampler a dataloader gets
(``_DataConnector._prepare_dataloader``), the process-group settings a strategy keeps (``_process_group_backend``,
``_timeout``) and the env-var defaults wrapper of ``Trainer.__init__``. :data:`PRIVATE_NAMES` lists every private
name used here (``tests/test_packages.py`` checks that each exists in both packages and that no other module names
one); what this package keeps on a Lightning object goes under one attribute (:func:`keep_ours`). A Lightning
upgrade breaks this one file; ``supported_versions.SUPPORTED`` says which releases it was checked against, and
:meth:`Flavour.check_version` says what to do when the installed one is outside that range.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Sampler

from lightning_dist_hooks.supported_versions import installed_version, warn_if_untested

if TYPE_CHECKING:
    # Type hints only, never imported at run time; the same classes exist in lightning.pytorch/lightning.fabric.
    import lightning_fabric
    import lightning_fabric.plugins.environments
    import pytorch_lightning
    from lightning_fabric.plugins.environments import ClusterEnvironment
    from pytorch_lightning import Trainer
    from pytorch_lightning.trainer.connectors.data_connector import _DataConnector
    from pytorch_lightning.trainer.states import RunningStage

    __all__ = ["ClusterEnvironment", "RunningStage", "Trainer"]


# Every private Lightning name used below, by where it lives (the ``pytorch_lightning``/``lightning_fabric`` spelling;
# ``lightning.pytorch``/``lightning.fabric`` have the same), with why no public name serves.
PRIVATE_NAMES: dict[str, str] = {
    "pytorch_lightning.trainer.connectors.data_connector._DataConnector._prepare_dataloader": (
        "the one place every loader passes through once the process group exists: configure_sampler's seat"
    ),
    "pytorch_lightning.trainer.connectors.data_connector._DataConnector._requires_distributed_sampler": (
        "Lightning's own sampler choice, for the default configure_sampler"
    ),
    "pytorch_lightning.trainer.connectors.data_connector._DataConnector._resolve_sampler": (
        "Lightning's own sampler choice, for the default configure_sampler"
    ),
    "pytorch_lightning.Trainer._data_connector": "the connector whose class gains configure_sampler (an attribute)",
    "pytorch_lightning.utilities.data._is_dataloader_shuffled": "Lightning's shuffle decision, for the default",
    "pytorch_lightning.utilities.data._update_dataloader": "Lightning's re-instantiation of a loader with a sampler",
    "pytorch_lightning.utilities.argparse._defaults_from_env_vars": "PL_TRAINER_* defaults for our generated __init__",
    "pytorch_lightning.strategies.DDPStrategy._process_group_backend": "torch_dist_backend as the strategy's own",
    "pytorch_lightning.strategies.DDPStrategy._get_process_group_backend": "the backend the strategy would choose",
    "pytorch_lightning.strategies.DDPStrategy._timeout": "the process-group timeout the strategy was given",
    "lightning_fabric.strategies.DDPStrategy._set_world_ranks": "Fabric's strategies read their ranks privately",
    "pytorch_lightning.trainer.connectors.accelerator_connector._AcceleratorConnector"
    "._choose_and_init_cluster_environment": "its detection order, mirrored by LIGHTNING_DETECTION_ORDER",
}

# Lightning's own detection (``_AcceleratorConnector._choose_and_init_cluster_environment``) tries TorchElastic,
# SLURM, LSF, then MPIEnvironment, whose detect() initialises MPI; nothing here ever calls that one.
LIGHTNING_DETECTION_ORDER: tuple[str, ...] = ("TorchElasticEnvironment", "SLURMEnvironment", "LSFEnvironment")

# What this package keeps on a Lightning object (a strategy's checked flags), under one attribute of its own.
_OURS = "_lightning_dist_hooks"


def keep_ours(obj: object, value: object) -> None:
    """Keep ``value`` on the Lightning object ``obj``; it travels with ``obj`` when ``ddp_spawn`` pickles it."""
    setattr(obj, _OURS, value)


def ours(obj: object) -> object:
    """What :func:`keep_ours` kept on ``obj``, or None."""
    return getattr(obj, _OURS, None)


class MixedLightningPackagesError(TypeError):
    """An object of one Lightning package was given to a Trainer or Fabric of the other."""


@dataclass(frozen=True, eq=False)
class Flavour:
    """One of the two Lightning packages: where its Trainer side and its Fabric side live, imported on first use.

    >>> PYTORCH_LIGHTNING.pytorch, LIGHTNING.fabric
    ('pytorch_lightning', 'lightning.fabric')
    """

    distribution: str  # what pip installs
    pytorch: str  # the Trainer side
    fabric: str  # the Fabric side
    public_module: str  # where this package's classes for this flavour live
    import_hint: str  # how a user imports this flavour's Trainer

    def _name(self, module: str, name: str) -> Any:
        self.check_version()
        return getattr(importlib.import_module(module), name)

    def pytorch_name(self, path: str, name: str) -> Any:
        return self._name(f"{self.pytorch}{path}", name)

    def fabric_name(self, path: str, name: str) -> Any:
        return self._name(f"{self.fabric}{path}", name)

    def check_version(self) -> None:
        """Warn once, naming the fix, when this package or torch is installed outside the tested range."""
        warn_if_untested(self.distribution)
        warn_if_untested("torch")

    def classes(self) -> ModuleType:
        """This package's classes for this flavour: its Trainer, LightningModule, Fabric, data connector."""
        return importlib.import_module(self.public_module)

    def owns(self, cls: type) -> bool:
        """Whether ``cls`` or one of its bases is defined in this flavour's package."""
        prefixes = (f"{self.pytorch}.", f"{self.fabric}.")
        return any(f"{base.__module__}.".startswith(prefixes) for base in cls.__mro__)

    # Public names, both sides; like the private DataConnector, each property is named after the class it returns
    # (hence noqa: N802).
    @property
    def Trainer(self) -> type[pytorch_lightning.Trainer]:  # noqa: N802
        return self.pytorch_name("", "Trainer")

    @property
    def LightningModule(self) -> type[pytorch_lightning.LightningModule]:  # noqa: N802
        return self.pytorch_name("", "LightningModule")

    @property
    def Fabric(self) -> type[lightning_fabric.Fabric]:  # noqa: N802
        return self.fabric_name("", "Fabric")

    @property
    def ClusterEnvironment(self) -> type[lightning_fabric.plugins.environments.ClusterEnvironment]:  # noqa: N802
        return self.fabric_name(".plugins.environments", "ClusterEnvironment")

    def lightning_environment(self, name: str) -> type[lightning_fabric.plugins.environments.ClusterEnvironment]:
        """One of Lightning's cluster environments by class name, e.g. ``"SLURMEnvironment"``."""
        return self.fabric_name(".plugins.environments", name)

    def rank_zero_warn(self, message: str) -> None:
        """Lightning's ``rank_zero_warn``, pointing at the user's line (their ``Trainer(...)`` or ``fit(...)``), not
        at ours: it names the frame ``stacklevel`` levels above its own ``_warn`` (4: its caller, this method; 5: the
        caller of this method)."""
        self.fabric_name(".utilities.rank_zero", "rank_zero_warn")(message, stacklevel=5 + _frames_above_to_user_code())

    def rank_zero_info(self, message: str) -> None:
        self.fabric_name(".utilities.rank_zero", "rank_zero_info")(message)

    @property
    def distributed_log(self) -> logging.Logger:
        """The logger of Lightning's ``_init_dist_connection``, so our bootstrap messages read exactly as its own."""
        self.check_version()
        return logging.getLogger(f"{self.fabric}.utilities.distributed")

    def process_group_strategies(self, strategy: object) -> tuple[type, ...]:
        """Strategies (of ``strategy``'s side) whose setup creates the default group via ``_init_dist_connection``.

        DeepSpeedStrategy subclasses DDPStrategy; DeepSpeed skips its own bootstrap when a group already exists.
        """
        on_fabric_side = any(base.__module__.startswith(f"{self.fabric}.") for base in type(strategy).__mro__)
        name = self.fabric_name if on_fabric_side else self.pytorch_name
        return tuple(name(".strategies", cls) for cls in ("DDPStrategy", "FSDPStrategy", "ModelParallelStrategy"))

    def is_cuda_accelerator(self, accelerator: object) -> bool:
        return any(base.__name__ == "CUDAAccelerator" and self.owns(base) for base in type(accelerator).__mro__)

    # Private names.
    @property
    def DataConnector(self) -> type[_DataConnector]:  # noqa: N802
        """Subclassed per flavour: ``_prepare_dataloader`` is the one place every train, validation, sanity-check,
        test and predict loader passes through after the process group exists, and it has no public hook."""
        return self.pytorch_name(".trainer.connectors.data_connector", "_DataConnector")

    def without_env_defaults(self, trainer_init: Callable[..., None]) -> Callable[..., None]:
        """``Trainer.__init__`` without its ``PL_TRAINER_*`` wrapper, for a caller that has applied it already."""
        if trainer_init is self.Trainer.__init__:
            return trainer_init.__wrapped__  # type: ignore[attr-defined]  # set by functools.wraps
        return trainer_init

    def with_env_defaults(self, init: Callable[..., None]) -> Callable[..., None]:
        """``init`` wrapped as Lightning wraps ``Trainer.__init__``: ``PL_<CLASS>_<PARAMETER>`` gives defaults."""
        return self.pytorch_name(".utilities.argparse", "_defaults_from_env_vars")(init)


PYTORCH_LIGHTNING = Flavour(
    distribution="pytorch-lightning",
    pytorch="pytorch_lightning",
    fabric="lightning_fabric",
    public_module="lightning_dist_hooks._pytorch_lightning",
    import_hint="from lightning_dist_hooks import Trainer, Fabric (with import pytorch_lightning as pl)",
)
LIGHTNING = Flavour(
    distribution="lightning",
    pytorch="lightning.pytorch",
    fabric="lightning.fabric",
    public_module="lightning_dist_hooks.lightning",
    import_hint="from lightning_dist_hooks.lightning import Trainer, Fabric (with import lightning as L)",
)
FLAVOURS = (PYTORCH_LIGHTNING, LIGHTNING)


# The first release whose DDP strategies pass init_process_group(device_id=<the rank's accelerator>); older ones
# create a group bound to no device (found in their wheels: 2.5.4 does not, 2.5.5 does).
_FIRST_RELEASE_BINDING_GROUPS_TO_DEVICES = "2.5.5"


def binds_groups_to_devices(strategy: object) -> bool:
    """Whether the Lightning of ``strategy`` passes ``device_id`` when it creates the default group itself."""
    flavour = flavour_of(strategy) or PYTORCH_LIGHTNING
    from packaging.version import Version  # Lightning's own dependency

    installed = installed_version(flavour.distribution)
    return installed is None or Version(installed) >= Version(_FIRST_RELEASE_BINDING_GROUPS_TO_DEVICES)


def flavour_of(obj: object) -> Flavour | None:
    """The Lightning package ``obj`` (an instance or a class) belongs to, or None for objects of neither."""
    cls = obj if isinstance(obj, type) else type(obj)
    return next((flavour for flavour in FLAVOURS if flavour.owns(cls)), None)


def check_same_package(owner: object, objects: dict[str, object]) -> None:
    """Raise one clear error when an object of ``objects`` comes from the other Lightning package than ``owner``."""
    expected = flavour_of(owner)
    for what, value in objects.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            actual = flavour_of(item)
            if expected is not None and actual is not None and actual is not expected:
                raise MixedLightningPackagesError(
                    f"{what}={type(item).__qualname__} comes from {actual.pytorch}/{actual.fabric} (pip "
                    f"{actual.distribution}), but this {type(owner).__name__} is "
                    f"{expected.pytorch}/{expected.fabric}'s (pip {expected.distribution}). The two Lightning packages "
                    f"are separate copies whose objects do not mix: import everything from one of them, e.g. "
                    f"{actual.import_hint}."
                )


def lightning_environment_name(environment: object) -> str | None:
    """The class name of the Lightning cluster environment ``environment`` is (or subclasses), of either package."""
    for base in type(environment).__mro__:
        if any(base.__module__.startswith(f"{flavour.fabric}.plugins.environments") for flavour in FLAVOURS):
            return base.__name__ if base.__name__ != "ClusterEnvironment" else None
    return None


def requested_process_group_backend(strategy: object) -> str | None:
    """The backend the user gave the strategy (``DDPStrategy(process_group_backend=...)``), or None."""
    return getattr(strategy, "_process_group_backend", None)


def set_process_group_backend(strategy: object, backend: str) -> None:
    """Equivalent to having passed ``process_group_backend=backend`` to the strategy's constructor."""
    strategy._process_group_backend = backend  # type: ignore[attr-defined]  # private to Lightning's strategies


def resolved_process_group_backend(strategy: object) -> str:
    """The backend the strategy would hand to ``init_process_group``: the one it was given, else Lightning's choice
    for its devices (the first of them: in Trainer(...) the rank, and so its own device, is not known yet)."""
    flavour = flavour_of(strategy) or PYTORCH_LIGHTNING
    choice = flavour.fabric_name(".utilities.distributed", "_get_default_process_group_backend_for_device")
    return requested_process_group_backend(strategy) or choice(strategy.parallel_devices[0])  # type: ignore[attr-defined]  # every strategy that creates a group has them


def process_group_timeout(strategy: object) -> timedelta:
    """The strategy's ``timeout=`` (Lightning's default is torch's default process-group timeout)."""
    return strategy._timeout  # type: ignore[attr-defined]  # private to Lightning's strategies


def set_world_ranks(strategy: object) -> None:
    """Let the strategy read its ranks from the cluster environment (public on the Trainer side, private in Fabric)."""
    public = getattr(strategy, "set_world_ranks", None)
    (public or strategy._set_world_ranks)()  # type: ignore[attr-defined]  # Fabric's strategies: private


def lightning_sampler_choice(trainer: Any, dataloader: DataLoader, stage: Any) -> Sampler | None:
    """The sampler Lightning itself would give ``dataloader``, or None where it leaves the loader as it is.

    Mirrors ``_DataConnector._prepare_dataloader`` and ``_process_dataloader`` (which decides ``shuffle``), so
    that the default ``configure_sampler`` is exactly today's behaviour: ``use_distributed_sampler``, the
    predict-time wrapper and the wrapper around custom samplers included.
    """
    flavour = flavour_of(trainer)
    assert flavour is not None
    running_stage = flavour.pytorch_name(".trainer.states", "RunningStage")
    connector = trainer._data_connector
    if not (connector._requires_distributed_sampler(dataloader) or stage == running_stage.PREDICTING):
        return None
    is_shuffled = flavour.pytorch_name(".utilities.data", "_is_dataloader_shuffled")
    shuffle = True if stage == running_stage.TRAINING else is_shuffled(dataloader)
    return connector._resolve_sampler(dataloader, shuffle=shuffle, mode=stage)


def rebuild_dataloader(dataloader: DataLoader, sampler: Sampler, stage: Any) -> DataLoader:
    """Lightning's own re-instantiation: batch size, workers, collate and subclass arguments are kept."""
    flavour = flavour_of(stage)
    assert flavour is not None
    return flavour.pytorch_name(".utilities.data", "_update_dataloader")(dataloader, sampler, mode=stage)


def data_connector_class(
    flavour: Flavour, name: str, module: str, prepare_dataloader: Callable[..., object]
) -> type[_DataConnector]:
    """``flavour``'s data connector with ``prepare_dataloader`` in place of its own, named ``module.name``."""
    connector = type(name, (flavour.DataConnector,), {"_prepare_dataloader": prepare_dataloader})
    connector.__module__ = module
    return connector


def lightning_prepare_dataloader(connector: Any, dataloader: object, shuffle: bool, mode: Any) -> object:
    """What Lightning's own data connector does with ``dataloader``, for a connector of :func:`data_connector_class`."""
    flavour = flavour_of(connector)
    assert flavour is not None  # a data connector of a flavour
    return flavour.DataConnector._prepare_dataloader(connector, dataloader, shuffle, mode)


def replace_data_connector_class(trainer: Any, connector_class: type) -> None:
    """Give the trainer's data connector a subclass of its flavour's ``DataConnector``, keeping its state."""
    trainer._data_connector.__class__ = connector_class


# Packages whose frames stand between a warning of ours and the user's code that caused it.
_NOT_USER_CODE = ("lightning_dist_hooks", "pytorch_lightning", "lightning_fabric", "lightning", "lightning_utilities")


def _frames_above_to_user_code() -> int:
    """How many frames above the caller of this function's caller the first frame of user code is (0: that caller is
    called by user code). Frames of this package and of Lightning's are skipped; none found: the outermost frame."""
    files = (getattr(sys.modules.get(name), "__file__", None) for name in _NOT_USER_CODE)
    directories = tuple(str(Path(file).parent) + os.sep for file in files if file)
    frame = sys._getframe(2)  # the caller of Flavour.rank_zero_warn
    levels = 0
    while frame.f_back is not None and frame.f_code.co_filename.startswith(directories):
        frame = frame.f_back
        levels += 1
    return levels
