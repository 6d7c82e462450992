"""Locks of the test run, shared by its pytest-xdist workers: what the machine has once (the test SLURM, the
emulated cluster, a sysctl setting, useradd) is used by one test at a time, or by the tests that want it the same
way, whatever workers run them. Each lock is a file in the run's shared directory, held with flock(2): a worker that
dies releases its locks with its files."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

# How often a test waiting for the tests of another value of a shared lock looks again.
_SHARED_POLL_S = 0.5


def shared_run_directory(config: pytest.Config) -> Path:
    """A directory of this test run that its workers share: pytest's base temporary directory of the run (mode 0700,
    this user's), of which each xdist worker's own is a subdirectory."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]  # pytest's, public as tmp_path_factory
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


_holds: dict[str, int] = {}  # lock name -> how many holds this worker has now (a test's, then its fixture's)


@contextlib.contextmanager
def holding(config: pytest.Config, name: str) -> Iterator[None]:
    """Hold the run's lock ``name``: no other test of this run that needs it runs meanwhile. Re-entrant within a
    worker: a test holds it while a session fixture it needs first (the test SLURM) takes it again."""
    if _holds.get(name):
        _holds[name] += 1
        try:
            yield
        finally:
            _holds[name] -= 1
        return
    with (shared_run_directory(config) / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _holds[name] = 1
        try:
            yield
        finally:
            _holds[name] = 0


def _held_by_another(lock_path: Path) -> bool:
    with lock_path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # closing the file releases the probe's own lock


@contextlib.contextmanager
def holding_shared(
    config: pytest.Config, name: str, value: str, first_in: Callable[[], None], last_out: Callable[[], None]
) -> Iterator[None]:
    """Hold the run's lock ``name`` beside the tests that want the same ``value`` of it, never beside one that wants
    another (a machine setting that many tests need one way or the other: sysctl). ``first_in`` runs when no test held
    ``value`` (it makes the setting so), ``last_out`` when the last holder of ``value`` leaves (it undoes it); both
    under ``name``'s own lock, so no other value can come in between."""
    directory = shared_run_directory(config)
    mine = directory / f"{name}={value}.lock"
    lock: IO[str] | None = None
    while lock is None:
        with holding(config, name):
            others = [path for path in directory.glob(f"{name}=*.lock") if path != mine]
            if not any(_held_by_another(path) for path in others):
                first = not _held_by_another(mine)
                lock = mine.open("a")
                fcntl.flock(lock, fcntl.LOCK_SH)
                if first:
                    first_in()
        if lock is None:
            time.sleep(_SHARED_POLL_S)
    try:
        yield
    finally:
        with holding(config, name), lock:
            try:
                # Succeeds only when no other test holds the value. (A failed conversion may drop the shared lock:
                # the file closes next anyway, and ``name``'s lock keeps any other value out meanwhile.)
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                last_out()


# The machine's state that tests change for a while (sysctl settings, the checkout's mode), as it was before the run:
# recorded once, by the first test to change it, in the run's shared directory; put back by the last test to need it
# changed, and by the run's controller at the end whatever happened (a worker that died midway included).
_BEFORE_THE_RUN = "{}.before-the-run.json"


def _record_path(config: pytest.Config, name: str) -> Path:
    return shared_run_directory(config) / _BEFORE_THE_RUN.format(name)


def record_file_contents(config: pytest.Config, name: str, paths: list[Path]) -> None:
    """Record what ``paths`` hold (files of /proc/sys), unless this run already did."""
    record = _record_path(config, name)
    if not record.exists():
        record.write_text(json.dumps({"contents": {str(path): path.read_text().strip() for path in paths}}))


def record_mode(config: pytest.Config, name: str, path: Path) -> None:
    """Record ``path``'s permission bits, unless this run already did."""
    record = _record_path(config, name)
    if not record.exists():
        record.write_text(json.dumps({"modes": {str(path): stat.S_IMODE(path.stat().st_mode)}}))


def restore(config: pytest.Config, name: str) -> None:
    """Put back what ``record_file_contents`` or ``record_mode`` recorded as ``name``."""
    record = _record_path(config, name)
    if not record.exists():
        return
    recorded = json.loads(record.read_text())
    for path, text in recorded.get("contents", {}).items():
        Path(path).write_text(text)
    for path, mode in recorded.get("modes", {}).items():
        Path(path).chmod(mode)


def restore_everything_recorded(config: pytest.Config) -> None:
    for record in shared_run_directory(config).glob(_BEFORE_THE_RUN.format("*")):
        restore(config, record.name[: -len(_BEFORE_THE_RUN.format(""))])
