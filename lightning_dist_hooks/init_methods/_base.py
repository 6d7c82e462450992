"""What every ``torch_dist_init_method`` handler is, and the registry that maps a URL scheme to one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, urlsplit

from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.torch_rendezvous import RendezvousHandler, register_once

if TYPE_CHECKING:  # either Lightning package's; this module imports neither
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment


# What Lightning itself uses when torch_dist_init_method is None.
LIGHTNING_DEFAULT = "env://"


@dataclass(frozen=True)
class Rendezvous:
    """What one rank uses to meet the others: ``init_method`` is passed to ``setup_distributed_backend``.

    A handler that keeps state between :meth:`InitMethod.prepare` and :meth:`InitMethod.finish` (files it made,
    a helper process) returns a subclass carrying it.
    """

    init_method: str


class InitMethod:
    """A scheme handler: the life of one rendezvous. Subclasses set ``scheme`` and override the steps they need; every
    step has a default.

    The steps, in the order they run:

    * :meth:`validate` in ``Trainer(...)``, before any process starts: syntax and local checks;
    * :meth:`check_backend` right after, with the validated ``torch_dist_backend``;
    * :meth:`resolve` in ``Trainer(...)`` once the cluster environment is known: the URL every rank will use;
    * :meth:`prepare` on each rank, just before the process group is created (first, where the scheme is new to
      torch, :meth:`torch_rendezvous_handler` is registered with torch, once per process);
    * :meth:`waiting_for` while it waits, and :meth:`missing_ranks` when it timed out, for the messages;
    * :meth:`finish` on each rank at exit, after the process group is destroyed.

    The doctor's questions about where a rendezvous meets are a separate, optional contract:
    :class:`RendezvousDiagnostics`.

    Example, a scheme that reads the address of rank 0 from a file written by the job script::

        class HostFileInitMethod(InitMethod):
            scheme = "hostfile"

            def prepare(self, url, cluster_environment):
                host = Path(urlsplit(url).path).read_text().strip()
                return Rendezvous(f"tcp://{host}:29500")

        register_init_method(HostFileInitMethod())
    """

    scheme: str = ""
    # How a URL of the scheme is written and what it does, in one phrase: the flag's documentation (``--help``,
    # LightningCLI, the Trainer's docstring) lists the form of every registered scheme. Empty: ``"SCHEME://..."``.
    form: str = ""
    # Every rank must be started by an MPI launcher (Trainer(...) checks the launcher's variables).
    needs_mpi_launch: bool = False

    def validate(self, url: str, parts: SplitResult) -> str:
        """Return the URL to keep, or raise ``ValueError`` naming ``url`` and the fix. Default: keep ``url``."""
        return url

    def check_backend(self, url: str, backend: str | None) -> None:
        """Raise ``ValueError`` when ``url`` cannot work with ``backend`` (None: Lightning's choice)."""

    def default_for_backend(self, backend: str | None) -> str | None:
        """The URL to use when ``backend`` is chosen without an init method, if this scheme is its natural one."""
        return None

    def resolve(self, url: str, cluster_environment: ClusterEnvironment, num_nodes: int) -> str:
        """Turn ``url`` into the one every rank of this launch uses; raise ``ValueError`` if none can exist."""
        return url

    def location(self, url: str) -> str:
        """Where the ranks really meet for ``url`` (a resolved one): ``url`` itself unless this scheme moves it, as
        ``file://`` does into this user's private directory. ``trainer.torch_dist_init_method`` reports it."""
        return url

    def torch_rendezvous_handler(self) -> RendezvousHandler | None:
        """The handler torch's ``init_process_group`` needs for the URLs :meth:`prepare` returns, when their scheme is
        not one torch knows (``env``, ``tcp``, ``file``); see ``torch.distributed.register_rendezvous_handler``.
        Registered with torch once per process, before the first rendezvous of this scheme is prepared."""
        return None

    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
        """Get this rank ready to meet the others through ``url``. If it raises, it leaves nothing behind."""
        return Rendezvous(url)

    def waiting_for(self, rendezvous: Rendezvous, world_size: int) -> list[int] | None:
        """The ranks that have not arrived yet, while this rank waits; None when the rendezvous cannot tell."""
        return None

    def missing_ranks(self, rendezvous: Rendezvous, world_size: int, error: Exception) -> str:
        """Say which ranks never arrived, as far as this rank can tell, for a rendezvous timeout message."""
        return "which ranks are missing cannot be known from this rank"

    def finish(self, rendezvous: Rendezvous) -> None:
        """Undo what :meth:`prepare` set up; runs at exit, after the process group is destroyed."""


class RendezvousDiagnostics:
    """The doctor's questions about where the ranks of a scheme meet (``python -m lightning_dist_hooks.doctor``).

    Optional: a scheme handler that also subclasses this class answers them; the defaults fit a scheme that meets
    through something no check can see. A handler that defines some of these members without subclassing is asked
    those (:func:`diagnostics_of`)::

        class ScratchInitMethod(InitMethod, RendezvousDiagnostics):
            scheme = "scratch"
            needs_file_locks = True  # meets through torch's FileStore

            def shared_directory(self, url):
                return Path(urlsplit(url).path)
    """

    # The rendezvous takes file locks in its directory (the doctor checks that flock works there).
    needs_file_locks: bool = False

    def shared_directory(self, url: str) -> Path | None:
        """The directory named by ``url`` that every node must share (the doctor checks who controls it), or None."""
        return None

    def meeting_path(self, url: str) -> Path | None:
        """The file or directory the ranks of a resolved ``url`` meet through, as named (the doctor checks it is
        private and the same on every node), or None."""
        return None

    def main_address(self, url: str) -> tuple[str, int] | None:
        """Where rank 0 listens for the rendezvous of ``url`` (host, port; read on a rank after ``prepare``), or
        None when nobody listens."""
        return None

    def rank_zero_listens(self, url: str) -> bool:
        """Whether rank 0's own process opens the listener at :meth:`main_address` (the doctor checks the port is
        free first); False where a launcher's process holds it and every rank joins as a client."""
        return self.main_address(url) is not None


_DIAGNOSTIC_MEMBERS = ("needs_file_locks", "shared_directory", "meeting_path", "main_address", "rank_zero_listens")


def diagnostics_of(handler: InitMethod) -> RendezvousDiagnostics:
    """The doctor's view of ``handler``: itself where it subclasses :class:`RendezvousDiagnostics`; otherwise the
    members of it the handler defines, the defaults for the rest."""
    if isinstance(handler, RendezvousDiagnostics):
        return handler
    answers = RendezvousDiagnostics()
    for name in _DIAGNOSTIC_MEMBERS:
        if hasattr(handler, name):
            setattr(answers, name, getattr(handler, name))
    return answers


class AddresslessInitMethod(InitMethod):
    """A scheme whose whole URL is ``SCHEME://``: where the ranks meet is known from elsewhere."""

    # Completes "SCHEME:// takes no address; ..." in the error for a URL that names one: where the address
    # comes from instead, and what to write.
    address_source: str = ""

    @override
    def validate(self, url: str, parts: SplitResult) -> str:
        if parts.netloc or parts.path not in ("", "/"):
            raise ValueError(
                f"torch_dist_init_method={url!r}: {self.scheme}:// takes no address; {self.address_source}"
            )
        return f"{self.scheme}://"


_REGISTRY: dict[str, InitMethod] = {}


def register_init_method(handler: InitMethod, replace: bool = False) -> None:
    """Make ``torch_dist_init_method`` accept URLs of ``handler.scheme``.

    A scheme that has a handler already is replaced only with ``replace=True`` (as torch's
    ``register_rendezvous_handler`` refuses silent replacement)::

        register_init_method(HostFileInitMethod())
        register_init_method(MyFileInitMethod(), replace=True)  # takes file:// over
    """
    scheme = handler.scheme.lower()
    if not scheme:
        raise ValueError(f'{type(handler).__name__} sets no scheme: give the class a `scheme = "name"` attribute.')
    if scheme in _REGISTRY and not replace:
        raise ValueError(
            f"torch_dist_init_method scheme {scheme!r} already has a handler ({type(_REGISTRY[scheme]).__name__}). "
            "Pass replace=True to register_init_method to replace it."
        )
    _REGISTRY[scheme] = handler


def registered_schemes() -> list[str]:
    """The schemes ``torch_dist_init_method`` accepts, in the order they were registered (``"env"``, ...)."""
    return list(_REGISTRY)


def registered_forms() -> list[str]:
    """How a URL of each registered scheme is written (its handler's ``form``), in the order they were registered."""
    return [handler.form or f'``"{scheme}://..."``' for scheme, handler in _REGISTRY.items()]


def init_method_handler(url: str) -> InitMethod:
    """The handler registered for ``url``'s scheme (``url`` already validated)."""
    return _REGISTRY[urlsplit(url).scheme.lower()]


def validate_init_method(url: str) -> str:
    """Check ``url`` before any process starts; return the form to keep.

    >>> validate_init_method("tcp://127.0.0.1:29500")
    'tcp://127.0.0.1:29500'
    """
    if not isinstance(url, str):
        raise TypeError(f"torch_dist_init_method must be a string or None, got {url!r} ({type(url).__name__}).")
    parts = urlsplit(url.strip())
    # A scheme starts with a letter (RFC 3986); Python 3.10 still splits "127.0.0.1:1234" at its colon.
    scheme = parts.scheme if parts.scheme[:1].isalpha() else ""
    handler = _REGISTRY.get(scheme.lower())
    if handler is None:
        problem = f"has an unknown scheme {scheme!r}" if scheme else "has no scheme"
        raise ValueError(
            f"torch_dist_init_method={url!r} {problem}. Use one of: "
            f"{', '.join(scheme + '://' for scheme in sorted(_REGISTRY))} (or None for Lightning's default)."
        )
    return handler.validate(url.strip(), parts)


def default_init_method_for(backend: str | None) -> str | None:
    """The URL a registered scheme offers as ``backend``'s natural rendezvous, or None for Lightning's ``env://``.

    Whatever the order schemes were registered in: two schemes offering different defaults are an error.
    """
    offers = {url: handler for handler in _REGISTRY.values() if (url := handler.default_for_backend(backend))}
    if len(offers) > 1:
        named = ", ".join(f"{url} ({type(handler).__name__})" for url, handler in offers.items())
        raise ValueError(
            f"torch_dist_backend={backend!r}: several init methods offer to be its default ({named}). Pass "
            "torch_dist_init_method=... to choose, or register only one of those schemes."
        )
    return next(iter(offers), None)


def prepare_rendezvous(handler: InitMethod, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
    """``handler.prepare(url, ...)`` on this rank, with the scheme's torch rendezvous handler registered first."""
    torch_handler = handler.torch_rendezvous_handler()
    if torch_handler is not None:
        register_once(handler.scheme, torch_handler)
    return handler.prepare(url, cluster_environment)
