"""Removing a rank's rendezvous file and claim when the rank dies without cleaning up (SIGKILL, ``os._exit``, a crash).

A rank removes its files itself at a normal exit (``FileInitMethod.finish``), but no code of a process runs when
it is killed, and killing is how launchers end a failed job: Lightning's ``ddp`` launcher SIGKILLs every process
as soon as one child fails; torchrun, mpirun and srun send SIGTERM and SIGKILL shortly after. A SIGTERM handler
would not be enough: it runs only when the main thread is back in Python, which a rank blocked in a collective
is not until its timeout, and SIGKILL skips it entirely.

So each rank that uses a rendezvous file starts one tiny janitor process, joined to it by a Unix socket, before
it creates anything. For every file the rank creates, it sends the janitor the file's name and an open descriptor
of it. The kernel closes the rank's end of the socket however the rank ends, and the janitor, blocked reading the
other end, wakes at once. A rank that cleaned up sends a last message first, telling its janitor to touch nothing;
on a bare end of file the janitor removes the files it was given, and then the private directory if empty.

It works through the directory descriptors it inherited, never by path, and removes an entry only if it still is
the very file it was given (same device and inode). Holding that file open keeps its inode from being reused, so
a file that replaced ours under the same name (a later run's) is never taken for ours, and stays. An entry may
be a directory (``dir://``'s store, whose files every rank of the launch creates): it goes with all it holds.

The janitor leaves the rank's session and ignores SIGTERM/SIGINT/SIGHUP, so that a launcher signalling the
rank's process group or session (torchrun, mpirun) does not take it down before its rank is gone; it imports
only the standard library and lives exactly as long as its rank, plus the few milliseconds of removing files.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import subprocess
import sys

_CLEANED_UP = b"cleaned-up"
_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Janitor:
    """The rank's end of the pipe to its janitor process.

    ``directory_fd`` is the private directory the files are in, ``shared_fd`` the directory that holds it under
    the name ``directory_name``.
    """

    def __init__(self, directory_fd: int, shared_fd: int, directory_name: str) -> None:
        # SEQPACKET: each message arrives whole, with the descriptor sent along with it.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # A bare descriptor, not a socket object: only the rank's end, never a garbage collection, closes it.
        self._socket_fd = ours.detach()
        try:
            self.process = subprocess.Popen(
                # -I: no PYTHON* variables, user site or script directory: the standard library alone, as it needs.
                [
                    sys.executable,
                    "-I",
                    __file__,
                    str(theirs.fileno()),
                    str(directory_fd),
                    str(shared_fd),
                    directory_name,
                ],
                pass_fds=(theirs.fileno(), directory_fd, shared_fd),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        finally:
            theirs.close()

    def watch(self, name: str, descriptor: int) -> None:
        """Have the janitor remove ``name`` (if it still is the file open as ``descriptor``) should the rank die."""
        self._tell(json.dumps(name).encode(), [descriptor])

    def dismiss(self) -> None:
        """Tell the janitor that this rank removed its files itself; it exits without touching anything."""
        try:
            self._tell(_CLEANED_UP, [])
        finally:
            os.close(self._socket_fd)
        # Reaped here, so that a rank that cleaned up leaves no zombie behind it.
        self.process.wait(timeout=10)

    def _tell(self, message: bytes, descriptors: list[int]) -> None:
        rank = socket.socket(fileno=self._socket_fd)
        try:
            socket.send_fds(rank, [message], descriptors)
        except (BrokenPipeError, ConnectionResetError):
            pass  # someone killed the janitor already: nothing to tell it
        finally:
            rank.detach()


def remove_entry(directory_fd: int, name: str) -> None:
    """Remove ``name`` from the directory open as ``directory_fd``: a file, or a directory of files with its files.

    Raises ``FileNotFoundError`` if it is gone already. Files that appear meanwhile (a peer rank still writing) are
    removed too, up to a few rounds; a directory inside it is left, and so is it then (``OSError``).
    """
    if not stat.S_ISDIR(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode):
        os.unlink(name, dir_fd=directory_fd)
        return
    inner = os.open(name, _OPEN_DIRECTORY, dir_fd=directory_fd)
    try:
        for attempt in range(3):
            for entry in os.listdir(inner):
                try:
                    os.unlink(entry, dir_fd=inner)
                except FileNotFoundError:
                    pass  # a peer removing the same directory took it first
            try:
                os.rmdir(name, dir_fd=directory_fd)
                return
            except OSError as error:
                if error.errno != errno.ENOTEMPTY or attempt == 2:
                    raise
    finally:
        os.close(inner)


def _same_entry(directory_fd: int, name: str, status: os.stat_result) -> bool:
    try:
        current = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (current.st_dev, current.st_ino) == (status.st_dev, status.st_ino)


def _watch(socket_fd: int, directory_fd: int, shared_fd: int, directory_name: str) -> None:
    for signal_number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signal_number, signal.SIG_IGN)
    rank = socket.socket(fileno=socket_fd)
    files: list[tuple[str, int]] = []
    while True:
        message, descriptors, _, _ = socket.recv_fds(rank, 4096, 1)
        if message == _CLEANED_UP:
            return
        if not message:
            break
        files.append((json.loads(message), descriptors[0]))
    # The rank ended without cleaning up. Newest first, as the rank itself removes them: the file before its claim,
    # since a claim outliving its file is harmless and a file outliving its claim is not recognised as a leftover.
    for name, descriptor in reversed(files):
        if _same_entry(directory_fd, name, os.fstat(descriptor)):
            try:
                remove_entry(directory_fd, name)
            except OSError:
                pass  # gone, or a peer's janitor is removing the same directory
    if _same_entry(shared_fd, directory_name, os.fstat(directory_fd)):
        try:
            os.rmdir(directory_name, dir_fd=shared_fd)
        except OSError:
            pass  # not empty: another rank or run of this user still has files in it


if __name__ == "__main__":
    socket_fd, directory_fd, shared_fd = map(int, sys.argv[1:4])
    _watch(socket_fd, directory_fd, shared_fd, sys.argv[4])
