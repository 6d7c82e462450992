"""What every ``torch_dist_backend`` transport is, and the registry that maps a backend name to one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from lightning_dist_hooks.verdict import Verdict

# The entry point group a package names its transports in (a Transport instance, or a class taking no arguments):
# registered on the first look into the registry once this package is imported, in every process, the doctor's and a
# ddp_spawn child's included.
ENTRY_POINT_GROUP = "lightning_dist_hooks.transports"


@dataclass(frozen=True)
class CreatedGroup:
    """What a transport is told once the default process group exists (:meth:`Transport.after_group_created`)."""

    backend: str
    # Rank 0's rendezvous store port where rank 0 serves one (tcp://, env://), else None.
    tcp_store_port: int | None
    # Says a warning once, from rank 0 (Lightning's ``rank_zero_warn``).
    warn: Callable[[str], None]


class Transport:
    """A ``torch.distributed`` backend as this package knows it. Subclasses set ``names`` and override what they need;
    every step has a default that fits a backend torch already knows.

    What it is asked, in the order it happens:

    * in ``Trainer(...)`` (and ``Fabric(...)``): :meth:`backend_for` turns the name the user wrote into the backend
      to create, :meth:`register_with_torch` makes torch know it (once per process, never at import), ``devices``
      is checked against the accelerator and ``needs_mpi_launch`` against the launcher;
    * on each rank, :meth:`register_with_torch` again (a ``ddp_spawn`` child registered nothing yet),
      :meth:`run_started`, and once the group exists :meth:`after_group_created` (a collective, on every rank);
    * when a rank's run stops on an exception, :meth:`run_failed`;
    * in the doctor: :meth:`doctor_checks_before`, :meth:`doctor_facts` and :meth:`doctor_checks_after`, where it
      takes part; :meth:`opened_before_rendezvous`.

    Example, gloo under a name of its own (see docs/how-it-works.md, "Adding a transport")::

        class MyTransport(Transport):
            names = ("mine",)
            devices = ("cpu",)

            def register_with_torch(self, name):
                if not dist.is_backend_available("mine"):
                    dist.Backend.register_backend("mine", make_my_group, devices=["cpu"])

        register_transport(MyTransport())
    """

    # Lower case; ``torch_dist_backend`` accepts each, case-insensitively. The first is the backend torch creates.
    names: tuple[str, ...] = ()
    # How the flag's documentation (``--help``, LightningCLI, the docstrings) lists it; empty: ``"NAME"``.
    form: str = ""
    # The device types whose tensors it moves, among "cpu" and "cuda" (the accelerator is checked against them in
    # Trainer(...)); None: not checked.
    devices: tuple[str, ...] | None = None
    # Every rank must be started by an MPI launcher (Trainer(...) checks the launcher's variables).
    needs_mpi_launch: bool = False
    # Completes "To use it, ..." where this torch build lacks the backend: what to install or run instead.
    install_hint: str = ""
    # after_group_created reads who opened the ranks' listening sockets: the sockets the backend opens while the
    # group forms are then attributed to it (which reads /proc, so only where a transport asks).
    reads_listeners: bool = False

    def is_available(self) -> bool:
        """Whether this process can create the backend (before it is registered with torch too)."""
        return True

    def backend_for(self, given: str, name: str) -> str:
        """The backend to create when ``torch_dist_backend=given`` (``name``: lower-cased, one of ``names``); raise
        ``ValueError`` naming ``given`` and the fix when it cannot be created here. Default: the first of ``names``."""
        return self.names[0]

    def register_with_torch(self, name: str) -> None:
        """Make torch know the backend ``name`` (one of ``names``) in this process, e.g. with
        ``torch.distributed.Backend.register_backend``; called before each use, so it must be idempotent."""

    def takes_part(self, backend: str) -> bool:
        """Whether a job of ``backend`` (plain or composite) involves this transport, for :meth:`after_group_created`
        and the doctor. Default: the backend is one of ``names``."""
        return any(part in self.names for part in backend_parts(backend))

    def after_group_created(self, group: CreatedGroup) -> None:
        """Runs on every rank right after the default group exists, where this transport takes part: it may use
        collectives over the group."""

    def run_started(self) -> None:
        """A run starts on this rank: whatever an earlier run stopped on was handled. Every registered transport is
        told, whichever backend the run uses."""

    def run_failed(self, error: BaseException) -> None:
        """The run on this rank stopped on ``error`` and is tearing down: a transport that must end the job its own
        way (the MPI transport aborts the MPI job at exit) remembers it. Every registered transport is told."""

    def doctor_checks_before(self, backend: str | None) -> list[Verdict]:
        """The doctor's verdicts before the Trainer exists, where this transport takes part (``backend``: the
        ``--backend`` given, None for Lightning's choice)."""
        return []

    def doctor_facts(self) -> dict[str, Any]:
        """Plain values this rank adds to its facts (gathered from every rank) for :meth:`doctor_checks_after`."""
        return {}

    def doctor_checks_after(self, backend: str, ranks: list[dict[str, Any]], spans_nodes: bool) -> list[Verdict]:
        """The doctor's verdicts from every rank's facts (``ranks``), after the rendezvous."""
        return []

    def opened_before_rendezvous(self) -> str | None:
        """Who opened the listening sockets this process already held before the rendezvous and no one claimed, where
        this transport can tell (its library started before the doctor could watch), for the doctor's table; every
        registered transport is asked."""
        return None


