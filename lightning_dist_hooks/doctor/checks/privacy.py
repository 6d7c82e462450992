"""The rendezvous directory and file are private: no other user can replace, plant or read the files ranks meet by.

Whoever can replace a rendezvous file can join the job or feed it data (docs/security.md), so a directory that is a
symbolic link, world-writable without the sticky bit, or another user's fails, as does a rendezvous file that is not
a private regular file of this user. Both verdicts are ``private``, given before the rendezvous.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from lightning_dist_hooks.doctor.checks.verdict import FAIL, OK, Verdict


def check_directory_privacy(directory: Path) -> Verdict:
    """A rendezvous directory other users cannot use to replace or plant files (docs/security.md)."""
    try:
        info = os.lstat(directory)
    except OSError as error:
        return Verdict("private", FAIL, f"cannot inspect {directory}: {error.strerror}", "create it, or name another")
    owner = _user_name(info.st_uid)
    described = f"{directory} (owner {owner}, mode {stat.filemode(info.st_mode)})"
    sticky = bool(info.st_mode & stat.S_ISVTX)
    if stat.S_ISLNK(info.st_mode):
        return Verdict(
            "private",
            FAIL,
            f"{directory} is a symbolic link, which another user may point elsewhere",
            f"name the real directory ({os.path.realpath(directory)}) instead",
        )
    if info.st_mode & stat.S_IWOTH and not sticky:
        return Verdict(
            "private",
            FAIL,
            f"{described} is writable by every user and not sticky: anyone can replace the rendezvous files in it",
            f"chmod +t {directory} (or o-w), or use a directory of your own",
        )
    if info.st_uid != os.geteuid() and not sticky:
        return Verdict(
            "private",
            FAIL,
            f"{described} belongs to another user, who can replace the files in it",
            "use a directory you own, or a sticky shared one",
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return Verdict("private", OK, f"{described} is shared but sticky: only the owner of a file can replace it")
    return Verdict("private", OK, f"{described} is writable only by its owner")


def check_file_privacy(path: Path) -> Verdict:
    """The rendezvous file: a regular file of this user, one link, no access for others."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return Verdict("private", OK, f"{path} does not exist yet; it is created private (0600)")
    described = f"{path} (owner {_user_name(info.st_uid)}, mode {stat.filemode(info.st_mode)}, {info.st_nlink} link(s))"
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1 or info.st_mode & 0o077:
        return Verdict(
            "private",
            FAIL,
            f"the rendezvous file {described} is not a private regular file of this user",
            f"remove {path} once no run uses it, and keep its directory private",
        )
    return Verdict("private", OK, f"the rendezvous file {described} is private")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
