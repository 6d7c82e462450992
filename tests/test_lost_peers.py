"""lightning_dist_hooks.process_group.lost_peers in one process: who answers through the store, and what is a lost
contact.

The multi-node behaviour (a node's network cut mid-fit) is tests/test_multinode.py's.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_dist_hooks.process_group.lost_peers import is_collective_timeout, lost_peers_message

pytestmark = pytest.mark.unit


@pytest.fixture
def group_of_one(tmp_path):
    """A gloo group of world size 1, the store a real FileStore (what the peers of a real job would share)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30))
    yield store
    dist.destroy_process_group()


def test_ranks_that_do_not_answer_are_named_within_the_wait(group_of_one):
    started = time.monotonic()
    message = lost_peers_message(rank=0, world_size=3, wait_s=0.5)
    assert message is not None
    assert message.startswith("rank 0 of 3 lost contact with ranks [1, 2]: they did not answer")
    assert time.monotonic() - started < 3


def test_when_every_rank_answers_the_connections_between_them_are_blamed(group_of_one):
    # What rank 1 would write, through the default group's store (a prefix over the FileStore).
    dist.distributed_c10d._get_default_store().set("lightning_dist_hooks/still-here/1", "1")
    message = lost_peers_message(rank=0, world_size=2, wait_s=0.5)
    assert message is not None
    assert "every rank still answers through the rendezvous store" in message and "GLOO_SOCKET_IFNAME" in message


def test_without_a_process_group_there_is_nobody_to_ask():
    assert lost_peers_message(rank=0, world_size=2, wait_s=0.5) is None


@pytest.mark.parametrize(
    "error, timed_out",
    [
        (RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for recv operation"), True),
        (RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 15000ms for send operation"), True),
        (RuntimeError("Application timeout caused pair closure"), True),  # seen on a node cut off mid-fit
        # A dead peer: gloo names it, and the launcher is stopping everyone; asking around would only delay that.
        (RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [198.18.0.2]:5712"), False),
        (KeyError("no weights for this dataset"), False),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    ],
)
def test_only_a_collective_timeout_asks_who_is_lost(error, timed_out):
    assert is_collective_timeout(error) is timed_out
