"""The launcher's environment, handed to Lightning: what the Trainer and Fabric add to ``plugins`` before Lightning
builds its connectors (the detection itself is :mod:`lightning_dist_hooks.environments`')."""

from __future__ import annotations

import os
from typing import Any

from lightning_dist_hooks._lightning_internals import Flavour
from lightning_dist_hooks.environments import detect_cluster_environment, lightning_would_choose, register_with
from lightning_dist_hooks.launcher_variables import started_by_an_mpi_launcher


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
