"""How the ranks of one launch make, or join, the one file they meet through, and never use one an earlier run left.

A rendezvous file must be this launch's: one left by an earlier run (a crash, a kill) deadlocks torch's
FileStore or connects the wrong processes. The per-launch identity avoids reuse where the
launcher names each launch (a SLURM requeue has a new restart count, torchrun a new restart count, Flux a
new job id, ``ddp`` a new token). Where an identity can repeat (several ``mpiexec`` in one PBS job, torchrun
without ``--rdzv-id``, an explicit path), what is on disk says which run a file belongs to:

* each rank first claims its rank by creating ``NAME.rank<R>.claim`` with O_EXCL, and removes the claim only
  after removing the file at exit;
* the rank that makes the file creates it as a draft, ``NAME.rank<R>.draft``, records the draft's identity
  (device and inode) in its claim, and only then links it to NAME (``link`` fails if NAME exists: one rank
  wins) and removes the draft name. So from the moment NAME exists, a claim of this launch records it;
* a rank that finds NAME existing uses it only if the claim of some rank of this launch records it (while
  its creator's draft name is still there, with two links), and then records it in its own claim.

So, judged by which file the claims name and never by when anything happened:

* a file that no claim records was not made by this launch: it is an earlier run's (its claims gone), or
  made by something else, and every rank stops at once with an error naming it (nothing is deleted
  automatically). A stale but valid FileStore log is caught here, before torch reads it;
* a claim for rank R that already exists was made by another process holding rank R: never by a peer of this
  launch, which has exactly one rank R. If it records the file that exists now, that file is the earlier
  run's, and this rank stops with an error naming both. Otherwise (no file, another file, or an empty claim)
  the earlier holder of rank R never used this file, and the old claim is emptied and taken over.

Every rank that took part in the earlier run finds its claim and stops at once instead of deadlocking; the
launchers here (mpirun, srun, torchrun) then stop the other ranks. (A new file that reuses the inode number of
an earlier run's removed file looks like that file: an error asking to remove it, never a wrong connection.)

The file's first content and the check of a file a peer made are the handler's (:class:`DraftHooks`): ``file://``
makes an empty FileStore log, ``dir://`` a pointer to its store directory.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lightning_dist_hooks.init_methods._base import Rendezvous
from lightning_dist_hooks.init_methods._shared_filesystem.janitor import Janitor
from lightning_dist_hooks.init_methods._shared_filesystem.private_files import private_file_problem

_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_EXISTING = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FileRendezvous(Rendezvous):
    """A ``file://`` rendezvous on one rank: the file, this rank's claim on it, and what removes them."""

    file: Path = Path()
    claim: Path = Path()
    shared_fd: int = -1
    directory_fd: int = -1
    janitor: Janitor | None = None
    # Names in the private directory this rank created or took over, oldest first: what ``finish`` removes.
    owned: list[str] = field(default_factory=list)

    def own(self, name: str, descriptor: int) -> None:
        if self.janitor is not None:
            self.janitor.watch(name, descriptor)
        self.owned.append(name)


class DraftHooks(Protocol):
    """What a handler decides about the file: what it starts with, and whether a peer's can be used."""

    def fill_draft(self, rendezvous: FileRendezvous, draft_fd: int) -> None: ...

    def draft_lost(self, rendezvous: FileRendezvous, draft_fd: int) -> None: ...

    def content_problem(self, rendezvous: FileRendezvous, descriptor: int) -> str | None: ...


def claim(url: str, rendezvous: FileRendezvous, rank: int) -> int:
    """Create this rank's claim (or take over a stale one); return it open, recording nothing yet."""
    name = rendezvous.claim.name
    try:
        descriptor = os.open(name, _CREATE | os.O_RDWR, 0o600, dir_fd=rendezvous.directory_fd)
    except FileExistsError:
        descriptor = take_over_stale_claim(url, rendezvous, rank)
    rendezvous.own(name, descriptor)
    return descriptor


def claim_name(file_name: str, rank: int) -> str:
    return f"{file_name}.rank{rank}.claim"


def draft_name(file_name: str, rank: int) -> str:
    return f"{file_name}.rank{rank}.draft"


def file_identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def record_identity(claim_fd: int, file: os.stat_result) -> None:
    # Written over the old record, then cut to length: a reader never finds the claim empty in between.
    record = f"{file.st_dev} {file.st_ino}\n".encode()
    os.pwrite(claim_fd, record, 0)
    os.ftruncate(claim_fd, len(record))


def claimed_identity(rendezvous: FileRendezvous, claim_name: str) -> tuple[int, int] | None:
    """The identity of the file a claim records, or None (no claim, or its rank died before opening a file)."""
    try:
        descriptor = os.open(claim_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=rendezvous.directory_fd)
    except OSError:
        return None
    try:
        fields = os.read(descriptor, 64).split()
    finally:
        os.close(descriptor)
    return (int(fields[0]), int(fields[1])) if len(fields) == 2 and all(f.isdigit() for f in fields) else None


def take_over_stale_claim(url: str, rendezvous: FileRendezvous, rank: int) -> int:
    descriptor = os.open(rendezvous.claim.name, _OPEN_EXISTING, dir_fd=rendezvous.directory_fd)
    problem = private_file_problem(rendezvous.claim, os.fstat(descriptor))
    if problem is not None:
        os.close(descriptor)
        raise RuntimeError(f"torch_dist_init_method={url!r}: {problem}")
    claimed = claimed_identity(rendezvous, rendezvous.claim.name)
    try:
        current = file_identity(os.stat(rendezvous.file.name, dir_fd=rendezvous.directory_fd, follow_symlinks=False))
    except FileNotFoundError:
        current = None
    if claimed is not None and claimed == current:
        os.close(descriptor)
        path, claim = rendezvous.file, rendezvous.claim
        raise RuntimeError(
            f"torch_dist_init_method={url!r}: rank {rank} found {claim} and {path} left by an earlier run with "
            "the same job identity that did not finish cleanly (or another run with this identity is using "
            "them now). A reused rendezvous file deadlocks or connects the wrong processes, so this run stops. "
            f"Once no run uses them, remove {path} and {path}.rank*.claim, then start again."
        )
    os.ftruncate(descriptor, 0)  # it records nothing until this rank records its own file
    return descriptor


