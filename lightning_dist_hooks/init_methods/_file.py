"""``file://``: ranks meet through a file on a filesystem they all share; nobody listens."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import stat
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, urlsplit

from lightning_dist_hooks.init_methods._base import InitMethod, Rendezvous
from lightning_dist_hooks.init_methods._private_files import (
    describe,
    open_private_directory,
    open_shared_directory,
    private_directory_name,
    private_file_problem,
    shared_directory_problem,
)
from lightning_dist_hooks.janitor import Janitor, remove_entry
from lightning_dist_hooks.launches import launch_identity, no_identity_shared_by_nodes

if TYPE_CHECKING:  # either Lightning package's; this module imports neither
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment

log = logging.getLogger(__name__)

_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_EXISTING = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
# A FileStore writes under an exclusive flock for microseconds; holding it longer means a stuck process.
_LOCK_WAIT_S = 5.0


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


class FileInitMethod(InitMethod):
    """``file:///ABSOLUTE/PATH``: ranks meet through a file on a filesystem they all share; nobody listens.

    ``file:///DIR/`` (with the trailing slash) means one file per launch inside DIR, named by
    :func:`rendezvous_file_for_job` from the launch's identity; :meth:`resolve` names it in ``Trainer(...)``
    (``ddp_spawn`` children receive the resolved URL, ``ddp`` children and externally launched ranks resolve the
    same one from the same identity). ``file:///DIR/NAME`` is the file NAME.

    **Other users.** The file is never opened in DIR itself but in this user's private directory inside it,
    ``DIR/ldh-uid-<UID>/NAME`` (see ``_private_files``): nobody else can plant, replace or read it there.

    **Leftover files.** torch's FileStore must start from a missing or empty file: one left by an earlier run
    (a crash, a kill) deadlocks or connects the wrong processes. The per-launch identity avoids reuse where the
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
    """

    scheme = "file"
    needs_file_locks = True  # torch's FileStore flocks its one file

    def shared_directory(self, url: str) -> Path | None:
        path = Path(urlsplit(url).path)
        return path if url.endswith("/") else path.parent

    def meeting_path(self, url: str) -> Path | None:
        return Path(urlsplit(url).path)

    def validate(self, url: str, parts: SplitResult) -> str:
        path = Path(parts.path)
        if parts.netloc or not path.is_absolute():
            shown = f"{parts.netloc}{parts.path}"
            raise ValueError(
                f"torch_dist_init_method={url!r}: the rendezvous file must be an absolute path, but {shown!r} is "
                "relative. Write three slashes before an absolute path, e.g. 'file:///shared/run42/rendezvous'."
            )
        per_launch = parts.path.endswith("/")
        directory = path if per_launch else path.parent
        entry = _entry_at(path)  # never followed: whatever another user planted there is not opened
        if not per_launch and entry is not None and stat.S_ISDIR(entry.st_mode):
            raise ValueError(
                f"torch_dist_init_method={url!r} names {describe(path, entry)}, not a file. For one file "
                f"per launch inside it, end the URL with a slash ('{self.scheme}://{path}/'); otherwise name a file."
            )
        if not directory.is_dir():
            raise ValueError(
                f"torch_dist_init_method={url!r}: the directory {str(directory)!r} does not exist. "
                "Create it on a filesystem every node shares, or name another one."
            )
        problem = shared_directory_problem(directory)
        if problem is not None:
            raise ValueError(f"torch_dist_init_method={url!r}: {problem}")
        if not _can_create_files_in(directory):
            raise ValueError(
                f"torch_dist_init_method={url!r}: the directory {str(directory)!r} is not writable by this user, "
                "so the rendezvous file cannot be created there. Choose a directory you can write to."
            )
        return f"{self.scheme}://{path}/" if per_launch else f"{self.scheme}://{path}"

    def resolve(self, url: str, cluster_environment: ClusterEnvironment, num_nodes: int) -> str:
        if not url.endswith("/"):
            return url
        directory = urlsplit(url).path
        identity = launch_identity(cluster_environment)
        if identity is None:
            raise ValueError(
                f"torch_dist_init_method={url!r}: {type(cluster_environment).__name__} names no job to call the "
                "rendezvous file after, so the ranks could not agree on one without talking to each other. Name a "
                f"file unique to this run instead, e.g. '{self.scheme}://{directory}run42' (a per-job file needs "
                "SLURM, Flux, LSF, PBS, torchrun, OpenMPI's mpirun, or Lightning's own launcher)."
            )
        reason = no_identity_shared_by_nodes(cluster_environment, num_nodes)
        if reason is not None:
            raise ValueError(
                f"torch_dist_init_method={url!r} with num_nodes={num_nodes}: {reason}, so the nodes would each wait "
                f"for their own rendezvous file until the timeout. Name a file unique to this run instead, e.g. "
                f"'{self.scheme}://{directory}run42' (the same on every node), or launch with a launcher that names "
                "the job on every node (srun, torchrun --rdzv-id, mpirun)."
            )
        return rendezvous_file_for_job(url, identity)

    def location(self, url: str) -> str:
        """``file:///DIR/NAME`` is used as ``DIR/ldh-uid-<UID>/NAME``; a per-launch ``file:///DIR/`` not yet named
        stays as it is.

        >>> FileInitMethod().location("file:///shared/run42").startswith("file:///shared/ldh-uid-")
        True
        """
        if url.endswith("/"):
            return url
        return f"{self.scheme}://{_private_path(Path(urlsplit(url).path))}"

    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> FileRendezvous:
        requested = Path(urlsplit(url).path)
        rank = cluster_environment.global_rank()
        shared_fd, problem = open_shared_directory(requested.parent)
        if problem is not None:
            raise RuntimeError(f"torch_dist_init_method={url!r}: {problem}")
        directory_fd, problem = open_private_directory(shared_fd, requested.parent)
        if problem is not None:
            os.close(shared_fd)
            raise RuntimeError(f"torch_dist_init_method={url!r}: {problem}")
        path = _private_path(requested)
        directory = path.parent
        rendezvous = FileRendezvous(
            f"{self.scheme}://{path}",
            file=path,
            claim=directory / _claim_name(requested.name, rank),
            shared_fd=shared_fd,
            directory_fd=directory_fd,
            # Started before anything is created, so that nothing created can outlive a killed rank.
            janitor=Janitor(directory_fd, shared_fd, directory.name),
        )
        try:
            claim_fd = self._claim(url, rendezvous, rank)
            try:
                file_fd = _create_or_join(self, url, rendezvous, rank, cluster_environment.world_size(), claim_fd)
                try:
                    rendezvous.own(path.name, file_fd)
                finally:
                    os.close(file_fd)
            finally:
                os.close(claim_fd)
        except BaseException:
            self.finish(rendezvous)
            raise
        return rendezvous

    def _claim(self, url: str, rendezvous: FileRendezvous, rank: int) -> int:
        name = rendezvous.claim.name
        try:
            descriptor = os.open(name, _CREATE | os.O_RDWR, 0o600, dir_fd=rendezvous.directory_fd)
        except FileExistsError:
            descriptor = _take_over_stale_claim(url, rendezvous, rank)
        rendezvous.own(name, descriptor)
        return descriptor

    def fill_draft(self, rendezvous: FileRendezvous, draft_fd: int) -> None:
        """Write what the rendezvous file starts with into the draft, before it can appear under its name (a
        FileStore starts from an empty file: nothing)."""

    def draft_lost(self, rendezvous: FileRendezvous, draft_fd: int) -> None:
        """Undo :meth:`fill_draft` when a peer's draft became the rendezvous file instead of this rank's."""

    def content_problem(self, rendezvous: FileRendezvous, descriptor: int) -> str | None:
        """Why the rendezvous file a peer made, open as ``descriptor``, cannot be used; None if it can."""
        problem = _filestore_log_problem(descriptor)
        return None if problem is None else f"{rendezvous.file} {problem}"

    def waiting_for(self, rendezvous: Rendezvous, world_size: int) -> list[int] | None:
        assert isinstance(rendezvous, FileRendezvous)
        try:
            file = os.stat(rendezvous.file.name, dir_fd=rendezvous.directory_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return [
            rank
            for rank in range(world_size)
            if _claimed_identity(rendezvous, _claim_name(rendezvous.file.name, rank)) != _identity(file)
        ]

    def missing_ranks(self, rendezvous: Rendezvous, world_size: int, error: Exception) -> str:
        missing = self.waiting_for(rendezvous, world_size)
        if missing is None:
            return f"no rank is using {rendezvous.init_method} any more"
        return f"ranks that never arrived: {missing}"

    def finish(self, rendezvous: Rendezvous) -> None:
        """Remove this rank's files, each on its own (a failure is reported, the others are still removed)."""
        assert isinstance(rendezvous, FileRendezvous)
        failures = []
        # Newest first: the file before its claim (see the class docstring). Every rank removes the file after
        # destroying its own group. A FileStore recreates a missing file only from inside its destructor, which
        # the destroy has already run; a peer's destructor may recreate it (mode 0644, but inside the private
        # directory), which is why that peer removes it by name too.
        for name in reversed(rendezvous.owned):
            try:
                remove_entry(rendezvous.directory_fd, name)
            except FileNotFoundError:
                pass
            except OSError as error:
                failures.append(f"{rendezvous.file.parent / name}: {error.strerror}")
        _remove_if_empty(rendezvous)
        os.close(rendezvous.directory_fd)
        os.close(rendezvous.shared_fd)
        if rendezvous.janitor is not None:
            rendezvous.janitor.dismiss()
        if failures:
            log.warning("could not remove the rendezvous files %s; remove them by hand", "; ".join(failures))


