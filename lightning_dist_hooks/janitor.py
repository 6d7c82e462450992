"""Removing a rank's rendezvous file and claim when the rank dies without cleaning up (SIGKILL, ``os._exit``, a crash).

A rank removes its files itself at a normal exit (``process_group._finish_process_group``), but no code of a
process runs when it is killed, and killing is how launchers end a failed job: Lightning's ``ddp`` launcher
SIGKILLs every process as soon as one child fails; torchrun, mpirun and srun send SIGTERM and SIGKILL shortly
after. A SIGTERM handler would not be enough: it runs only when the main thread is back in Python, which a rank
blocked in a collective is not until its timeout, and SIGKILL skips it entirely.

So each rank that uses a rendezvous file starts one tiny janitor process, joined to it by a pipe. The kernel
closes the rank's end of the pipe however the rank ends, and the janitor, blocked reading the other end, wakes at
once. A rank that cleaned up writes one byte first, telling its janitor to touch nothing (so a later run's files
with the same name are never removed); on a bare end of file the janitor removes the files and exits.

The janitor leaves the rank's session and ignores SIGTERM/SIGINT/SIGHUP, so that a launcher signalling the
rank's process group or session (torchrun, mpirun) does not take it down before its rank is gone; it imports
only the standard library and lives exactly as long as its rank, plus the few milliseconds of removing files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

_CLEANED_UP = b"c"


class Janitor:
    """The rank's end of the pipe to its janitor process."""

    def __init__(self, paths: list[Path]) -> None:
        read_end, self._write_end = os.pipe()
        try:
            self.process = subprocess.Popen(
                # -I: no PYTHON* variables, user site or script directory: the standard library alone, as it needs.
                [sys.executable, "-I", __file__, str(read_end), *map(str, paths)],
                pass_fds=(read_end,), start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            )
        finally:
            os.close(read_end)

    def dismiss(self) -> None:
        """Tell the janitor that this rank removed its files itself; it exits without touching anything."""
        try:
            os.write(self._write_end, _CLEANED_UP)
        except BrokenPipeError:
            pass  # someone killed the janitor already: nothing to tell it
        finally:
            os.close(self._write_end)
        # Reaped here, so that a rank that cleaned up leaves no zombie behind it.
        self.process.wait(timeout=10)


def _watch(read_end: int, paths: list[str]) -> None:
    for signal_number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signal_number, signal.SIG_IGN)
    if os.read(read_end, 1) == _CLEANED_UP:
        return
    # The rank ended without cleaning up: remove in the rank's own order, file first, then claim.
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    _watch(int(sys.argv[1]), sys.argv[2:])
