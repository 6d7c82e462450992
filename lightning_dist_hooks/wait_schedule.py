"""When a waiting rank reports, and how long past its timeout a wait may still end: shared by the rank's own threads
(``process_group.progress``, ``process_group.rendezvous_deadline``) and the watchdog outside it
(``outside_watchdog``), so that a user sees the same lines at the same times whichever of them speaks.

>>> list(DEFAULT_SCHEDULE.times_within(200.0))
[10.0, 30.0, 90.0, 150.0]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class ReportSchedule:
    """When to report, in seconds since the wait began: each of ``first``, then every ``every`` seconds."""

    first: tuple[float, ...] = (10.0, 30.0)
    every: float = 60.0

    def times(self) -> Iterator[float]:
        yield from self.first
        last = self.first[-1] if self.first else 0.0
        while True:
            last += self.every
            yield last

    def times_within(self, timeout_s: float) -> Iterator[float]:
        """The report times before ``timeout_s``: at the timeout the wait's own error says who is missing."""
        for report_at in self.times():
            if report_at >= timeout_s:
                return
            yield report_at


DEFAULT_SCHEDULE = ReportSchedule()


def grace_s(timeout: timedelta) -> float:
    """How long past its timeout a rendezvous may still return: a tenth of the timeout, 10 s to 60 s.

    >>> grace_s(timedelta(seconds=15)), grace_s(timedelta(minutes=5)), grace_s(timedelta(minutes=30))
    (10.0, 30.0, 60.0)
    """
    return min(60.0, max(10.0, 0.1 * timeout.total_seconds()))
