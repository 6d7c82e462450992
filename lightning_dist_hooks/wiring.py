"""What the Trainer and Fabric share: the detected launcher environment and the flags, given to their strategy."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lightning_dist_hooks._lightning_internals import Flavour
from lightning_dist_hooks.backends import check_backend_fits_devices, check_mpi_launch
from lightning_dist_hooks.config import ProcessGroupConfig
from lightning_dist_hooks.environments import detect_cluster_environment, lightning_would_choose, register_with
from lightning_dist_hooks.launcher_variables import started_by_an_mpi_launcher
from lightning_dist_hooks.strategy import attach_process_group_config, creates_process_group


def with_detected_cluster_environment(kwargs: dict[str, Any], flavour: Flavour) -> dict[str, Any]:
    """``kwargs`` with the detected cluster environment added to ``plugins``, unless the user chose one.

    The public route: Lightning takes a ``ClusterEnvironment`` from ``plugins`` before its own detection. Nothing
    is added where Lightning's own detection picks the same class without side effects, so Lightning's choice stays
    its own. In a process no launcher started, that is ``LightningEnvironment``, added so that Lightning does not
    initialise MPI to find it out (see below).
    """
    register_with(flavour)
    plugins = kwargs.get("plugins")
    plugin_list = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    strategy = kwargs.get("strategy")
    chosen_already = any(isinstance(plugin, flavour.ClusterEnvironment) for plugin in plugin_list) or (
        getattr(strategy, "cluster_environment", None) is not None
    )
    if chosen_already:
        return kwargs
    detected = detect_cluster_environment(flavour)
    if detected is None and not started_by_an_mpi_launcher(os.environ):
        # What Lightning would end with. Left alone, it would first call MPIEnvironment.detect(), which with mpi4py
        # installed initialises MPI just to find a world of one: an Open MPI singleton then starts an orted and
        # listens on every interface, from every Trainer(...), also with file://.
        detected = flavour.lightning_environment("LightningEnvironment")
    if detected is None or lightning_would_choose(detected, flavour):
        return kwargs
    return {**kwargs, "plugins": [*plugin_list, detected()]}


def devices_left_at_auto(kwargs: dict[str, Any]) -> bool:
    """Whether the Trainer's or Fabric's keyword arguments leave ``devices`` at Lightning's default, ``"auto"``.

    >>> devices_left_at_auto({}), devices_left_at_auto({"devices": "auto"}), devices_left_at_auto({"devices": 2})
    (True, True, False)
    """
    devices = kwargs.get("devices", "auto")
    return isinstance(devices, str) and devices.strip().lower() == "auto"


def _what_auto_gave(parallel_devices: list[Any]) -> str:
    """What Lightning's ``devices="auto"`` gave on this machine, in words: ``"1 process per node on CPU"``."""
    count = len(parallel_devices)
    processes = f"{count} process{'' if count == 1 else 'es'} per node"
    kind = getattr(parallel_devices[0], "type", "cpu") if parallel_devices else "cpu"
    return f"{processes} on CPU" if kind == "cpu" else f"{processes}, one per visible {kind.upper()} device"


def apply_flags(
    owner: object,
    strategy: Any,
    config: ProcessGroupConfig,
    flavour: Flavour,
    setup_distributed_backend: Callable[..., None] | None = None,
    *,
    devices_by_default: bool = False,
) -> ProcessGroupConfig:
    """Make ``owner``'s (a Trainer's or a Fabric's) strategy create its group with ``config``; the config it uses.

    The init method is resolved here, at construction (``file:///DIR/`` to this launch's file): the process that
    launches the others names the launch before any of them starts. ``devices_by_default``: the user left
    ``devices`` at ``"auto"`` (the messages then say so rather than show a ``devices=`` the user never wrote).
    """
    if creates_process_group(strategy):
        config = config.resolved(strategy.cluster_environment, num_nodes=strategy.num_nodes)
        uses_cuda = flavour.is_cuda_accelerator(strategy.accelerator)
        if config.backend is not None:
            # Also checked as the strategy takes the config; first here, to name the backend as the user wrote it.
            check_backend_fits_devices(config.backend, uses_cuda, given=config.given_backend)
        attach_process_group_config(strategy, config, uses_cuda, setup_distributed_backend)
        check_mpi_launch(
            config.backend,
            config.init_method,
            config.handler.needs_mpi_launch,
            len(strategy.parallel_devices),
            strategy.num_nodes,
            given_backend=config.given_backend,
            devices_by_default=_what_auto_gave(strategy.parallel_devices) if devices_by_default else None,
            owner=type(owner).__name__,
        )
    elif not config.is_default or setup_distributed_backend is not None:
        hook = ", setup_distributed_backend" if setup_distributed_backend is not None else ""
        flavour.rank_zero_warn(
            f"{config.backend_flag} and torch_dist_init_method={config.init_method!r}{hook} are "
            f"ignored: {type(strategy).__name__} creates no process group. Use a multi-process strategy, "
            f"e.g. {type(owner).__name__}(strategy='ddp', devices=2), for them to take effect."
        )
    return config
