"""After the rendezvous: every rank's facts, gathered, turned into the doctor's final verdicts.

A pure function of the gathered facts, so that each rank reaches the same verdicts (and so the same exit code) and a
test can give it made-up ranks instead of starting processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_dist_hooks.doctor import checks
from lightning_dist_hooks.doctor.checks import Verdict
from lightning_dist_hooks.transports import Transport


def gathered_verdicts(
    ranks: list[dict[str, Any]],
    *,
    backend: str,
    devices: int,
    num_nodes: int,
    launcher_layout_checked: bool,
    token_directory: Path | None,
    transports: list[Transport],
) -> list[Verdict]:
    """The verdicts of every rank merged (failures first): each rank's own and those only all ranks' facts give.

    ``ranks`` holds one facts dict per rank (``facts.rank_facts``, completed after the rendezvous) with that rank's
    own verdicts under ``"verdicts"``. ``devices`` and ``num_nodes`` are the job's; when ``launcher_layout_checked``,
    the launcher said how many processes it started where and that was checked before the Trainer, so the host count
    is not checked again. ``token_directory`` is where the ranks left their tokens (None: the init method has no
    rendezvous file). ``transports`` are those taking part in the job, each asked for its own verdicts
    (``Transport.doctor_checks_after``).
    """
    everyone = [Verdict(**verdict) for rank in ranks for verdict in rank["verdicts"]]
    if not launcher_layout_checked:
        everyone += checks.check_hosts(ranks, devices, num_nodes)
    # Host names tell what --num-nodes may not: a job told one node that really spans several.
    spans_nodes = len({rank["host"] for rank in ranks}) > 1 or num_nodes > 1
    everyone.append(checks.check_host_names(ranks, spans_nodes))
    everyone.append(checks.check_allreduce(ranks))
    for transport in transports:
        everyone += transport.doctor_checks_after(backend, ranks, spans_nodes)
    if token_directory is not None:
        everyone.append(checks.check_all_tokens(token_directory, ranks))
    return checks.merge(everyone)
