"""Saying who is still missing while a rank waits at the rendezvous, instead of silence until the timeout.

A timer thread starts when the rank begins to wait and is cancelled when the wait ends: nothing is printed when
every rank arrives within the first report time, and the training path pays nothing but one thread start.

    with rendezvous_progress(rank, world_size, "file:///shared/rdzv/ldh-uid-1000/run42", timedelta(minutes=30),
                             missing):
        torch.distributed.init_process_group(...)

prints, from rank 0 at INFO level (every other rank at DEBUG level)::

    rank 0: waiting for 3 of 16 ranks ([5, 9, 12]) through file:///shared/rdzv/ldh-uid-1000/run42, 40 s of 1800 s

The place named is where the ranks really meet, as the handler's :meth:`InitMethod.location` says
(``create_process_group`` asks it once): for ``file://`` and ``dir://``, inside this user's private directory
``ldh-uid-<UID>``, not the URL as given, so that ``ls`` on it shows the files.

Reports come after 10 s, 30 s, then every 60 s (:data:`DEFAULT_SCHEDULE`). To see the DEBUG lines of the other
ranks: ``logging.getLogger("lightning_dist_hooks.process_group.progress").setLevel(logging.DEBUG)``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from lightning_dist_hooks.init_methods import InitMethod, Rendezvous
from lightning_dist_hooks.wait_schedule import DEFAULT_SCHEDULE, ReportSchedule

log = logging.getLogger(__name__)

# Returns the ranks that have not arrived yet, or None when the rendezvous cannot tell which.
MissingRanks = Callable[[], list[int] | None]


def missing_ranks_query(handler: InitMethod, rendezvous: Rendezvous, world_size: int) -> MissingRanks:
    """Who has not arrived, as far as the rendezvous's handler tells while it waits (:meth:`InitMethod.waiting_for`).

    ``file://``: every rank claims the file first thing, so the missing claims name the missing ranks. Rank 0's
    ``TCPStore`` (``tcp://``, ``env://``) counts its clients under an internal key that the store's public API
    cannot read (torch shows the count only in its timeout error), and never learns their ranks: it cannot tell.
    """
    return lambda: handler.waiting_for(rendezvous, world_size)


# What create_process_group uses; the doctor replaces it with a faster one for its live line.
schedule = DEFAULT_SCHEDULE


def waiting_message(
    rank: int, world_size: int, init_method: str, elapsed_s: float, timeout: timedelta, missing: list[int] | None
) -> str:
    """One progress line; ``init_method`` is where the ranks really meet (the handler's ``location``).

    >>> waiting_message(0, 16, "file:///shared/ldh-uid-1000/run42", 40.2, timedelta(minutes=30), [5, 9, 12])
    'rank 0: waiting for 3 of 16 ranks ([5, 9, 12]) through file:///shared/ldh-uid-1000/run42, 40 s of 1800 s'
    """
    if missing is None:
        who = f"waiting for the other ranks of {world_size} (this rendezvous does not tell which have arrived)"
    elif missing:
        who = f"waiting for {len(missing)} of {world_size} ranks ({missing})"
    else:
        who = f"all {world_size} ranks have arrived; waiting for the backend to connect them"
    return f"rank {rank}: {who} through {init_method}, {elapsed_s:.0f} s of {timeout.total_seconds():.0f} s"


@contextmanager
def rendezvous_progress(
    rank: int,
    world_size: int,
    init_method: str,
    timeout: timedelta,
    missing_ranks: MissingRanks,
    report_schedule: ReportSchedule | None = None,
) -> Iterator[None]:
    """Report at the times of ``report_schedule`` (default: :data:`schedule`) until the block ends."""
    done = threading.Event()
    reporter = threading.Thread(
        target=_report_until_done,
        args=(done, rank, world_size, init_method, timeout, missing_ranks, report_schedule or schedule),
        name="lightning-dist-hooks-rendezvous-progress",
        daemon=True,
    )
    reporter.start()
    try:
        yield
    finally:
        done.set()


def _make_visible() -> None:
    # As Lightning does for its own logger: shown at INFO unless the application configured logging. Done at the
    # first report, not at import, so that importing the package changes nothing.
    if not log.handlers and not logging.getLogger().handlers:
        log.addHandler(logging.StreamHandler())
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)


def _report_until_done(
    done: threading.Event,
    rank: int,
    world_size: int,
    init_method: str,
    timeout: timedelta,
    missing_ranks: MissingRanks,
    report_schedule: ReportSchedule,
) -> None:
    started = time.monotonic()
    level = logging.INFO if rank == 0 else logging.DEBUG
    for report_at in report_schedule.times_within(timeout.total_seconds()):
        if done.wait(max(0.0, report_at - (time.monotonic() - started))):
            return
        try:
            missing = missing_ranks()
        except OSError:
            missing = None  # e.g. the shared directory went away: say what is known, keep waiting
        if done.is_set():
            return
        _make_visible()
        log.log(level, waiting_message(rank, world_size, init_method, time.monotonic() - started, timeout, missing))
