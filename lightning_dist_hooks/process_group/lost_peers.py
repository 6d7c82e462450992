"""After a collective times out: which ranks this rank lost, asked through the rendezvous store.

gloo says only "Timed out waiting 15000ms for recv operation to complete" when a peer's node dies or its network
goes down, not which peer. The store every rank met through is still there (on rank 0, or a shared file), so
each failing rank writes "still here" to it and reads, for a few seconds, who else does:

* the ranks that never answer are the ones lost (``lost contact with ranks [2, 3]``);
* a rank that cannot reach the store at all has lost rank 0, which holds it (a ``tcp://``/``env://`` store);
* when every rank answers, the ranks are alive but their own connections failed (the network gloo uses).

The wait is bounded (twice :data:`ANSWER_WAIT_S`), so a failing job ends at most that much later.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import torch.distributed

# How long a rank waits for the others' answers (and for the store itself).
ANSWER_WAIT_S = 5.0
_KEY_PREFIX = "lightning_dist_hooks/still-here/"
# What gloo says when a peer stops answering: "Timed out waiting 15000ms for recv operation to complete".
# A peer that died is not asked about: its closed sockets fail the collective at once, with gloo naming the peer
# ("Connection closed by peer [ADDRESS]:PORT"), and the launcher is already stopping the other ranks.
# gloo words it the second way when another operation's timeout has already closed the pair to that peer.
_COLLECTIVE_TIMEOUT = re.compile(
    r"timed out waiting \d+ ?ms for (send|recv)|application timeout caused pair closure", re.IGNORECASE
)


def is_collective_timeout(error: BaseException) -> bool:
    """Whether ``error`` is a collective that waited out its timeout for a peer (which this module then names)."""
    return _COLLECTIVE_TIMEOUT.search(str(error)) is not None


def lost_peers_message(rank: int, world_size: int, wait_s: float = ANSWER_WAIT_S) -> str | None:
    """Ask every rank through the default group's store who is still there; None without a store (``mpi://``).

    On rank 0 of 4 whose peers on another node were cut off::

        'rank 0 of 4 lost contact with ranks [2, 3]: they did not answer through the rendezvous store within 5 s ...'
    """
    store = _default_store()
    if store is None:
        return None
    _set_timeout(store, timedelta(seconds=wait_s))
    answer: list = []
    # A TCPStore client whose server's network is gone can block in a call beyond its timeout: ask from a daemon
    # thread, which the exiting rank leaves behind if it never returns.
    asking = threading.Thread(target=_ask, args=(store, rank, world_size, wait_s, answer), daemon=True)
    asking.start()
    asking.join(2 * wait_s + 1)
    if not answer or isinstance(answer[0], Exception):  # the store's host is gone, or the path to it
        why = f" ({type(answer[0]).__name__}: {answer[0]})" if answer else ""
        return (
            f"rank {rank} of {world_size} lost contact with rank 0: the rendezvous store rank 0 holds did not "
            f"answer within {wait_s:g} s{why}"
        )
    missing = answer[0]
    if missing:
        return (
            f"rank {rank} of {world_size} lost contact with ranks {missing}: they did not answer through the "
            f"rendezvous store within {wait_s:g} s (their node is down or cut off, or they died)"
        )
    return (
        f"rank {rank} of {world_size}: a collective failed, but every rank still answers through the rendezvous "
        "store: the connections between the ranks failed (check the network GLOO_SOCKET_IFNAME names)"
    )


def _ask(store: torch.distributed.Store, rank: int, world_size: int, wait_s: float, answer: list) -> None:
    """Say this rank is here; put the list of ranks that did not say so within ``wait_s`` (or the error) in answer."""
    try:
        store.set(f"{_KEY_PREFIX}{rank}", "1")
        answer.append(_ranks_not_answering(store, world_size, wait_s))
    except Exception as error:
        answer.append(error)


def _ranks_not_answering(store: torch.distributed.Store, world_size: int, wait_s: float) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        missing = [peer for peer in range(world_size) if not store.check([f"{_KEY_PREFIX}{peer}"])]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def _default_store() -> torch.distributed.Store | None:
    if not torch.distributed.is_initialized():
        return None
    try:
        return torch.distributed.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError):  # a group made without a store (mpi://)
        return None


def _set_timeout(store: torch.distributed.Store, timeout: timedelta) -> None:
    # A PrefixStore keeps its own timeout and its underlying store's; both bound a call.
    current: torch.distributed.Store | None = store
    while current is not None:
        current.set_timeout(timeout)
        current = getattr(current, "underlying_store", None)
