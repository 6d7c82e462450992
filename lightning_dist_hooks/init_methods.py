"""``torch_dist_init_method`` values: one small handler per URL scheme, looked up in a registry.

Each handler does two things at two different times:

* ``validate(url)`` runs in ``Trainer(...)``, before any process starts, and turns a bad value into a
  ``ValueError`` that names the value and the fix;
* ``prepare(url, cluster_environment)`` runs on every rank just before the process group is created and
  returns the :class:`Rendezvous` to hand to ``setup_distributed_backend``.

Like ``torch.distributed.rendezvous``, new schemes plug in with :func:`register_init_method`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Optional
from urllib.parse import SplitResult, urlsplit

from lightning_fabric.plugins.environments import ClusterEnvironment


@dataclass(frozen=True)
class Rendezvous:
    """What one rank uses to meet the others.

    ``init_method`` is passed to ``setup_distributed_backend``; ``file``, when set, is a rendezvous file this
    package created and removes when the process group is finished with, and ``claim`` this rank's claim on it
    (see :class:`FileInitMethod`), removed after the file.
    """

    init_method: str
    file: Optional[Path] = None
    claim: Optional[Path] = None


class InitMethod(ABC):
    """A scheme handler: subclasses set ``scheme`` and implement both methods."""

    scheme: str = ""

    @abstractmethod
    def validate(self, url: str, parts: SplitResult) -> str:
        """Return the URL to keep, or raise ``ValueError`` naming ``url`` and the fix."""

    @abstractmethod
    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
        """Get this rank ready to rendezvous through ``url``."""


class AddresslessInitMethod(InitMethod):
    """A scheme whose whole URL is ``SCHEME://``: where the ranks meet is known from elsewhere."""

    # Completes "SCHEME:// takes no address; ..." in the error for a URL that names one.
    where_ranks_meet: str = ""

    def validate(self, url: str, parts: SplitResult) -> str:
        if parts.netloc or parts.path not in ("", "/"):
            raise ValueError(
                f"torch_dist_init_method={url!r}: {self.scheme}:// takes no address; {self.where_ranks_meet}"
            )
        return f"{self.scheme}://"


class EnvInitMethod(AddresslessInitMethod):
    """``env://``: torch reads ``MASTER_ADDR``/``MASTER_PORT``, which Lightning takes from the cluster environment."""

    scheme = "env"
    where_ranks_meet = ("the address comes from MASTER_ADDR and MASTER_PORT (or your cluster environment). "
                        "Use 'env://', or 'tcp://HOST:PORT' to name one.")

    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
        # Exactly what Lightning's own ``_init_dist_connection`` does before ``init_process_group``.
        os.environ["MASTER_ADDR"] = cluster_environment.main_address
        os.environ["MASTER_PORT"] = str(cluster_environment.main_port)
        return Rendezvous("env://")


_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")


class TcpInitMethod(InitMethod):
    """``tcp://HOST:PORT``: rank 0 listens on HOST:PORT, the other ranks connect to it."""

    scheme = "tcp"

    def validate(self, url: str, parts: SplitResult) -> str:
        host = parts.hostname or ""
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is None or not 0 < port < 65536:
            raise ValueError(
                f"torch_dist_init_method={url!r} needs a port between 1 and 65535 that rank 0 can listen on, "
                "e.g. 'tcp://10.0.0.1:29500'."
            )
        # Syntax only: the launching node may not resolve compute-node names, so no DNS lookup here.
        if not (_is_ip_address(host) or _HOSTNAME.match(host)):
            raise ValueError(
                f"torch_dist_init_method={url!r}: {host!r} is not a host name or IP address. "
                "Give rank 0's address, e.g. 'tcp://10.0.0.1:29500' or 'tcp://node001:29500'."
            )
        return url

    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
        # Under torchrun, TORCHELASTIC_USE_AGENT_STORE=True makes init_process_group take tcp://HOST:PORT for the
        # agent's own store and connect every rank, rank 0 too, as a client: nobody would listen on the port named
        # here, and all ranks would wait until the timeout. tcp://HOST:PORT means rank 0 listens there.
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        return Rendezvous(url)


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _can_create_files_in(directory: Path) -> bool:
    # A real probe file, not os.access: access() says yes to root everywhere, and knows nothing of
    # read-only mounts or quotas on a shared filesystem.
    try:
        descriptor, probe = tempfile.mkstemp(dir=directory, prefix=".lightning-dist-hooks-probe-")
    except OSError:
        return False
    os.close(descriptor)
    os.unlink(probe)
    return True


