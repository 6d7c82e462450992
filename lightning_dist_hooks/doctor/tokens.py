"""The doctor's tokens: an empty file each rank leaves next to the rendezvous file.

A rendezvous directory that is node-local (``/tmp`` on every node) looks the same by name on every node, yet the
ranks of one node never see the others' files. Each rank leaving a token and counting the tokens it sees tells the
two apart: a rank that cannot see some tokens is looking at a different directory (``checks.check_tokens``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from lightning_dist_hooks.init_methods._shared_filesystem.private_files import private_directory_name

_PREFIX = ".ldh-doctor-"


def token_path(file: Path, rank: int) -> Path:
    """Where ``rank`` leaves its token for the rendezvous file ``file``: hidden, beside it.

    >>> token_path(Path("/shared/rdzv"), 3)
    PosixPath('/shared/.ldh-doctor-rdzv.rank3')
    """
    return file.with_name(f"{_PREFIX}{file.name}.rank{rank}")


def leave_token(file: Path, rank: int) -> Path:
    """Create ``rank``'s token beside ``file`` (readable by this user only) and return its path."""
    token = token_path(file, rank)
    token.unlink(missing_ok=True)  # a doctor run killed before its cleanup
    os.close(os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
    return token


def tokens_seen(token: Path, world_size: int) -> list[int]:
    """The ranks whose tokens this rank sees beside its own ``token``."""
    file = token.with_name(token.name[len(_PREFIX) :].rsplit(".rank", 1)[0])
    return [rank for rank in range(world_size) if token_path(file, rank).exists()]


def remove_token(token: Path) -> None:
    """Remove ``token``, and this user's private rendezvous directory with it when that leaves the directory empty.

    The rendezvous removes the directory after its own last file (``claims.remove_if_empty``); a rank that gives up
    at the timeout removes its token later than that, which would leave the directory behind.
    """
    token.unlink(missing_ok=True)
    if token.parent.name == private_directory_name():  # never the shared directory a user's own scheme names
        with contextlib.suppress(OSError):  # not empty: a peer's files or token, each removed by its owner
            os.rmdir(token.parent)
