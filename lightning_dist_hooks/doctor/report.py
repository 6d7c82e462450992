"""The doctor's output: a table of every rank and the verdicts for people, one JSON document for machines.

The report is the last thing the doctor prints: the warnings Lightning and torch raise while the doctor's own Trainer
runs (a deprecation, ``DistributedSampler`` during validate, "The `srun` command is available ...") are caught and
listed, shortened, in a section of their own before the verdicts (``"warnings"`` in the JSON), instead of following
the verdict on stderr.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from lightning_dist_hooks.doctor.checks import FAIL, Verdict

_MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


# A caught warning, shortened for the report, at most this long.
WARNING_MAX_CHARS = 200


def table(ranks: list[dict[str, Any]], verdicts: list[Verdict], warnings: Sequence[str] = ()) -> str:
    """Rank 0's report after a rendezvous: one row per rank, what they share, the warnings raised meanwhile (by
    Lightning, torch: see :func:`warning_text`), then the verdicts."""
    first = ranks[0]
    rows = [("rank", "node", "local", "host", "host resolves to", "pid", "listening TCP sockets after setup")]
    for rank in ranks:
        sockets = "; ".join(f"{each['socket']} ({each['opened_by']})" for each in rank["listening"]) or "none"
        rows.append(
            (
                str(rank["rank"]),
                str(rank["node_rank"]),
                str(rank["local_rank"]),
                rank["host"],
                ", ".join(rank["host_addresses"]) or "-",
                str(rank["pid"]),
                sockets,
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    lines = [
        (
            f"lightning-dist-hooks doctor: {len(ranks)} ranks, backend {first['backend']}, "
            f"init method {first['init_method']}"
        ),
        "",
    ]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows
    ]
    lines += [""]
    for name in sorted({rank["environment"] for rank in ranks}):
        example = next(rank for rank in ranks if rank["environment"] == name)
        lines.append(f"environment: {_environment_line(example)}, seen by rank {example['rank']}")
    lines.append(f"backends available: {', '.join(first['backends_available'])}")
    if first["rendezvous_file"]:
        lines.append(f"rendezvous file: {first['rendezvous_file']}")
    interfaces = ", ".join(f"{name} {address}" for name, address in sorted(first["interfaces"].items())) or "lo only"
    lines.append(f"interfaces (rank 0): {interfaces}; GLOO_SOCKET_IFNAME={first['gloo_socket_ifname'] or 'unset'}")
    speed = first["allreduce"]
    lines.append(
        f"all-reduce (rank 0): latency {speed['latency_ms']:.3f} ms (4 bytes, median of 20), bandwidth "
        f"{speed['bandwidth_gb_s']:.2f} GB/s ({speed['bandwidth_bytes'] >> 20} MiB, median of 5)"
    )
    return "\n".join([*lines, *warning_lines(warnings, "rank 0"), "", *verdict_lines(verdicts)])


def local(facts: dict[str, Any], verdicts: list[Verdict], warnings: Sequence[str] = ()) -> str:
    """A rank's own report when there was no rendezvous to gather the others' through."""
    rank = facts["rank"]
    who = "this process" if rank is None else f"rank {rank} of {facts['world_size']} (host {facts['host']})"
    lines = [f"lightning-dist-hooks doctor: {who}: no rendezvous, so these are this rank's own findings only"]
    if rank is not None:
        lines.append(f"environment: {_environment_line(facts)}")
        lines.append(f"init method: {facts['init_method']}, backend {facts['backend']}")
    caught_by = "this process" if rank is None else f"rank {rank}"
    return "\n".join([*lines, *warning_lines(warnings, caught_by), "", *verdict_lines(verdicts)])


def warning_text(category: str, filename: str, lineno: int, message: str) -> str:
    """A warning raised during the check, for the report: where it comes from (from the package on), its category
    and the first line of its message, cut to :data:`WARNING_MAX_CHARS`.

    >>> warning_text("UserWarning", "/venv/lib/python3.11/site-packages/pytorch_lightning/trainer/data_connector.py",
    ...              217, "Using `DistributedSampler` with the dataloaders.\\nMore.")
    'pytorch_lightning/trainer/data_connector.py:217: UserWarning: Using `DistributedSampler` with the dataloaders.'
    """
    where = re.split(r"/(?:site|dist)-packages/", filename)[-1]
    text = f"{where}:{lineno}: {category}: {message.strip().splitlines()[0] if message.strip() else ''}"
    return text if len(text) <= WARNING_MAX_CHARS else text[: WARNING_MAX_CHARS - 1] + "…"


def warning_lines(warnings: Sequence[str], who: str) -> list[str]:
    """The section of the caught warnings (none: no section), each once, in the order first raised."""
    if not warnings:
        return []
    counts = Counter(warnings)
    lines = ["", f"warnings during the check ({who}; raised by Lightning or torch while the doctor ran, not findings):"]
    for text in dict.fromkeys(warnings):
        lines.append(f"  {text}" + (f" ({counts[text]} times)" if counts[text] > 1 else ""))
    return lines


def verdict_lines(verdicts: list[Verdict]) -> list[str]:
    failed = sum(verdict.status == FAIL for verdict in verdicts)
    lines = ["verdicts:"]
    for verdict in verdicts:
        where = f" [ranks {_ranges(verdict.ranks)}]" if verdict.ranks and verdict.status != "ok" else ""
        lines.append(f"  {_MARKS[verdict.status]}  {verdict.check}: {verdict.message}{where}")
        if verdict.fix and verdict.status != "ok":
            lines.append(f"        fix: {verdict.fix}")
    lines.append(f"{failed} check(s) failed" if failed else "every check passed")
    return lines


def document(ranks: list[dict[str, Any]], verdicts: list[Verdict], warnings: Sequence[str] = ()) -> str:
    """The report as one JSON line: ``ok``, ``ranks``, ``verdicts``, and ``warnings`` (this rank's caught warnings,
    as :func:`warning_text` shortens them, each once)."""
    return json.dumps(
        {
            "ok": not any(verdict.status == FAIL for verdict in verdicts),
            "ranks": ranks,
            "verdicts": [verdict.as_dict() for verdict in verdicts],
            "warnings": list(dict.fromkeys(warnings)),
        }
    )


def _environment_line(facts: dict[str, Any]) -> str:
    evidence = ", ".join(f"{name}={value}" for name, value in facts["evidence"].items())
    return f"{facts['environment']} ({evidence or 'no launcher variables: Lightning starts the processes'})"


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in spans)