class FileInitMethod(InitMethod):
    """``file:///ABSOLUTE/PATH``: ranks meet through a file on a filesystem they all share; nobody listens.

    ``file:///DIR/`` (a trailing slash, or an existing directory) means one file per launch inside DIR, named
    by :func:`rendezvous_file_for_job` from the job identity; ``Trainer(...)`` resolves it before any process
    starts (``ddp_spawn`` children receive the resolved path, ``ddp`` children and externally launched ranks
    resolve the same one from the same identity).

    **Leftover files.** torch's FileStore must start from a missing or empty file: one left by an earlier run
    (a crash, a kill) deadlocks or connects the wrong processes. The per-launch identity avoids reuse where the
    launcher names each launch (a SLURM requeue has a new restart count, torchrun a new restart count, Flux a
    new job id, ``ddp`` a new token). Where an identity can repeat (several ``mpiexec`` in one PBS job, torchrun
    without ``--rdzv-id``, an explicit path), each rank first claims the file by creating ``FILE.rank<R>.claim``
    with O_EXCL, and removes its claim only after removing the file at exit. So:

    * a claim for rank R that already exists was made by another process holding rank R with this identity:
      never by a peer of this launch, which has exactly one rank R. It is an earlier run's (or a concurrent run
      with the same identity, which is just as wrong), so no false positive is possible;
    * if the file exists too, it may be that earlier run's, and this rank stops with an error naming both files.
      (A peer's fresh file would look the same, so nothing is deleted automatically);
    * if the file does not exist, the earlier run removed it, or never created it: a file that appears later
      is created by a live process, never by the dead run, so the old claim is harmless and is taken over.

    Every rank that took part in the earlier run finds its claim and stops at once instead of deadlocking; the
    launchers here (mpirun, srun, torchrun) then stop the other ranks. A rank that had not reached its claim in
    the earlier run waits at most the process-group timeout.
    """

    scheme = "file"

    def validate(self, url: str, parts: SplitResult) -> str:
        path = Path(parts.path)
        if parts.netloc or not path.is_absolute():
            shown = f"{parts.netloc}{parts.path}"
            raise ValueError(
                f"torch_dist_init_method={url!r}: the rendezvous file must be an absolute path, but {shown!r} is "
                "relative. Write three slashes before an absolute path, e.g. 'file:///shared/run42/rendezvous'."
            )
        is_directory = parts.path.endswith("/") or path.is_dir()
        directory = path if is_directory else path.parent
        if not directory.is_dir():
            raise ValueError(
                f"torch_dist_init_method={url!r}: the directory {str(directory)!r} does not exist. "
                "Create it on a filesystem every node shares, or name another one."
            )
        if not _can_create_files_in(directory):
            raise ValueError(
                f"torch_dist_init_method={url!r}: the directory {str(directory)!r} is not writable by this user, "
                "so the rendezvous file cannot be created there. Choose a directory you can write to."
            )
        return f"file://{path}/" if is_directory else f"file://{path}"

    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
        path = Path(urlsplit(url).path)
        rank = cluster_environment.global_rank()
        claim = _claim_rendezvous_file(url, path, rank)
        # torch's FileStore would create the file world-readable; creating it first (every rank, before any
        # rank's FileStore opens it) keeps it private to the user. O_CREAT never changes an existing file's mode.
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        return Rendezvous(url, file=path, claim=claim)


