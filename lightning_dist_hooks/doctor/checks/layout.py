"""The job's layout: as many processes on each node as ``devices``, on as many nodes as ``num_nodes``.

A mismatch is a common reason a job hangs at its first rendezvous: its ranks wait for a world size of
``devices * num_nodes``, which the launcher did not start. The verdicts ``tasks-per-node`` and ``nodes`` come
from the launcher's own variables before the rendezvous when it has them, else from the hosts the ranks report after;
either way compared by the one launch-size check, :meth:`lightning_dist_hooks.launcher_variables.LaunchSize.mismatches`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from lightning_dist_hooks.doctor.checks.verdict import FAIL, OK, Verdict
from lightning_dist_hooks.doctor.facts import LauncherLayout
from lightning_dist_hooks.launcher_variables import LaunchSize, SizeMismatch


def check_launcher_layout(layout: LauncherLayout, devices: int, num_nodes: int) -> list[Verdict]:
    """The launcher's processes per node and node count against ``devices`` and ``num_nodes``."""
    mismatches = LaunchSize(per_node=tuple(layout.tasks_per_node), nodes=layout.nodes).mismatches(devices, num_nodes)
    verdicts = []
    if SizeMismatch.UNEVEN in mismatches:
        verdicts.append(
            Verdict(
                "tasks-per-node",
                FAIL,
                f"the launcher started a different number of processes on each node ({layout.source}); Lightning runs "
                "the same number on every node",
                f"start {devices} tasks on every node (e.g. srun --ntasks-per-node={devices})",
            )
        )
    elif SizeMismatch.PER_NODE in mismatches:
        tasks = layout.tasks_per_node[0]
        verdicts.append(
            Verdict(
                "tasks-per-node",
                FAIL,
                f"the launcher started {tasks} processes per node ({layout.source}), but the job asks for "
                f"devices={devices}",
                f"start {devices} tasks per node (srun --ntasks-per-node={devices}, "
                f"torchrun --nproc-per-node={devices}, mpirun --map-by ppr:{devices}:node), or pass devices={tasks}",
            )
        )
    else:
        verdicts.append(Verdict("tasks-per-node", OK, f"{devices} processes per node ({layout.source}), as devices"))
    if SizeMismatch.NODES in mismatches:
        verdicts.append(
            Verdict(
                "nodes",
                FAIL,
                f"the launcher started processes on {layout.nodes} node(s) ({layout.source}), but the job asks for "
                f"num_nodes={num_nodes}",
                f"ask the launcher for {num_nodes} node(s) (srun -N {num_nodes}, torchrun --nnodes {num_nodes}), "
                f"or pass num_nodes={layout.nodes}",
            )
        )
    else:
        verdicts.append(Verdict("nodes", OK, f"{num_nodes} node(s), as num_nodes"))
    return verdicts


def check_hosts(ranks: list[dict[str, Any]], devices: int, num_nodes: int) -> list[Verdict]:
    """Where the ranks really run, by host name, when the launcher did not say (e.g. Lightning's own launcher)."""
    per_host = Counter(rank["host"] for rank in ranks)
    described = ", ".join(f"{host}: {count}" for host, count in sorted(per_host.items()))
    mismatches = LaunchSize(per_node=tuple(per_host.values()), nodes=len(per_host)).mismatches(devices, num_nodes)
    verdicts = []
    if SizeMismatch.UNEVEN in mismatches or SizeMismatch.PER_NODE in mismatches:
        verdicts.append(
            Verdict(
                "tasks-per-node",
                FAIL,
                f"ranks per host ({described}) differ from devices={devices}",
                f"start {devices} processes on every node, or pass the devices the launcher gives",
            )
        )
    else:
        verdicts.append(Verdict("tasks-per-node", OK, f"{devices} ranks on each host, as devices"))
    if SizeMismatch.NODES in mismatches:
        verdicts.append(
            Verdict(
                "nodes",
                FAIL,
                f"the ranks run on {len(per_host)} host(s) ({described}), but num_nodes={num_nodes}",
                f"start the job on {num_nodes} node(s), or pass num_nodes={len(per_host)}",
            )
        )
    else:
        verdicts.append(Verdict("nodes", OK, f"{num_nodes} host(s), as num_nodes"))
    return verdicts
