"""What every check gives: a :class:`Verdict` (``ok``, ``warn`` or ``fail``, with the fix), and :func:`merge`, which
turns the verdicts of all ranks into one list, each outcome once, so that the report names it once with its ranks.

Below every layer, so that a transport's doctor diagnostics (:class:`lightning_dist_hooks.transports.Transport`)
give verdicts as the doctor's own checks do; the doctor's checks import it through ``doctor.checks.verdict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass
class Verdict:
    """One check's outcome. ``status`` is ``"ok"``, ``"warn"`` (exit code unchanged) or ``"fail"``."""

    check: str
    status: str
    message: str
    fix: str = ""
    ranks: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge(verdicts: list[Verdict]) -> list[Verdict]:
    """One verdict per distinct outcome, naming every rank that reached it; failures first."""
    merged: dict[tuple[str, str, str, str], Verdict] = {}
    for verdict in verdicts:
        key = (verdict.check, verdict.status, verdict.message, verdict.fix)
        if key in merged:
            merged[key].ranks = sorted(set(merged[key].ranks) | set(verdict.ranks))
        else:
            merged[key] = Verdict(*key, ranks=sorted(verdict.ranks))
    order = {FAIL: 0, WARN: 1, OK: 2}
    return sorted(merged.values(), key=lambda verdict: order[verdict.status])