def is_rendezvous_directory(url: Optional[str]) -> bool:
    """Whether ``url`` (validated) is ``file:///DIR/``, to be resolved to one file per launch."""
    return url is not None and url.startswith("file://") and url.endswith("/")


def rendezvous_file_for_job(directory_url: str, identity: str) -> str:
    """``file:///DIR/ldh-rendezvous-<identity>``: the identity made a file name, plus a hash of it.

    >>> rendezvous_file_for_job("file:///shared/rdzv/", "SLURM_JOB_ID=42,SLURM_STEP_ID=0")
    'file:///shared/rdzv/ldh-rendezvous-SLURM_JOB_ID-42-SLURM_STEP_ID-0-a03f6c3c'
    """
    readable = re.sub(r"[^A-Za-z0-9_.]+", "-", identity)[:150]
    # Two identities that differ only in characters a file name cannot hold stay apart.
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    return f"{directory_url}ldh-rendezvous-{readable}-{digest}"


def _claim_path(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.name}.rank{rank}.claim")


def ranks_without_claims(path: Path, world_size: int) -> list[int]:
    """The ranks that never reached this launch's rendezvous file: each rank claims it first thing."""
    return [rank for rank in range(world_size) if not _claim_path(path, rank).exists()]


def _claim_rendezvous_file(url: str, path: Path, rank: int) -> Path:
    claim = _claim_path(path, rank)
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        if path.exists():
            raise RuntimeError(
                f"torch_dist_init_method={url!r}: rank {rank} found {claim} and {path} left by an earlier run with "
                "the same job identity that did not finish cleanly (or another run with this identity is using "
                "them now). A reused rendezvous file deadlocks or connects the wrong processes, so this run stops. "
                f"Once no run uses them, remove {path} and {path}.rank*.claim, then start again."
            ) from None
    return claim


class MpiInitMethod(AddresslessInitMethod):
    """``mpi://``: rank and world size come from the MPI launcher; no store to meet through, nobody listens.

    Only the MPI backends (``"mpi"``, ``"mpi4py"``) can use it; ``ProcessGroupConfig`` checks that.
    """

    scheme = "mpi"
    where_ranks_meet = "rank and world size come from mpirun. Use 'mpi://'."

    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
        return Rendezvous("mpi://")


_REGISTRY: dict[str, InitMethod] = {}


def register_init_method(handler: InitMethod) -> None:
    """Make ``torch_dist_init_method`` accept URLs of ``handler.scheme`` (replacing any earlier handler)."""
    _REGISTRY[handler.scheme] = handler


for _handler in (EnvInitMethod(), TcpInitMethod(), FileInitMethod(), MpiInitMethod()):
    register_init_method(_handler)


def validate_init_method(url: str) -> str:
    """Check ``url`` before any process starts; return the form to keep.

    >>> validate_init_method("tcp://127.0.0.1:29500")
    'tcp://127.0.0.1:29500'
    """
    if not isinstance(url, str):
        raise TypeError(f"torch_dist_init_method must be a string or None, got {url!r} ({type(url).__name__}).")
    parts = urlsplit(url.strip())
    handler = _REGISTRY.get(parts.scheme.lower())
    if handler is None:
        problem = f"has an unknown scheme {parts.scheme!r}" if parts.scheme else "has no scheme"
        raise ValueError(
            f"torch_dist_init_method={url!r} {problem}. Use one of: "
            f"{', '.join(scheme + '://' for scheme in sorted(_REGISTRY))} (or None for Lightning's default)."
        )
    return handler.validate(url.strip(), parts)


def prepare_rendezvous(url: Optional[str], cluster_environment: ClusterEnvironment) -> Rendezvous:
    """On one rank: get ready to meet the others through ``url`` (None means Lightning's ``env://``)."""
    url = url or "env://"
    return _REGISTRY[urlsplit(url).scheme.lower()].prepare(url, cluster_environment)
