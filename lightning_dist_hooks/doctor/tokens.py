"""The doctor's tokens: an empty file each rank leaves next to the rendezvous file.

A rendezvous directory that is node-local (``/tmp`` on every node) looks the same by name on every node, yet the
ranks of one node never see the others' files. Each rank leaving a token and counting the tokens it sees tells the
two apart: a rank that cannot see some tokens is looking at a different directory (``checks.check_tokens``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from lightning_dist_hooks.init_methods import (
    Janitor,
    open_private_directory,
    open_shared_directory,
    private_directory_name,
)

_PREFIX = ".ldh-doctor-"


def token_path(file: Path, rank: int) -> Path:
    """Where ``rank`` leaves its token for the rendezvous file ``file``: hidden, beside it.

    >>> token_path(Path("/shared/rdzv"), 3)
    PosixPath('/shared/.ldh-doctor-rdzv.rank3')
    """
    return file.with_name(f"{_PREFIX}{file.name}.rank{rank}")


class Token:
    """One rank's token, removed by :meth:`remove`, or by a janitor should the rank be killed before that.

    Lightning's launcher SIGKILLs its main process within seconds of a child rank's failure, so a rank 0 whose
    child gave up at the timeout first never reached :meth:`remove`. In this user's private directory a janitor
    (the one the rendezvous files have) removes the token then, and the directory if that leaves it empty. A token
    elsewhere (beside the file of a user's own scheme) has none: the next doctor run in that directory replaces it.
    """

    def __init__(self, file: Path, rank: int) -> None:
        """Create ``rank``'s token beside the rendezvous file ``file``, readable by this user only."""
        self.path = token_path(file, rank)
        self.path.unlink(missing_ok=True)  # a doctor run killed before its cleanup
        # Started before the token exists, so that the token cannot outlive a killed rank.
        self._janitor = _janitor_of(self.path.parent) if self._in_private_directory else None
        descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if self._janitor is not None:
                self._janitor.watch(self.path.name, descriptor)
        finally:
            os.close(descriptor)

    @property
    def _in_private_directory(self) -> bool:
        return self.path.parent.name == private_directory_name()

    def seen(self, world_size: int) -> list[int]:
        """The ranks whose tokens this rank sees beside its own."""
        file = self.path.with_name(self.path.name[len(_PREFIX) :].rsplit(".rank", 1)[0])
        return [rank for rank in range(world_size) if token_path(file, rank).exists()]

    def remove(self) -> None:
        """Remove the token, and this user's private rendezvous directory with it when that leaves it empty.

        The rendezvous removes the directory after its own last file (``claims.remove_if_empty``); a rank that gives
        up at the timeout removes its token later than that, which would leave the directory behind. Safe to call
        again (the deadline's thread and the main thread may both get here).
        """
        self.path.unlink(missing_ok=True)
        if self._in_private_directory:  # never the shared directory a user's own scheme names
            with contextlib.suppress(OSError):  # not empty: a peer's files or token, each removed by its owner
                os.rmdir(self.path.parent)
        janitor, self._janitor = self._janitor, None
        if janitor is not None:
            janitor.dismiss()


def _janitor_of(private_directory: Path) -> Janitor:
    """A janitor for files in ``private_directory``, which the rendezvous has made and checked already."""
    shared_fd, problem = open_shared_directory(private_directory.parent)
    if problem is not None:
        raise RuntimeError(problem)
    try:
        directory_fd, problem = open_private_directory(shared_fd, private_directory.parent)
        if problem is not None:
            raise RuntimeError(problem)
        try:
            return Janitor(directory_fd, shared_fd, private_directory.name)  # it keeps copies of both descriptors
        finally:
            os.close(directory_fd)
    finally:
        os.close(shared_fd)
