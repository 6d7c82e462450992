"""Files in a directory other users can write to, made so that none of them can substitute their own.

The rendezvous files of ``file://`` live in a directory every node shares, which on a cluster other users can
usually write to (``/scratch``, ``/tmp``, a project directory). Whoever controls the file a rank opens can join
the job as one of its ranks. So the files are never opened in the shared directory itself, but in a per-user
directory inside it, ``ldh-uid-<UID>``, created with mode 0700 and checked through the descriptor that opened
it: a real directory (``O_NOFOLLOW``), owned by this user, no access for group or others. Nobody else can
create, replace or read an entry in it, so what holds when a file is created there holds afterwards too,
without winning any race. This also makes harmless that torch's ``FileStore`` reopens its file by name with
``O_CREAT`` and mode 0644 on every operation: nobody else can reach inside the directory.

That directory is only as safe as the path to it: a user who can rename an entry of an ancestor can swap the
whole tree after our checks. So the shared directory and every directory above it must be owned by this user
or root, and if group or others may write to it, it must be sticky (then only an entry's owner may rename it).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def private_directory_name(uid: int | None = None) -> str:
    """The per-user directory's name: the uid in it, so that two users never share one.

    >>> private_directory_name(1000)
    'ldh-uid-1000'
    """
    return f"ldh-uid-{os.geteuid() if uid is None else uid}"


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def describe(path: Path, status: os.stat_result) -> str:
    """``'/x/y' (a directory owned by alice (uid 1000), mode 0o1777)``: what an error needs to say."""
    kind = {stat.S_IFDIR: "a directory", stat.S_IFREG: "a file", stat.S_IFLNK: "a symbolic link"}.get(
        stat.S_IFMT(status.st_mode), "a special file"
    )
    return f"{str(path)!r} ({kind} owned by {owner_name(status.st_uid)}, mode {oct(stat.S_IMODE(status.st_mode))})"


def shared_directory_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot hold this user's private directory safely, with the fix; None if it can."""
    try:
        status = os.lstat(directory)
    except OSError as error:
        return f"the directory {str(directory)!r} cannot be examined: {error.strerror}. Name a directory you can reach."
    if stat.S_ISLNK(status.st_mode):
        return (
            f"the rendezvous directory {describe(directory, status)} is a symbolic link, which whoever can "
            f"change it could point elsewhere. Name the real directory, e.g. 'file://{os.path.realpath(directory)}/'."
        )
    real = Path(os.path.realpath(directory))
    for component in [*reversed(real.parents), real]:
        problem = _directory_problem(component, os.stat(component))
        if problem is not None:
            return problem
    return None


def _directory_problem(directory: Path, status: os.stat_result) -> str | None:
    if not stat.S_ISDIR(status.st_mode):
        return f"{describe(directory, status)} is not a directory. Name an existing directory."
    if status.st_uid not in (os.geteuid(), 0):
        return (
            f"{describe(directory, status)} belongs to another user, who can rename or replace anything in "
            "it, sticky or not, and so could swap this user's rendezvous files for their own. Use a directory "
            "owned by you or root, e.g. `mkdir -m 700 /shared/$USER` and 'file:///shared/$USER/'."
        )
    if status.st_mode & 0o022 and not status.st_mode & stat.S_ISVTX:
        return (
            f"{describe(directory, status)} lets other users write to it without the sticky bit, so they "
            "could rename or replace this user's rendezvous files. Ask its owner to `chmod +t` it, or use a "
            "directory only you can write to, e.g. `mkdir -m 700 /shared/$USER` and 'file:///shared/$USER/'."
        )
    return None


def open_shared_directory(directory: Path) -> tuple[int, str | None]:
    """A descriptor of ``directory`` and None, or -1 and why it cannot be used (checked by path, then by fd)."""
    problem = shared_directory_problem(directory)
    if problem is not None:
        return -1, problem
    try:
        descriptor = os.open(directory, _OPEN_DIRECTORY)
    except OSError as error:
        return -1, f"the directory {str(directory)!r} cannot be opened: {error.strerror}."
    problem = _directory_problem(directory, os.fstat(descriptor))
    if problem is not None:
        os.close(descriptor)
        return -1, problem
    return descriptor, None


def open_private_directory(shared_fd: int, shared: Path) -> tuple[int, str | None]:
    """This user's private directory in ``shared`` (created if missing): its descriptor and None, or -1 and why."""
    name = private_directory_name()
    path = shared / name
    for _ in range(3):  # another run of this user may remove it, empty, between our mkdir and open: make it again
        try:
            # umask can only take permissions away: the result is 0700 or stricter, and fstat below checks it.
            os.mkdir(name, 0o700, dir_fd=shared_fd)
        except FileExistsError:
            pass
        try:
            descriptor = os.open(name, _OPEN_DIRECTORY, dir_fd=shared_fd)
            break
        except FileNotFoundError:
            continue
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                return -1, f"the private directory {str(path)!r} cannot be opened: {error.strerror}."
            return -1, _not_ours(path, os.stat(name, dir_fd=shared_fd, follow_symlinks=False), "directory")
    else:
        return -1, f"the private directory {str(path)!r} keeps disappearing: is another run removing it?"
    status = os.fstat(descriptor)
    if status.st_uid != os.geteuid() or stat.S_IMODE(status.st_mode) & 0o077:
        os.close(descriptor)
        return -1, _not_ours(path, status, "directory")
    return descriptor, None


def private_file_problem(path: Path, status: os.stat_result, links: int = 1) -> str | None:
    """Why an existing file in the private directory is not one this user's run can trust; None if it is.

    ``links``: how many names the file may have (more than one only where the caller knows each of them).
    """
    if (
        not stat.S_ISREG(status.st_mode)
        or status.st_uid != os.geteuid()
        or stat.S_IMODE(status.st_mode) & 0o077
        or status.st_nlink != links
    ):
        return _not_ours(path, status, "regular file with one link", links)
    return None


def _not_ours(path: Path, status: os.stat_result, expected: str, expected_links: int = 1) -> str:
    links = f", {status.st_nlink} links" if stat.S_ISREG(status.st_mode) and status.st_nlink != expected_links else ""
    return (
        f"{describe(path, status)}{links} is not a {expected} private to this user ({owner_name(os.geteuid())}, "
        "no access for group or others), so it may be someone else's and is not used. Remove it (it is at the "
        "name only this user's rendezvous files use; an administrator may have to), then start again."
    )
