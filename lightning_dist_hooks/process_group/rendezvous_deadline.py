"""Ending a rank whose rendezvous is stuck inside torch past its timeout, instead of waiting forever.

torch honours the process-group timeout in most of its rendezvous waits, and then ``create_process_group`` turns
its error into a message naming the missing ranks. Not in all of them: in torch 2.13 a ``TCPStore`` client whose
server's port is held by a process that never accepts (a stale or foreign listener on a ``tcp://`` or ``env://``
port) waits forever whatever the timeout, and a ``FileStore`` reading a record that a killed writer cut short
loops forever. And the timeout bounds each wait, not the rendezvous: gloo waits for the ranks one after another,
each wait with the whole timeout, so a rank arriving late pushes back the error about a rank that never does.
torch releases the GIL while it waits, so a timer thread can still act: if the rendezvous has not returned
``grace`` seconds after its timeout, it says so on stderr, naming where the ranks meet (the handler's
``location``) and the ranks still missing as far as the rendezvous can tell, and ends the process with exit code 1.
A launcher then ends the job as for any failed rank; the ``file://`` janitor removes the rendezvous files. No code
of the process runs after it: nothing else can end a thread that torch holds.

    with rendezvous_deadline(rank, world_size, "tcp://10.0.0.1:29500", timedelta(minutes=30), missing):
        torch.distributed.init_process_group(...)
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from lightning_dist_hooks.process_group.progress import MissingRanks
from lightning_dist_hooks.wait_schedule import grace_s

EXIT_CODE = 1


def print_to_stderr(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


# What a stuck rank does with the message before it ends; the doctor replaces it to report its findings with it.
report_stuck: Callable[[str], None] = print_to_stderr


def timed_out(rank: int, world_size: int, init_method: str, timeout: timedelta, who: str) -> str:
    """How a rendezvous timeout begins, whether torch raised it (``create_process_group``) or the deadline saw it;
    ``who``: the missing ranks, as far as this rank can tell.

    >>> print(timed_out(0, 2, "tcp://10.0.0.1:29500", timedelta(seconds=15),
    ...                 "ranks that never arrived: [1]"))  # doctest: +NORMALIZE_WHITESPACE
    rank 0 of 2 timed out after 15 s waiting for the rendezvous through tcp://10.0.0.1:29500; ranks that never
    arrived: [1]
    """
    return (
        f"rank {rank} of {world_size} timed out after {timeout.total_seconds():g} s waiting for the rendezvous "
        f"through {init_method}; {who}"
    )


def stuck_message(rank: int, world_size: int, init_method: str, timeout: timedelta, missing: list[int] | None) -> str:
    """What a rank says before it ends itself; ``init_method`` is where the ranks really meet (the handler's
    ``location``: for ``file://`` and ``dir://``, inside this user's private directory).

    Ranks known to be missing are the cause, whatever torch is doing meanwhile (waiting out a timeout restarted for
    a rank that arrived late, or stuck): the message is a timeout naming them, as torch's own error would have been.

    >>> print(stuck_message(0, 4, "file:///shared/ldh-uid-1000/run42", timedelta(seconds=15),
    ...                     [2, 3]))  # doctest: +NORMALIZE_WHITESPACE
    [lightning_dist_hooks] rank 0 of 4 timed out after 15 s waiting for the rendezvous through
    file:///shared/ldh-uid-1000/run42; ranks that never arrived: [2, 3]. torch had not returned 10 s later (its wait
    restarts for each rank that arrives, and some of its waits ignore the timeout): ending this process with exit
    code 1, so that the launcher ends the job instead of waiting. Check that every rank was started and reaches
    the same init_method.

    Otherwise torch itself is stuck:

    >>> print(stuck_message(1, 2, "tcp://10.0.0.1:29500", timedelta(seconds=15),
    ...                     None))  # doctest: +NORMALIZE_WHITESPACE
    [lightning_dist_hooks] rank 1 of 2: the rendezvous through tcp://10.0.0.1:29500 has not returned 10 s after its
    15 s timeout: it is stuck inside torch, which did not honour the timeout (which ranks are missing cannot be
    known from this rank). Ending this process with exit code 1, so that the launcher ends the job instead of
    waiting forever. Check that every rank reaches the same init method and, for tcp:// and env://, that no other
    process holds rank 0's port.
    """
    if missing:
        return (
            f"[lightning_dist_hooks] "
            f"{timed_out(rank, world_size, init_method, timeout, f'ranks that never arrived: {missing}')}. torch had "
            f"not returned {grace_s(timeout):g} s later (its wait restarts for each rank that arrives, and some of its "
            f"waits ignore the timeout): ending this process with exit code {EXIT_CODE}, so that the launcher ends "
            "the job instead of waiting. Check that every rank was started and reaches the same init_method."
        )
    who = "which ranks are missing cannot be known from this rank" if missing is None else "every rank has arrived"
    return (
        f"[lightning_dist_hooks] rank {rank} of {world_size}: the rendezvous through {init_method} has not "
        f"returned {grace_s(timeout):g} s after its {timeout.total_seconds():g} s timeout: it is stuck inside "
        f"torch, which did not honour the timeout ({who}). Ending this process with exit code {EXIT_CODE}, so that "
        "the launcher ends the job instead of waiting forever. Check that every rank reaches the same init "
        "method and, for tcp:// and env://, that no other process holds rank 0's port."
    )


@contextmanager
def rendezvous_deadline(
    rank: int, world_size: int, init_method: str, timeout: timedelta, missing: MissingRanks
) -> Iterator[None]:
    """End this process if the body has not returned ``grace_s(timeout)`` after ``timeout`` (see module doc)."""

    def end_process() -> None:
        try:
            who = missing()
        except Exception:  # the rendezvous's own state may be what is broken: the message goes out regardless
            who = None
        try:
            report_stuck(stuck_message(rank, world_size, init_method, timeout, who))
        finally:
            os._exit(EXIT_CODE)

    timer = threading.Timer(timeout.total_seconds() + grace_s(timeout), end_process)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
