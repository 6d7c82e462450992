"""``dir://``: ranks meet through a directory on a filesystem they all share, without file locks; nobody listens.

``file://`` hands torch a ``FileStore``: one file every rank appends to under ``flock``, which fails where a
filesystem has no ``flock`` (Lustre without ``-o flock``, NFS without a lock manager) and is unsafe where locks do
not cross nodes (Lustre's ``localflock``). ``dir://`` takes the same URLs and keeps every guarantee of ``file://``
(it is the same handler, :class:`FileInitMethod`, for all of them: private directory, per-launch names, claims,
janitor), but the file at the rendezvous name holds only the name of a directory next to it, and the ranks meet
through a :class:`DirectoryStore` in that directory: every key a file of its own, nothing ever locked.

On disk, for ``dir:///shared/rdzv/run42``, in ``/shared/rdzv/ldh-uid-<UID>/``:

* ``run42.rank<R>.claim``, ``run42.rank<R>.draft``: as for ``file://`` (see :class:`FileInitMethod`);
* ``run42``: the rendezvous file, made by one rank through the draft-and-link protocol; it holds the name of
* ``run42.<16 hex digits>.d``: the directory the store's keys are in, created (``mkdir``, mode 0700) by the rank
  that made ``run42`` before ``run42`` could appear, so a fresh one in every run: no rank ever reads an earlier
  run's keys. A rank uses it only after checking ``run42`` as ``file://`` checks its file (made by a rank of this
  launch, as the claims record) and the directory itself (a real directory of this user, mode 0700).

Every rank hands that directory to its janitor too, and removes it, with its keys, at exit.

torch learns of the store through a rendezvous handler for ``dir://`` (:meth:`DirInitMethod.torch_rendezvous_handler`,
registered with torch when the first ``dir://`` rendezvous is prepared), which hands out the store this handler
prepared in this process. So ``setup_distributed_backend`` receives a plain URL, as for every other
scheme, and passes it on: ``init_process_group(backend, init_method=init_method, ...)``.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import torch.distributed as dist
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.init_methods._base import Rendezvous
from lightning_dist_hooks.init_methods._shared_filesystem.claims import FileRendezvous, claimed_identity, file_identity
from lightning_dist_hooks.init_methods._shared_filesystem.directory_store import DirectoryStore
from lightning_dist_hooks.init_methods._shared_filesystem.file_scheme import FileInitMethod
from lightning_dist_hooks.init_methods._shared_filesystem.janitor import remove_entry
from lightning_dist_hooks.init_methods._shared_filesystem.private_files import (
    describe,
    owner_name,
    private_file_problem,
)
from lightning_dist_hooks.torch_rendezvous import RendezvousHandler

if TYPE_CHECKING:  # either Lightning package's; this module imports neither
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment

_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class DirRendezvous(FileRendezvous):
    """A ``dir://`` rendezvous on one rank: a ``file://`` one whose file names the store's directory."""

    store: DirectoryStore | None = None
    store_fd: int = -1