def rendezvous_file_for_job(directory_url: str, identity: str) -> str:
    """``file:///DIR/ldh-rendezvous-<identity>``: the identity made a file name, plus a hash of it.

    >>> rendezvous_file_for_job("file:///shared/rdzv/", "SLURM_JOB_ID=42,SLURM_STEP_ID=0")
    'file:///shared/rdzv/ldh-rendezvous-SLURM_JOB_ID-42-SLURM_STEP_ID-0-a03f6c3c'
    """
    readable = re.sub(r"[^A-Za-z0-9_.]+", "-", identity)[:150]
    # Two identities that differ only in characters a file name cannot hold stay apart.
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    return f"{directory_url}ldh-rendezvous-{readable}-{digest}"


def _can_create_files_in(directory: Path) -> bool:
    # A real probe file, not os.access: access() says yes to root everywhere, and knows nothing of
    # read-only mounts or quotas on a shared filesystem. mkstemp opens with O_EXCL|O_NOFOLLOW.
    try:
        descriptor, probe = tempfile.mkstemp(dir=directory, prefix=".lightning-dist-hooks-probe-")
    except OSError:
        return False
    os.close(descriptor)
    os.unlink(probe)
    return True


def _entry_at(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _claim_name(file_name: str, rank: int) -> str:
    return f"{file_name}.rank{rank}.claim"


def _draft_name(file_name: str, rank: int) -> str:
    return f"{file_name}.rank{rank}.draft"


def _identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def _record_identity(claim_fd: int, file: os.stat_result) -> None:
    # Written over the old record, then cut to length: a reader never finds the claim empty in between.
    record = f"{file.st_dev} {file.st_ino}\n".encode()
    os.pwrite(claim_fd, record, 0)
    os.ftruncate(claim_fd, len(record))


def _claimed_identity(rendezvous: FileRendezvous, claim_name: str) -> tuple[int, int] | None:
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


def _take_over_stale_claim(url: str, rendezvous: FileRendezvous, rank: int) -> int:
    descriptor = os.open(rendezvous.claim.name, _OPEN_EXISTING, dir_fd=rendezvous.directory_fd)
    problem = private_file_problem(rendezvous.claim, os.fstat(descriptor))
    if problem is not None:
        os.close(descriptor)
        raise RuntimeError(f"torch_dist_init_method={url!r}: {problem}")
    claimed = _claimed_identity(rendezvous, rendezvous.claim.name)
    try:
        current = _identity(os.stat(rendezvous.file.name, dir_fd=rendezvous.directory_fd, follow_symlinks=False))
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


def _create_or_join(
    handler: FileInitMethod, url: str, rendezvous: FileRendezvous, rank: int, world_size: int, claim_fd: int
) -> int:
    """Make the rendezvous file, or join the one a peer made; either way this rank's claim records it after.

    The maker's claim is written once, before the file appears, and never again: peers joining at any moment
    must find it whole.
    """
    name, directory_fd = rendezvous.file.name, rendezvous.directory_fd
    draft = _draft_name(name, rank)
    try:
        draft_fd = os.open(draft, _CREATE | os.O_RDWR, 0o600, dir_fd=directory_fd)
    except FileExistsError:  # a draft of an earlier holder of rank R, whose claim this rank holds now: no one's
        os.unlink(draft, dir_fd=directory_fd)
        draft_fd = os.open(draft, _CREATE | os.O_RDWR, 0o600, dir_fd=directory_fd)
    rendezvous.own(draft, draft_fd)
    handler.fill_draft(rendezvous, draft_fd)
    # Recorded, and on a network filesystem flushed to where other nodes read it, before the file can be seen.
    _record_identity(claim_fd, os.fstat(draft_fd))
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
    descriptor = _join_existing(handler, url, rendezvous, world_size)
    _record_identity(claim_fd, os.fstat(descriptor))
    return descriptor


def _join_existing(handler: FileInitMethod, url: str, rendezvous: FileRendezvous, world_size: int) -> int:
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
        recorded_by = _rank_recording(rendezvous, world_size, _identity(status))
        links = 1
        if recorded_by is not None and status.st_nlink == 2:
            # Until its maker removes the draft name, the file has that second link, and only that one. (The claim
            # found first may be a joiner's, so which rank made the file is not known: any rank's draft name may be.)
            if any(_is_draft_of(rendezvous, rank, status) for rank in range(world_size)):
                links = 2
            else:  # the maker removed the draft name since the fstat above: look again
                status = os.fstat(descriptor)
        problem = private_file_problem(rendezvous.file, status, links=links)
        if problem is None:
            problem = handler.content_problem(rendezvous, descriptor)
        if problem is None and recorded_by is None:
            problem = _made_by_no_rank(rendezvous.file, world_size)
    except BaseException:
        os.close(descriptor)
        raise
    if problem is not None:
        os.close(descriptor)
        raise RuntimeError(f"torch_dist_init_method={url!r}: {problem}")
    return descriptor


def _made_by_no_rank(path: Path, world_size: int) -> str:
    return (
        f"{path} exists, but no rank of this run made it: none of {path}.rank0.claim to "
        f".rank{world_size - 1}.claim records it, as the claim of the rank that makes the file does before the file "
        "appears. It was left by an earlier run that did not finish cleanly (or made by something else), and a "
        "reused rendezvous file deadlocks or connects the wrong processes, so this run stops. Once no run uses it, "
        f"remove {path} (and any {path}.rank*.claim), then start again."
    )


def _rank_recording(rendezvous: FileRendezvous, world_size: int, identity: tuple[int, int]) -> int | None:
    """The rank of this launch whose claim records the file with ``identity``, or None."""
    for rank in range(world_size):
        if _claimed_identity(rendezvous, _claim_name(rendezvous.file.name, rank)) == identity:
            return rank
    return None


def _is_draft_of(rendezvous: FileRendezvous, rank: int, status: os.stat_result) -> bool:
    try:
        draft = os.stat(_draft_name(rendezvous.file.name, rank), dir_fd=rendezvous.directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return _identity(draft) == _identity(status)


def _filestore_log_problem(descriptor: int) -> str | None:
    """Why the file is not a log torch's FileStore can read, or None.

    A FileStore file is a sequence of (key, value) records, each string a 4-byte length and its bytes, appended
    under an exclusive ``flock``. torch trusts the lengths: junk makes it read a huge length and loop forever while
    holding the lock. So the whole file is parsed here first, under a shared lock (as FileStore's own readers).
    """
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                return (
                    f"has been locked by another process for over {_LOCK_WAIT_S:g} s (a stuck rank of an earlier "
                    "run?). Stop that process, remove the file, then start again."
                )
            time.sleep(0.01)
    try:
        content = os.pread(descriptor, os.fstat(descriptor).st_size, 0)
    finally:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
    position, strings = 0, 0
    while position < len(content):
        if position + 4 > len(content):
            return _not_a_log(len(content), f"a record length at byte {position} is cut off")
        (length,) = struct.unpack_from("=I", content, position)
        position += 4 + length
        if position > len(content):
            return _not_a_log(len(content), f"a record at byte {position - 4 - length} claims {length} bytes")
        strings += 1
    if strings % 2:
        return _not_a_log(len(content), "it ends with a key that has no value")
    return None


def _not_a_log(size: int, detail: str) -> str:
    return (
        f"is not a torch FileStore log ({detail}; the file has {size} bytes): it is corrupted or was never "
        "one, and torch would hang reading it. Remove it, then start again."
    )


def _remove_if_empty(rendezvous: FileRendezvous) -> None:
    """Remove the private directory when this was its last file, so that a clean run leaves DIR as it was."""
    directory = os.fstat(rendezvous.directory_fd)
    name = rendezvous.file.parent.name
    try:
        current = os.stat(name, dir_fd=rendezvous.shared_fd, follow_symlinks=False)
        if stat.S_ISDIR(current.st_mode) and _identity(current) == _identity(directory):
            os.rmdir(name, dir_fd=rendezvous.shared_fd)
    except OSError:
        pass  # gone already, or another rank or run of this user still has files in it


def _private_path(requested: Path) -> Path:
    """``DIR/NAME`` moved into this user's private directory: ``DIR/ldh-uid-<UID>/NAME``."""
    return requested.parent / private_directory_name() / requested.name