def create_or_join(
    handler: DraftHooks, url: str, rendezvous: FileRendezvous, rank: int, world_size: int, claim_fd: int
) -> int:
    """Make the rendezvous file, or join the one a peer made; either way this rank's claim records it after.

    The maker's claim is written once, before the file appears, and never again: peers joining at any moment
    must find it whole.
    """
    name, directory_fd = rendezvous.file.name, rendezvous.directory_fd
    draft = draft_name(name, rank)
    try:
        draft_fd = os.open(draft, _CREATE | os.O_RDWR, 0o600, dir_fd=directory_fd)
    except FileExistsError:  # a draft of an earlier holder of rank R, whose claim this rank holds now: no one's
        os.unlink(draft, dir_fd=directory_fd)
        draft_fd = os.open(draft, _CREATE | os.O_RDWR, 0o600, dir_fd=directory_fd)
    rendezvous.own(draft, draft_fd)
    handler.fill_draft(rendezvous, draft_fd)
    # Recorded, and on a network filesystem flushed to where other nodes read it, before the file can be seen.
    record_identity(claim_fd, os.fstat(draft_fd))
    os.fsync(claim_fd)
    try:
        os.link(draft, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd, follow_symlinks=False)
        created = True
    except FileExistsError:
        created = False
    os.unlink(draft, dir_fd=directory_fd)
    if created:
        return draft_fd
    handler.draft_lost(rendezvous, draft_fd)
    os.close(draft_fd)
    descriptor = join_existing(handler, url, rendezvous, world_size)
    record_identity(claim_fd, os.fstat(descriptor))
    return descriptor


def join_existing(handler: DraftHooks, url: str, rendezvous: FileRendezvous, world_size: int) -> int:
    """Open the file at the rendezvous name, after checking it is ours, this launch's, and what its maker writes."""
    name = rendezvous.file.name
    try:
        descriptor = os.open(name, _OPEN_EXISTING | os.O_NONBLOCK, dir_fd=rendezvous.directory_fd)
    except OSError as error:
        status = os.stat(name, dir_fd=rendezvous.directory_fd, follow_symlinks=False)
        raise RuntimeError(
            f"torch_dist_init_method={url!r}: {private_file_problem(rendezvous.file, status) or error.strerror}"
        ) from None
    try:
        status = os.fstat(descriptor)
        recorded_by = rank_recording(rendezvous, world_size, file_identity(status))
        links = 1
        if recorded_by is not None and status.st_nlink == 2:
            # Until its maker removes the draft name, the file has that second link, and only that one. (The claim
            # found first may be a joiner's, so which rank made the file is not known: any rank's draft name may be.)
            if any(is_draft_of(rendezvous, rank, status) for rank in range(world_size)):
                links = 2
            else:  # the maker removed the draft name since the fstat above: look again
                status = os.fstat(descriptor)
        problem = private_file_problem(rendezvous.file, status, links=links)
        if problem is None:
            problem = handler.content_problem(rendezvous, descriptor)
        if problem is None and recorded_by is None:
            problem = made_by_no_rank(rendezvous.file, world_size)
    except BaseException:
        os.close(descriptor)
        raise
    if problem is not None:
        os.close(descriptor)
        raise RuntimeError(f"torch_dist_init_method={url!r}: {problem}")
    return descriptor


def made_by_no_rank(path: Path, world_size: int) -> str:
    return (
        f"{path} exists, but no rank of this run made it: none of {path}.rank0.claim to "
        f".rank{world_size - 1}.claim records it, as the claim of the rank that makes the file does before the file "
        "appears. It was left by an earlier run that did not finish cleanly (or made by something else), and a "
        "reused rendezvous file deadlocks or connects the wrong processes, so this run stops. Once no run uses it, "
        f"remove {path} (and any {path}.rank*.claim), then start again."
    )


def rank_recording(rendezvous: FileRendezvous, world_size: int, identity: tuple[int, int]) -> int | None:
    """The rank of this launch whose claim records the file with ``identity``, or None."""
    for rank in range(world_size):
        if claimed_identity(rendezvous, claim_name(rendezvous.file.name, rank)) == identity:
            return rank
    return None


def is_draft_of(rendezvous: FileRendezvous, rank: int, status: os.stat_result) -> bool:
    try:
        draft = os.stat(draft_name(rendezvous.file.name, rank), dir_fd=rendezvous.directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return file_identity(draft) == file_identity(status)


def remove_if_empty(rendezvous: FileRendezvous) -> None:
    """Remove the private directory when this was its last file, so that a clean run leaves DIR as it was."""
    directory = os.fstat(rendezvous.directory_fd)
    name = rendezvous.file.parent.name
    try:
        current = os.stat(name, dir_fd=rendezvous.shared_fd, follow_symlinks=False)
        if stat.S_ISDIR(current.st_mode) and file_identity(current) == file_identity(directory):
            os.rmdir(name, dir_fd=rendezvous.shared_fd)
    except OSError:
        pass  # gone already, or another rank or run of this user still has files in it