class DirInitMethod(FileInitMethod):
    """``dir:///ABSOLUTE/PATH`` and ``dir:///DIR/``: as ``file://`` (same URLs, names, checks), through a
    :class:`DirectoryStore` that needs no file locks instead of torch's ``FileStore``.

        Trainer(..., torch_dist_init_method="dir:///shared/rdzv/")  # one rendezvous per launch in /shared/rdzv
    """

    scheme = "dir"
    form = '``"dir:///PATH"`` or ``"dir:///DIR/"`` (as file://, through a directory of files: no file locks)'
    needs_file_locks = False  # every key a file of its own, written by rename or link: no flock anywhere

    def __init__(self) -> None:
        # The stores prepared in this process, by the path of the URL that ``setup_distributed_backend`` receives:
        # what torch's rendezvous handler hands out. (torch rewrites the URL it is given, dir:///x into dir:/x.)
        self._prepared: dict[str, DirectoryStore] = {}

    @override
    def torch_rendezvous_handler(self) -> RendezvousHandler:
        return self._hand_out_prepared_store

    @override
    def fill_draft(self, rendezvous: FileRendezvous, draft_fd: int) -> None:
        name = f"{rendezvous.file.name}.{secrets.token_hex(8)}.d"
        # umask can only take permissions away: 0700 or stricter, and every rank checks it before use.
        os.mkdir(name, 0o700, dir_fd=rendezvous.directory_fd)
        descriptor = os.open(name, _OPEN_DIRECTORY, dir_fd=rendezvous.directory_fd)
        try:
            rendezvous.own(name, descriptor)  # from now on the janitor removes it, should this rank be killed
        finally:
            os.close(descriptor)
        os.write(draft_fd, name.encode())

    @override
    def draft_lost(self, rendezvous: FileRendezvous, draft_fd: int) -> None:
        name = os.pread(draft_fd, 256, 0).decode()
        remove_entry(rendezvous.directory_fd, name)

    @override
    def content_problem(self, rendezvous: FileRendezvous, descriptor: int) -> str | None:
        content = os.pread(descriptor, 256, 0)
        if re.fullmatch(re.escape(rendezvous.file.name.encode()) + rb"\.[0-9a-f]{16}\.d", content) is None:
            return (
                f"{rendezvous.file} does not name a dir:// rendezvous directory (it holds {content[:60]!r}): it was "
                "made by something else, or is a file:// rendezvous file. Remove it, then start again."
            )
        return None

    @override
    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> DirRendezvous:
        rendezvous = super().prepare(url, cluster_environment)
        try:
            store_fd, name = _open_store_directory(url, rendezvous)
        except BaseException:
            self.finish(rendezvous)
            raise
        prepared = DirRendezvous(
            **{field.name: getattr(rendezvous, field.name) for field in fields(rendezvous)},
            store=DirectoryStore(store_fd, rendezvous.file.parent / name, world_size=cluster_environment.world_size()),
            store_fd=store_fd,
        )
        assert prepared.store is not None
        self._prepared[str(rendezvous.file)] = prepared.store
        return prepared

    @override
    def finish(self, rendezvous: Rendezvous) -> None:
        if isinstance(rendezvous, DirRendezvous):
            self._prepared.pop(str(rendezvous.file), None)
            os.close(rendezvous.store_fd)
        super().finish(rendezvous)

    def _hand_out_prepared_store(self, url: str, **kwargs: object) -> Iterator[tuple[dist.Store, int, int]]:
        """torch's rendezvous handler for ``dir://``: the store this process prepared for ``url``, rank, world size."""
        del kwargs  # the timeout: torch sets it on the store itself
        parts = urlsplit(url)
        query = {name: int(values[0]) for name, values in parse_qs(parts.query).items()}
        store = self._prepared.get(parts.path)
        if store is None:
            raise ValueError(
                f"Error initializing torch.distributed using {url}: no dir:// rendezvous was prepared for it in this "
                "process. dir:// URLs are prepared by lightning_dist_hooks' Trainer or Fabric "
                "(torch_dist_init_method='dir:///shared/rdzv/'), which pass the one to use to "
                "setup_distributed_backend: pass that init_method on unchanged."
            )
        if "rank" not in query or "world_size" not in query:
            raise ValueError(f"Error initializing torch.distributed using {url}: dir:// needs the rank and world_size.")
        yield store, query["rank"], query["world_size"]
        raise RuntimeError("Unable to perform re-rendezvous using dir://")


def _open_store_directory(url: str, rendezvous: FileRendezvous) -> tuple[int, str]:
    """The store's directory named in the rendezvous file, open, and its name, after checking both; owned by this
    rank."""
    directory_fd, file = rendezvous.directory_fd, rendezvous.file
    descriptor = os.open(file.name, _READ, dir_fd=directory_fd)
    try:
        status = os.fstat(descriptor)
        # The very file this rank's claim records (checked when it was made or joined); its maker's draft name
        # may still be there, so the links are not counted again.
        problem = private_file_problem(file, status, links=status.st_nlink)
        if problem is None and file_identity(status) != claimed_identity(rendezvous, rendezvous.claim.name):
            problem = f"{file} was replaced after this rank checked it: another run of this user is using the name"
        name = os.pread(descriptor, 256, 0).decode()
    finally:
        os.close(descriptor)
    if problem is not None:
        raise RuntimeError(f"torch_dist_init_method={url!r}: {problem}. Remove it, then start again.")
    path = file.parent / name
    try:
        store_fd = os.open(name, _OPEN_DIRECTORY, dir_fd=directory_fd)
    except OSError as error:
        raise RuntimeError(
            f"torch_dist_init_method={url!r}: the rendezvous directory {str(path)!r} that {file} names cannot be "
            f"opened ({error.strerror}): it was removed (the run ended or failed) or replaced. Start again."
        ) from None
    status = os.fstat(store_fd)
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid() or stat.S_IMODE(status.st_mode) & 0o077:
        os.close(store_fd)
        raise RuntimeError(
            f"torch_dist_init_method={url!r}: {describe(path, status)} is not a directory private to this user "
            f"({owner_name(os.geteuid())}, mode 0700), so it may be someone else's and is not used. Remove it, then "
            "start again."
        )
    if name not in rendezvous.owned:  # made by a peer: removed by this rank too, at exit or by its janitor
        rendezvous.own(name, store_fd)
    return store_fd, name
