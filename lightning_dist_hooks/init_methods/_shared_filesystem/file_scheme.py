"""``file://``: ranks meet through a file on a filesystem they all share; nobody listens."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, urlsplit

from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.init_methods._base import InitMethod, Rendezvous, RendezvousDiagnostics
from lightning_dist_hooks.init_methods._shared_filesystem.claims import (
    FileRendezvous,
    claim,
    claim_name,
    claimed_identity,
    create_or_join,
    file_identity,
    remove_if_empty,
)
from lightning_dist_hooks.init_methods._shared_filesystem.filestore_log import filestore_log_problem
from lightning_dist_hooks.init_methods._shared_filesystem.janitor import Janitor, remove_entry
from lightning_dist_hooks.init_methods._shared_filesystem.launches import launch_identity, no_identity_shared_by_nodes
from lightning_dist_hooks.init_methods._shared_filesystem.private_files import (
    describe,
    open_private_directory,
    open_shared_directory,
    private_directory_name,
    shared_directory_problem,
)

if TYPE_CHECKING:  # either Lightning package's; this module imports neither
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment

log = logging.getLogger(__name__)

_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_EXISTING = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
# How the name of a per-launch file (``file:///DIR/`` resolved) begins.
_PER_LAUNCH_PREFIX = "ldh-rendezvous-"


class FileInitMethod(InitMethod, RendezvousDiagnostics):
    """``file:///ABSOLUTE/PATH``: ranks meet through a file on a filesystem they all share; nobody listens.

    ``file:///DIR/`` (with the trailing slash) means one file per launch inside DIR, named by
    :func:`rendezvous_file_for_job` from the launch's identity; :meth:`resolve` names it in ``Trainer(...)``
    (``ddp_spawn`` children receive the resolved URL, ``ddp`` children and externally launched ranks resolve the
    same one from the same identity). ``file:///DIR/NAME`` is the file NAME.

    **Other users.** The file is never opened in DIR itself but in this user's private directory inside it,
    ``DIR/ldh-uid-<UID>/NAME`` (see ``private_files``): nobody else can plant, replace or read it there.

    **Leftover files.** torch's FileStore must start from a missing or empty file, and a file left by an
    earlier run is never used: every rank claims its rank and makes or joins the file as ``claims`` describes.

    **Filesystems without locks.** FileStore ``flock``s its file, which some network filesystems refuse (NFS with
    ``nolock``, Lustre without ``-o flock``). Each rank first locks a probe file of its own in the private directory
    and, where that fails, stops at once naming ``dir://`` (:func:`file_locks_refused`), instead of torch's bare
    ``No locks available`` later. ``dir://`` (a subclass taking no locks) skips the probe.
    """

    scheme = "file"
    form = (
        '``"file:///PATH"`` or ``"file:///DIR/"`` (a file on a filesystem all ranks share, locked with flock; with '
        "the slash, one file per launch inside DIR, named from the job identity, ``ValueError`` when the launcher "
        "gives none)"
    )
    needs_file_locks = True  # torch's FileStore flocks its one file; prepare probes that flock works

    @override
    def shared_directory(self, url: str) -> Path | None:
        path = Path(urlsplit(url).path)
        return path if url.endswith("/") else path.parent

    @override
    def meeting_path(self, url: str) -> Path | None:
        return Path(urlsplit(url).path)

    @override
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

    @override
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

    @override
    def location(self, url: str) -> str:
        """``file:///DIR/NAME`` is used as ``DIR/ldh-uid-<UID>/NAME``; a per-launch ``file:///DIR/`` not yet named
        stays as it is.

        >>> FileInitMethod().location("file:///shared/run42").startswith("file:///shared/ldh-uid-")
        True
        """
        if url.endswith("/"):
            return url
        return f"{self.scheme}://{_private_path(Path(urlsplit(url).path))}"

    @override
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
            claim=directory / claim_name(requested.name, rank),
            shared_fd=shared_fd,
            directory_fd=directory_fd,
            # Started before anything is created, so that nothing created can outlive a killed rank.
            janitor=Janitor(directory_fd, shared_fd, directory.name),
        )
        try:
            if self.needs_file_locks:
                self._check_file_locks(url, rendezvous, rank)
            claim_fd = claim(url, rendezvous, rank)
            try:
                file_fd = create_or_join(self, url, rendezvous, rank, cluster_environment.world_size(), claim_fd)
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

    def _check_file_locks(self, url: str, rendezvous: FileRendezvous, rank: int) -> None:
        """Raise, naming ``dir://``, where the private directory's filesystem refuses ``flock``, which torch's
        FileStore takes on the rendezvous file: otherwise torch fails later with a bare ``No locks available``.

        A probe file of this rank's own in the private directory, locked and unlocked once; the janitor removes it
        should the rank be killed meanwhile.
        """
        probe = f"{rendezvous.file.name}.rank{rank}.lock-probe.{secrets.token_hex(4)}"
        descriptor = os.open(probe, _CREATE | os.O_RDWR, 0o600, dir_fd=rendezvous.directory_fd)
        try:
            rendezvous.own(probe, descriptor)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(descriptor, fcntl.LOCK_UN)
            except OSError as error:
                if error.errno != errno.EWOULDBLOCK:  # EWOULDBLOCK: locked by another, so locks work
                    raise RuntimeError(file_locks_refused(url, rendezvous.file.parent, error)) from None
        finally:
            os.close(descriptor)
            try:
                os.unlink(probe, dir_fd=rendezvous.directory_fd)
            except OSError:
                pass  # it is owned: finish (or the janitor) removes it

    def fill_draft(self, rendezvous: FileRendezvous, draft_fd: int) -> None:
        """Write what the rendezvous file starts with into the draft, before it can appear under its name (a
        FileStore starts from an empty file: nothing)."""

    def draft_lost(self, rendezvous: FileRendezvous, draft_fd: int) -> None:
        """Undo :meth:`fill_draft` when a peer's draft became the rendezvous file instead of this rank's."""

    def content_problem(self, rendezvous: FileRendezvous, descriptor: int) -> str | None:
        """Why the rendezvous file a peer made, open as ``descriptor``, cannot be used; None if it can."""
        problem = filestore_log_problem(descriptor)
        return None if problem is None else f"{rendezvous.file} {problem}"

    @override
    def waiting_for(self, rendezvous: Rendezvous, world_size: int) -> list[int] | None:
        assert isinstance(rendezvous, FileRendezvous)
        try:
            file = os.stat(rendezvous.file.name, dir_fd=rendezvous.directory_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return [
            rank
            for rank in range(world_size)
            if claimed_identity(rendezvous, claim_name(rendezvous.file.name, rank)) != file_identity(file)
        ]

    @override
    def missing_ranks(self, rendezvous: Rendezvous, world_size: int, error: Exception) -> str:
        missing = self.waiting_for(rendezvous, world_size)
        if missing is None:
            return f"no rank is using {rendezvous.init_method} any more"
        return f"ranks that never arrived: {missing}"

    @override
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
        remove_if_empty(rendezvous)
        os.close(rendezvous.directory_fd)
        os.close(rendezvous.shared_fd)
        if rendezvous.janitor is not None:
            rendezvous.janitor.dismiss()
        if failures:
            log.warning("could not remove the rendezvous files %s; remove them by hand", "; ".join(failures))


def file_locks_refused(url: str, directory: Path, error: OSError) -> str:
    """The error for a ``file://`` rendezvous whose directory refuses ``flock``: the fix is ``dir://``.

    >>> print(file_locks_refused("file:///shared/rdzv/run42", Path("/shared/rdzv/ldh-uid-1000"),
    ...                          OSError(errno.ENOLCK, "No locks available")))  # doctest: +NORMALIZE_WHITESPACE
    torch_dist_init_method='file:///shared/rdzv/run42': the filesystem of /shared/rdzv/ldh-uid-1000 refuses file
    locks (flock: No locks available), which torch's FileStore takes on the rendezvous file. Use
    torch_dist_init_method='dir:///shared/rdzv/run42' instead: the same rendezvous, through a directory of one file
    per key, with no file locks. Or mount the filesystem with locking (NFS: without 'nolock'; Lustre: -o flock), or
    use tcp:// or env://.
    """
    path = urlsplit(url).path
    name = Path(path).name
    # A per-launch file (file:///DIR/ resolved): the fix is the per-launch URL, not this launch's name.
    fixed = f"dir://{Path(path).parent}/" if name.startswith(_PER_LAUNCH_PREFIX) else f"dir://{path}"
    reason = error.strerror or os.strerror(error.errno or 0)
    return (
        f"torch_dist_init_method={url!r}: the filesystem of {directory} refuses file locks (flock: {reason}), "
        f"which torch's FileStore takes on the rendezvous file. Use torch_dist_init_method={fixed!r} instead: the "
        "same rendezvous, through a directory of one file per key, with no file locks. Or mount the filesystem with "
        "locking (NFS: without 'nolock'; Lustre: -o flock), or use tcp:// or env://."
    )


def rendezvous_file_for_job(directory_url: str, identity: str) -> str:
    """``file:///DIR/ldh-rendezvous-<identity>``: the identity made a file name, plus a hash of it.

    >>> rendezvous_file_for_job("file:///shared/rdzv/", "SLURM_JOB_ID=42,SLURM_STEP_ID=0")
    'file:///shared/rdzv/ldh-rendezvous-SLURM_JOB_ID-42-SLURM_STEP_ID-0-a03f6c3c'
    """
    readable = re.sub(r"[^A-Za-z0-9_.]+", "-", identity)[:150]
    # Two identities that differ only in characters a file name cannot hold stay apart.
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    return f"{directory_url}{_PER_LAUNCH_PREFIX}{readable}-{digest}"


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


def _private_path(requested: Path) -> Path:
    """``DIR/NAME`` moved into this user's private directory: ``DIR/ldh-uid-<UID>/NAME``."""
    return requested.parent / private_directory_name() / requested.name
