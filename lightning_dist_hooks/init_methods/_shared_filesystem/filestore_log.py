"""Whether a file is a log torch's ``FileStore`` can read: checked before torch reads a file a peer made."""

from __future__ import annotations

import fcntl
import os
import struct
import time

# A FileStore writes under an exclusive flock for microseconds; holding it longer means a stuck process.
_LOCK_WAIT_S = 5.0


def filestore_log_problem(descriptor: int) -> str | None:
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
