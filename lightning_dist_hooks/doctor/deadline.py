"""The doctor's last resort: a rank still waiting ``--timeout`` plus a grace after start reports and exits 1.

Some waits have no timeout of their own: torch's TCPStore client waits forever on a port whose holder accepts
connections but never answers (a port in use by another program). Without this, such a rank would hang silently.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

# After --timeout plus this, a rank that is still waiting reports what it found and exits 1.
DEADLINE_GRACE_S = 20.0


def start_deadline(timeout_s: float, report_stuck: Callable[[str], None]) -> threading.Timer:
    """Start a timer that, unless cancelled first, passes ``report_stuck`` why this rank is stuck and ends the process
    with exit code 1 (whatever thread is waiting: ``os._exit``)."""
    deadline = threading.Timer(timeout_s + DEADLINE_GRACE_S, _give_up, args=(timeout_s, report_stuck))
    deadline.daemon = True  # a finished doctor exits without waiting for it
    deadline.start()
    return deadline


def _give_up(timeout_s: float, report_stuck: Callable[[str], None]) -> None:
    report_stuck(
        f"no result {timeout_s + DEADLINE_GRACE_S:g} s after start (--timeout {timeout_s:g} s "
        f"plus {DEADLINE_GRACE_S:g} s): this rank is stuck in a wait without a timeout of its own"
    )
    # The main thread is stuck inside torch where no exception reaches it: only ending the process ends the wait.
    os._exit(1)
