"""A ``torch.distributed.Store`` over a directory every rank shares, that needs no file locks.

torch's ``FileStore`` keeps every key in one file that each rank appends to and re-reads under ``flock``: on a
filesystem without ``flock`` it fails, and on one whose locks do not cross nodes (Lustre's ``localflock``) two
nodes can both "hold" the lock and interleave their writes. Here nothing is ever locked. Each key is a log of
entries, each entry a file of its own that never changes once it has its name:

* ``k.<KEY>.<SEQ>``: the SEQth change of KEY (SEQ = 1, 2, ...). Its content is ``=VALUE`` (``set``,
  ``compare_set``), ``+N`` (``add``), ``&BYTES`` (``append``) or ``-`` (``delete_key``);
* ``t.<WRITER>.<N>``: an entry being written, under a name only its writer uses.

A writer writes the whole entry under its temporary name, then ``link()``\\ s it to ``k.<KEY>.<SEQ>`` for the next
SEQ, which succeeds for exactly one writer (the others get ``EEXIST`` and try the next SEQ), and removes the
temporary name. A key's value is its entries folded in order: the last ``=`` sets it, ``+`` adds to it as an
integer, ``&`` appends, ``-`` removes it. So ``add`` and ``compare_set`` are atomic without a lock: an
increment or a swap is one exclusively created entry, made against the entries its writer has read. Each process
remembers how far it has folded every key, so that reading a key again costs one failed ``open`` of the next
entry until something changes: a rank's filesystem operations grow with the number of changes it reads, not
with the number of times it asks.

Every entry is opened relative to the directory's descriptor with ``O_NOFOLLOW`` and checked before its content
is used: a regular file of this user, no access for group or others, one link (an entry has two links only
between its writer's ``link`` and its removal of the temporary name: a reader sees that for microseconds, and
waits for it to end). The directory itself is the caller's to check (``dir_scheme`` makes it inside this user's
private directory, where nobody else can create, replace or read an entry).

Waits poll with back-off (10 ms doubling, carried over from one wait to the next) until the store's timeout, then
raise ``torch.distributed.DistStoreError`` naming the keys, as torch's own stores do. The longest pause grows with
the world size, world_size / 5000 seconds (10 ms at least: 0.1 s for 500 ranks, 1 s for 5000), so that all the
ranks of a job waiting together look about 5000 times a second at most, however many they are: on a shared
filesystem each look is a request to its metadata server, which the whole cluster shares.

    store = DirectoryStore(os.open("/shared/rdzv/ldh-uid-1000/run42.d", os.O_RDONLY | os.O_DIRECTORY),
                           Path("/shared/rdzv/ldh-uid-1000/run42.d"), timedelta(minutes=5), world_size=64)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size)

This module imports only the standard library and torch (the benchmarks load it alone, without Lightning).
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from typing_extensions import override  # a dependency of torch and of Lightning

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_FIRST_POLL_S = 0.01
_LOOKS_PER_SECOND = 5000  # by all the ranks of a job together, once their waits have backed off
_WORLD_SIZE_UNKNOWN = 500  # a store not told its world size backs off as one of 500 ranks does: to 0.1 s
# How long a reader waits for an entry's writer to remove the temporary second name (microseconds, normally).
_SECOND_LINK_WAIT_S = 2.0
_ENCODED_KEY_MAX = 180  # file names hold 255 bytes: the key, its prefix, sequence number and a digest fit
_KEEP = re.compile(r"[A-Za-z0-9_-]+")


@dataclass
class FilesystemOperations:
    """How many filesystem calls this store made, by kind: what the bootstrap benchmark reports per rank."""

    opens: int = 0
    reads: int = 0
    creates: int = 0
    writes: int = 0
    links: int = 0
    unlinks: int = 0
    stats: int = 0  # fstat of an entry opened, and the look (access) for the next entry: how a wait finds a key missing
    listings: int = 0

    def total(self) -> int:
        return sum(getattr(self, field.name) for field in fields(self))

    def as_dict(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


class DirectoryStore(dist.Store):
    """A store whose keys are files in the directory open as ``directory_fd`` (``path`` names it in messages).

    The descriptor stays the caller's to close. ``timeout`` is the store's (torch's ``set_timeout`` changes it).
    ``world_size``: how many ranks share it, which sets how far their waits back off (see the module's description).
    """

    def __init__(self, directory_fd: int, path: Path, timeout: timedelta = timedelta(minutes=5),
                 world_size: int | None = None) -> None:  # fmt: skip
        if world_size is not None and world_size < 1:
            raise ValueError(f"DirectoryStore(world_size={world_size}): a world has one rank at least")
        super().__init__()
        self.directory_fd = directory_fd
        self.path = path
        self.operations = FilesystemOperations()
        self._uid = os.geteuid()
        self.set_timeout(timeout)
        # Temporary names of this process: never the same as another writer's, on this node or any other.
        self._writer = f"t.{os.getpid()}-{secrets.token_hex(6)}"
        # next() on a count is atomic: gloo's lazy set-up calls the store from its own threads too.
        self._temporaries = itertools.count(1)
        # How long a wait sleeps before it looks again: doubled while keys are missing, shortened by a fifth when
        # one waited for is there at once. gloo waits for the ranks' keys one after another while they are still
        # starting: a rank that has just waited for one will likely wait for the next, and looking less often than
        # keys arrive finds several at each look (on a shared filesystem each look is a request to its server).
        self._pause = _FIRST_POLL_S
        self._longest_pause = max(_FIRST_POLL_S, (world_size or _WORLD_SIZE_UNKNOWN) / _LOOKS_PER_SECOND)
        # Per key (by its file name): the last entry folded in, and the value then (absent: no value). Two dicts of
        # ints and bytes rather than one of tuples: the garbage collector tracks tuples and not these, and a rank
        # forked from a process that imported torch paid for its collections, a few microseconds per peer.
        self._entries_read: dict[str, int] = {}
        self._values: dict[str, bytes] = {}
        # Each key's file name, computed once per key.
        self._names: dict[str, str] = {}

    # --- torch.distributed.Store ---

    @override
    def set(self, key: str, value: bytes | str) -> None:
        self._append(key, b"=" + _as_bytes(value))

    @override
    def get(self, key: str) -> bytes:
        value = self._refresh(key)[1]  # gloo waits for every key before it gets it: there already, usually
        return self._wait_for([key], self._timeout())[0] if value is None else value

    @override
    def add(self, key: str, amount: int) -> int:
        if amount == 0:  # torch's barriers poll a counter with add(key, 0): a read, not an entry
            return _as_int(key, self._refresh(key)[1])
        return _as_int(key, self._append(key, b"+%d" % amount))

    def append(self, key: str, value: bytes | str) -> None:
        self._append(key, b"&" + _as_bytes(value))

    @override
    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Set ``key`` to ``desired`` if its value is ``expected`` (empty: if it has none); return the value after.

        As torch's stores: a key without a value and a non-empty ``expected`` is left without one, and
        ``expected`` is returned.
        """
        expected, desired = _as_bytes(expected), _as_bytes(desired)
        while True:
            sequence, value = self._refresh(key)
            if value is None and expected:
                return expected
            if value is not None and value != expected:
                return value
            if self._link_entry(key, sequence + 1, b"=" + desired):
                self._remember(self._name(key), sequence + 1, desired)
                return desired
            # Another writer changed the key since it was read: compare against the new value.

    @override
    def check(self, keys: list[str]) -> bool:
        return all(self._refresh(key)[1] is not None for key in keys)

    @override
    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Return once every key has had a value: a key this process has seen set counts, even if it was deleted
        since (``get`` reads the newest entries). So gloo's wait-then-get of a peer's address reads it once."""
        if all(self._has_had_value(key) for key in keys):
            self._pause = max(_FIRST_POLL_S, self._pause * 0.8)
        else:
            self._wait_for(keys, self._timeout() if timeout is None else timeout)

    @override
    def delete_key(self, key: str) -> bool:
        while True:
            sequence, value = self._refresh(key)
            if value is None:
                return False
            if self._link_entry(key, sequence + 1, b"-"):
                self._remember(self._name(key), sequence + 1, None)
                return True

    @override
    def num_keys(self) -> int:
        self.operations.listings += 1
        names = {entry.rsplit(".", 1)[0][2:] for entry in os.listdir(self.directory_fd) if entry.startswith("k.")}
        return sum(self._refresh_encoded(name)[1] is not None for name in names)

    @override
    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._wait_for(keys, self._timeout())

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    # --- entries ---

    def _timeout(self) -> timedelta:
        # The C++ store's, which torch's set_timeout changes (also through a PrefixStore wrapping this one).
        return self.timeout  # type: ignore[attr-defined]  # torch's stubs omit the property

    def _append(self, key: str, change: bytes) -> bytes | None:
        """Add ``change`` as the next entry of ``key``; return the key's value right after it."""
        sequence, value = self._remembered(self._name(key))
        if change[:1] != b"=":  # it builds on the current value: start from the newest entry
            sequence, value = self._refresh(key)
        while not self._link_entry(key, sequence + 1, change):
            sequence, value = self._refresh(key)  # a peer took that number: fold its entry in, try the next
        value = _fold(key, value, change)
        self._remember(self._name(key), sequence + 1, value)
        return value

    def _link_entry(self, key: str, sequence: int, change: bytes) -> bool:
        """Make ``change`` entry ``sequence`` of ``key``, written in full first; False if that entry exists."""
        temporary = f"{self._writer}.{next(self._temporaries)}"
        self.operations.creates += 1
        descriptor = os.open(temporary, _CREATE, 0o600, dir_fd=self.directory_fd)
        try:
            self.operations.writes += 1
            written = os.write(descriptor, change)
            while written < len(change):
                self.operations.writes += 1
                written += os.write(descriptor, change[written:])
        finally:
            os.close(descriptor)
        try:
            self.operations.links += 1
            os.link(temporary, f"k.{self._name(key)}.{sequence}", src_dir_fd=self.directory_fd,
                    dst_dir_fd=self.directory_fd, follow_symlinks=False)  # fmt: skip
            return True
        except FileExistsError:
            return False
        finally:
            self.operations.unlinks += 1
            os.unlink(temporary, dir_fd=self.directory_fd)

    def _name(self, key: str) -> str:
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = _encoded(key)
        return name

    def _remembered(self, name: str) -> tuple[int, bytes | None]:
        return self._entries_read.get(name, 0), self._values.get(name)

    def _remember(self, name: str, sequence: int, value: bytes | None) -> None:
        self._entries_read[name] = sequence
        if value is None:
            self._values.pop(name, None)
        else:
            self._values[name] = value

    def _refresh(self, key: str) -> tuple[int, bytes | None]:
        """Fold in the entries of ``key`` added since this process last looked; return (last entry, value)."""
        return self._refresh_encoded(self._name(key))

    def _has_had_value(self, key: str) -> bool:
        """Whether ``key`` has had a value: read up to its first entry with one, not on to its newest (gloo waits for
        a key, then gets it: one look for the newest is enough)."""
        name = self._name(key)
        sequence, value = self._remembered(name)
        while value is None:
            change = self._read_entry(name, sequence + 1)
            if change is None:
                return False
            sequence += 1
            value = _fold(name, value, change)
            self._remember(name, sequence, value)
        return True

    def _refresh_encoded(self, name: str) -> tuple[int, bytes | None]:
        sequence, value = self._remembered(name)
        while True:
            change = self._read_entry(name, sequence + 1)
            if change is None:
                break
            sequence += 1
            value = _fold(name, value, change)
        self._remember(name, sequence, value)
        return sequence, value

    def _read_entry(self, encoded: str, sequence: int) -> bytes | None:
        """The content of entry ``sequence`` of the key ``encoded``, None if there is none; refused unless it is
        ours alone."""
        name = f"k.{encoded}.{sequence}"
        self.operations.stats += 1
        # A look first: most are for an entry not there yet, which access() answers without an exception to raise.
        if not os.access(name, os.F_OK, dir_fd=self.directory_fd, follow_symlinks=False):
            return None
        self.operations.opens += 1
        try:
            descriptor = os.open(name, _READ, dir_fd=self.directory_fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            # A symlink (ELOOP), or a file this user may not read (EACCES): not an entry this store wrote.
            if error.errno not in (errno.ELOOP, errno.EACCES, errno.EPERM):
                raise
            raise dist.DistStoreError(self._refusal(name, os.stat(name, dir_fd=self.directory_fd,
                                                                  follow_symlinks=False))) from None  # fmt: skip
        try:
            status = self._checked(name, descriptor)
            self.operations.reads += 1
            content = os.read(descriptor, status.st_size + 1)
        finally:
            os.close(descriptor)
        if len(content) != status.st_size or content[:1] not in (b"=", b"+", b"&", b"-"):
            raise dist.DistStoreError(
                f"{self.path / name} is not an entry of this store (content {content[:40]!r}): something else wrote "
                "it. Remove the rendezvous directory once no run uses it, then start again."
            )
        return content

    def _checked(self, name: str, descriptor: int) -> os.stat_result:
        self.operations.stats += 1
        status = os.fstat(descriptor)
        if status.st_nlink == 1 and _is_ours(status, self._uid):
            return status
        deadline = time.monotonic() + _SECOND_LINK_WAIT_S
        while _is_ours(status, self._uid) and status.st_nlink == 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # its writer has yet to remove the temporary name
            self.operations.stats += 1
            status = os.fstat(descriptor)
        if not _is_ours(status, self._uid) or status.st_nlink != 1:
            raise dist.DistStoreError(self._refusal(name, status))
        return status

    def _refusal(self, name: str, status: os.stat_result) -> str:
        kind = "a symbolic link" if stat.S_ISLNK(status.st_mode) else "not a regular file"
        if stat.S_ISREG(status.st_mode):
            kind = f"a file of uid {status.st_uid}, mode {oct(stat.S_IMODE(status.st_mode))}, {status.st_nlink} links"
        return (
            f"{self.path / name} is {kind}, not an entry private to this user (uid {os.geteuid()}, mode 0o600, one "
            "link), so it may be someone else's and is not used. Remove the rendezvous directory once no run uses "
            "it (an administrator may have to), then start again."
        )

    def _wait_for(self, keys: list[str], timeout: timedelta) -> list[bytes]:
        deadline = time.monotonic() + timeout.total_seconds()
        values: dict[str, bytes] = {}
        while True:
            for key in keys:
                if key not in values:
                    value = self._refresh(key)[1]
                    if value is not None:
                        values[key] = value
            if len(values) == len(keys):
                return [values[key] for key in keys]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [key for key in keys if key not in values]
                raise dist.DistStoreError(
                    f"Wait timeout: timed out after {timeout.total_seconds():g} s waiting for the keys {missing} in "
                    f"{self.path}: the ranks that set them have not arrived or have failed."
                )
            time.sleep(min(self._pause, remaining))
            self._pause = min(self._pause * 2, self._longest_pause)


def _is_ours(status: os.stat_result, uid: int) -> bool:
    return stat.S_ISREG(status.st_mode) and status.st_uid == uid and not stat.S_IMODE(status.st_mode) & 0o077


def _fold(key: str, value: bytes | None, change: bytes) -> bytes | None:
    kind, payload = change[:1], change[1:]
    if kind == b"=":
        return payload
    if kind == b"+":
        return b"%d" % (_as_int(key, value) + int(payload))
    if kind == b"&":
        return (value or b"") + payload
    return None


def _as_int(key: str, value: bytes | None) -> int:
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        raise dist.DistStoreError(f"add({key!r}): the key holds {value[:40]!r}, not an integer") from None


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


# Each byte of a key's UTF-8 other than a letter, digit, "_" or "-", as "%XX" (str.translate: each rank encodes every
# peer's key once, and a regular expression per key cost more than the filesystem calls that follow).
_ESCAPES = {byte: f"%{byte:02X}" for byte in range(256) if not _KEEP.fullmatch(chr(byte))}


def _encoded(key: str) -> str:
    """KEY's characters other than letters, digits, ``_`` and ``-`` written ``%XX`` (their UTF-8 bytes): a file name.

    >>> _encoded("default_pg/0//cpu//rank_3")
    'default_pg%2F0%2F%2Fcpu%2F%2Frank_3'
    >>> _encoded("é~.")
    '%C3%A9%7E%2E'
    """
    encoded = key.encode().decode("latin-1").translate(_ESCAPES)
    if len(encoded) <= _ENCODED_KEY_MAX:
        return encoded
    # Too long for a file name: a prefix to read, a digest to keep keys apart (marked by "~", never encoded).
    return f"{encoded[: _ENCODED_KEY_MAX - 33]}~{hashlib.sha256(key.encode()).hexdigest()[:32]}"