def backend_parts(backend: str) -> list[str]:
    """The backend names in a plain or composite ``torch_dist_backend``.

    >>> backend_parts("cpu:gloo,cuda:nccl"), backend_parts("gloo")
    (['gloo', 'nccl'], ['gloo'])
    """
    return [part.split(":")[-1].strip() for part in backend.split(",")]


_REGISTRY: dict[str, Transport] = {}
_registration_lock = threading.Lock()
_entry_points_loaded = False


def register_transport(transport: Transport, replace: bool = False) -> None:
    """Make ``torch_dist_backend`` accept ``transport``'s names, with its early checks, doctor rows and failure hooks.

    A name that has a transport already is taken over only with ``replace=True``::

        register_transport(MyTransport())
        register_transport(MyGlooTransport(), replace=True)  # takes "gloo" over
    """
    names = [name.lower() for name in transport.names]
    if not names:
        raise ValueError(f'{type(transport).__name__} sets no names: give the class a `names = ("name",)` attribute.')
    taken = [name for name in names if name in _REGISTRY and _REGISTRY[name] is not transport]
    if taken and not replace:
        raise ValueError(
            f"torch_dist_backend {taken[0]!r} already has a transport ({type(_REGISTRY[taken[0]]).__name__}). "
            "Pass replace=True to register_transport to replace it."
        )
    for name in names:
        _REGISTRY[name] = transport


def _load_entry_points() -> None:
    global _entry_points_loaded
    with _registration_lock:
        if _entry_points_loaded:
            return
        _entry_points_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except Exception as error:  # an installed package's mistake: named, or every backend lookup fails unexplained
            raise RuntimeError(
                f"The {ENTRY_POINT_GROUP} entry point {entry.name} = {entry.value!r} cannot be loaded "
                f"({type(error).__name__}: {error}). Fix or uninstall the package that declares it."
            ) from error
        register_transport(loaded() if isinstance(loaded, type) else loaded)


def transport_named(name: str) -> Transport | None:
    """The transport registered for the plain backend ``name`` (case-insensitive), or None."""
    _load_entry_points()
    return _REGISTRY.get(name.strip().lower())


def _registered_so_far() -> list[Transport]:
    # Without the entry points: the flags' documentation is written while this package is imported, and a package
    # named there may import this one.
    return list(dict.fromkeys(_REGISTRY.values()))


def registered_transports() -> list[Transport]:
    """Every registered transport once, in the order they were registered."""
    _load_entry_points()
    return _registered_so_far()


def registered_transport_forms() -> list[str]:
    """How each transport registered so far (the entry points not loaded) is written in the flag's documentation
    (its ``form``), in registration order."""
    return [transport.form or f'``"{transport.names[0]}"``' for transport in _registered_so_far()]


def registered_transport_names() -> list[str]:
    """The first name of each transport registered so far (the entry points not loaded), in registration order."""
    return [transport.names[0] for transport in _registered_so_far()]


def transports_of(backend: str) -> list[Transport]:
    """The registered transports a plain or composite ``backend`` names, each once."""
    found = (transport_named(part) for part in backend_parts(backend))
    return list(dict.fromkeys(transport for transport in found if transport is not None))


def transports_taking_part(backend: str) -> list[Transport]:
    """The registered transports that take part in a job of ``backend`` (:meth:`Transport.takes_part`)."""
    return [transport for transport in registered_transports() if transport.takes_part(backend)]


def register_backend_with_torch(backend: str | None) -> None:
    """Make torch know every registered transport ``backend`` (plain or composite) names, in this process.

    Importing this package registers nothing with torch; a transport is registered when it is first asked for: when
    the Trainer checks ``torch_dist_backend``, and on every rank before its process group is created (a
    ``ddp_spawn`` child, or a strategy given ``process_group_backend=...`` directly, never checks a flag).
    """
    if backend is None:
        return
    for part in backend_parts(backend.lower()):
        transport = transport_named(part)
        if transport is not None:
            transport.register_with_torch(part)


def announce_run_started() -> None:
    """A new run starts on this rank: every registered transport hears it (:meth:`Transport.run_started`)."""
    for transport in registered_transports():
        transport.run_started()


def announce_failure(error: BaseException) -> None:
    """The run on this rank stopped on ``error``: every registered transport hears it (:meth:`Transport.run_failed`)."""
    for transport in registered_transports():
        transport.run_failed(error)
