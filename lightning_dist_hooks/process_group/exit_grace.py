"""One last hand-over of the GIL at exit, so that a rank that finished its run does not abort in the interpreter's
teardown.

A gloo worker thread releases a finished collective's tensors after the caller has moved on, and releasing a tensor
that Python can see needs the GIL. ``destroy_process_group`` does not stop the workers (DDP keeps the group alive
until the interpreter's own teardown), so a release still waiting when the interpreter starts finalising ends the
thread inside a C++ destructor, and the process aborts: "terminate called without an active exception", exit code
134, after a run that completed (torch issue 190489). A collective shortly before exit is enough, such as an
all-reduce in ``on_fit_end``; Lightning's own Trainer meets it as plain torch does. Releasing the GIL for a moment,
from an exit handler that runs after Lightning's (which destroys the group) and before finalisation, lets a waiting
worker finish.
"""

from __future__ import annotations

import os
import time
from multiprocessing.util import Finalize

# Long enough for a runnable thread to be scheduled on a busy node; paid once per rank, at exit.
GRACE_S = 0.05
# Multiprocessing's exit handler runs after Lightning's atexit one (registered later, run first) and runs its own
# finalisers by priority: 1 comes after lightning_dist_hooks' process-group finaliser (100).
_PRIORITY = 1
_registered_in_pid: int | None = None


def hand_the_gil_to_backend_threads_at_exit() -> None:
    """Register, once per process, an exit handler that releases the GIL for ``GRACE_S`` before finalisation.

    Called by every rank of a distributed run; a forked child registers its own.

    >>> hand_the_gil_to_backend_threads_at_exit()
    >>> hand_the_gil_to_backend_threads_at_exit()  # once per process
    >>> registered_in_this_process()
    True
    """
    global _registered_in_pid
    if _registered_in_pid != os.getpid():
        Finalize(None, time.sleep, args=(GRACE_S,), exitpriority=_PRIORITY)
        _registered_in_pid = os.getpid()


def registered_in_this_process() -> bool:
    """Whether this process's exit hands the GIL over once more (every rank of a distributed run of ours)."""
    return _registered_in_pid == os.getpid()
