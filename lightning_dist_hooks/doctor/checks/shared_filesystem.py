"""The rendezvous directory works as one filesystem shared by every node: file locks where needed, one directory.

``file://`` and ``dir://`` meet through files, so a node-local directory of the same name (``/tmp``) leaves each node
waiting for ranks that wrote elsewhere, and a filesystem that refuses ``flock`` stops torch's FileStore. The verdict
``file-locking`` is given before the rendezvous; ``shared-directory`` from the tokens each rank left (``tokens``),
by this rank alone when the rendezvous fails, and by every rank after it.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any, cast

from lightning_dist_hooks.doctor.checks.verdict import FAIL, OK, Verdict


def check_file_locking(directory: Path, scheme: str, needs_file_locks: bool) -> Verdict:
    """A scheme that ``needs_file_locks`` (``file://``: torch's FileStore flocks its file) needs a filesystem that has
    them, which some network filesystems refuse; one that takes none (``dir://``) does not care."""
    if not needs_file_locks:
        return Verdict("file-locking", OK, f"{scheme}:// takes no file locks, so it needs none in {directory}")
    try:
        descriptor, probe = tempfile.mkstemp(dir=directory, prefix=".ldh-doctor-lock-")
    except OSError as error:
        return Verdict(
            "file-locking",
            FAIL,
            f"cannot create a file in {directory}: {error.strerror}",
            "choose a directory you can write to",
        )
    try:
        for name, lock, unlock in (("flock", fcntl.flock, fcntl.flock), ("lockf", fcntl.lockf, fcntl.lockf)):
            try:
                lock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                unlock(descriptor, fcntl.LOCK_UN)
            except OSError as error:
                return Verdict(
                    "file-locking",
                    FAIL,
                    f"the filesystem of {directory} refuses file locks "
                    f"({name}: {os.strerror(cast(int, error.errno))}), which torch's FileStore needs",
                    f"use dir://{directory}/ instead of file:// (it needs no file locks), mount the filesystem with "
                    "locking (NFS: without 'nolock'; Lustre: -o flock), or use tcp:// / env://",
                )
    finally:
        os.close(descriptor)
        os.unlink(probe)
    return Verdict("file-locking", OK, f"file locks (flock, lockf) work in {directory}")


def check_tokens(directory: Path, seen: list[int], world_size: int) -> Verdict:
    """Each rank left a token in the rendezvous directory: those it cannot see went to another directory."""
    missing = [rank for rank in range(world_size) if rank not in seen]
    if missing:
        return Verdict(
            "shared-directory",
            FAIL,
            f"{directory} holds the doctor's tokens of ranks {seen} only: ranks {missing} never started, gave up "
            "already, or wrote theirs to a different directory of that name on their node",
            f"if those ranks started (see their output), {directory} is not the same directory on every node (a "
            "node-local /tmp?): use a directory on a filesystem every node mounts",
        )
    return Verdict("shared-directory", OK, f"every rank sees the same {directory}")


def check_all_tokens(directory: Path, ranks: list[dict[str, Any]]) -> Verdict:
    for rank in ranks:
        verdict = check_tokens(directory, rank["tokens_seen"], len(ranks))
        if verdict.status != OK:
            verdict.ranks = [rank["rank"]]
            return verdict
    return check_tokens(directory, list(range(len(ranks))), len(ranks))
