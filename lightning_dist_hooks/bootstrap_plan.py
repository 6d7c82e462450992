"""The bootstrap plan: how the ranks of this launch will create their process group, decided once, before any starts.

``Trainer(...)`` and ``Fabric(...)`` build it in two steps, top to bottom, each check in one place:

1. :meth:`Flags.checked`, before Lightning builds anything: the backend is one this torch can create
   (:func:`~lightning_dist_hooks.backends.normalize_backend`), the init method's URL is well formed and its scheme has
   a handler, and the scheme accepts the backend (``InitMethod.check_backend``). A backend given without an init
   method gets the one a scheme offers as its natural rendezvous (e.g. ``mpi://``), else Lightning's ``env://``.
2. :meth:`BootstrapPlan.for_strategy`, once Lightning has chosen the strategy: the init method is resolved to the URL
   every rank of this launch uses, the backend fits the devices and agrees with the strategy's own
   ``process_group_backend``, a backend or scheme that needs an MPI launcher finds as many ranks as it started,
   and the backend every rank creates is decided.

The frozen plan rides on the strategy (``ddp_spawn`` pickles it with it); on each rank
:func:`lightning_dist_hooks.process_group.create.create_process_group` carries it out: prepare, hook, check, finish.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from lightning_dist_hooks import _lightning_internals
from lightning_dist_hooks.backends import backend_flag, check_backend_fits_devices, normalize_backend
from lightning_dist_hooks.init_methods import (
    LIGHTNING_DEFAULT,
    InitMethod,
    default_init_method_for,
    init_method_handler,
    validate_init_method,
)
from lightning_dist_hooks.mpi import check_mpi_launch
from lightning_dist_hooks.transports import transports_of

if TYPE_CHECKING:  # either Lightning package's; this module imports neither
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment, Flavour


@dataclass(frozen=True)
class InitMethodURL:
    """``torch_dist_init_method`` on its way: as given (validated), then as every rank of this launch uses it.

    >>> url = InitMethodURL.validated("tcp://127.0.0.1:29500")
    >>> url.given == url.resolved == url.location == "tcp://127.0.0.1:29500", url.handler.scheme
    (True, 'tcp')
    """

    given: str
    resolved: str

    @classmethod
    def validated(cls, url: str) -> InitMethodURL:
        """``url`` checked (``ValueError``/``TypeError`` naming it and the fix), not yet resolved."""
        checked = validate_init_method(url)
        return cls(given=checked, resolved=checked)

    @property
    def handler(self) -> InitMethod:
        """The handler of the scheme, looked up in this process's registry rather than carried: a plan pickled to a
        ``ddp_spawn`` child uses the handler registered there."""
        return init_method_handler(self.resolved)

    def resolved_for(self, cluster_environment: ClusterEnvironment, num_nodes: int) -> InitMethodURL:
        """This URL with the one every rank of this launch uses (e.g. ``file:///DIR/`` named for the launch)."""
        return replace(self, resolved=self.handler.resolve(self.given, cluster_environment, num_nodes))

    @property
    def location(self) -> str:
        """Where the ranks really meet: the resolved URL after its scheme's moves (``file://`` and ``dir://`` move the
        file into this user's private directory)."""
        return self.handler.location(self.resolved)


LIGHTNING_DEFAULT_INIT_METHOD = InitMethodURL(given=LIGHTNING_DEFAULT, resolved=LIGHTNING_DEFAULT)


@dataclass(frozen=True)
class Flags:
    """``torch_dist_backend`` and ``torch_dist_init_method`` after the checks that need nothing else; None keeps
    Lightning's choice."""

    backend: str | None = None
    init_method: InitMethodURL | None = None
    # torch_dist_backend as the user wrote it (e.g. "mpi" for backend "mpi4py"), for messages only.
    backend_as_given: str | None = field(default=None, compare=False)

    @classmethod
    def checked(cls, torch_dist_backend: str | None, torch_dist_init_method: str | None) -> Flags:
        """Check both values; raise ``ValueError``/``TypeError`` naming the bad one and the fix.

        >>> Flags.checked("GLOO", None)
        Flags(backend='gloo', init_method=None, backend_as_given='GLOO')
        """
        backend = None if torch_dist_backend is None else normalize_backend(torch_dist_backend)
        if torch_dist_init_method is None:
            offered = default_init_method_for(backend)
            init_method = None if offered is None else InitMethodURL(given=offered, resolved=offered)
        else:
            init_method = InitMethodURL.validated(torch_dist_init_method)
            init_method.handler.check_backend(init_method.given, backend)
        return cls(backend=backend, init_method=init_method, backend_as_given=torch_dist_backend)

    @property
    def backend_flag(self) -> str:
        """``torch_dist_backend=...`` as messages show it: as the user wrote it, e.g. ``torch_dist_backend='mpi'
        (the mpi4py transport)``."""
        return "torch_dist_backend=None" if self.backend is None else backend_flag(self.backend, self.backend_as_given)

    @property
    def is_default(self) -> bool:
        return self.backend is None and self.init_method is None


@dataclass(frozen=True)
class BootstrapPlan:
    """The flags fitted to the strategy Lightning built: what every rank does to create its process group."""

    flags: Flags
    # The strategy creates the default process group (DDP, FSDP, ModelParallel); otherwise the plan is only what the
    # user asked for, and nothing acts on it.
    creates_process_group: bool
    # Fabric's constructor argument; the Trainer's hook is the LightningModule's, found on each rank.
    setup_distributed_backend: Callable[..., None] | None = None
    # The backend every rank creates: the flag's, else the strategy's own process_group_backend, else Lightning's
    # choice for the devices. None where the strategy creates no process group.
    process_group_backend: str | None = None

    @classmethod
    def for_strategy(
        cls,
        flags: Flags,
        strategy: Any,
        flavour: Flavour,
        *,
        owner: str,
        setup_distributed_backend: Callable[..., None] | None = None,
        devices_left_at_auto: bool = False,
    ) -> BootstrapPlan:
        """Check ``flags`` against ``strategy`` (of a Trainer or Fabric named ``owner``); raise ``ValueError`` naming
        the conflict and the fix. ``devices_left_at_auto``: the user left ``devices`` at ``"auto"`` (the messages
        then say so rather than show a ``devices=`` the user never wrote).

        A strategy that creates no process group ignores the flags and the hook, with a warning saying so.
        """
        if not creates_process_group(strategy):
            if not flags.is_default or setup_distributed_backend is not None:
                _warn_ignored(flags, strategy, flavour, owner, setup_distributed_backend is not None)
            return cls(flags, creates_process_group=False, setup_distributed_backend=setup_distributed_backend)
        init_method = flags.init_method
        if init_method is not None:
            init_method = init_method.resolved_for(strategy.cluster_environment, num_nodes=strategy.num_nodes)
        if flags.backend is not None:
            check_backend_fits_devices(
                flags.backend, flavour.is_cuda_accelerator(strategy.accelerator), given=flags.backend_as_given
            )
            _check_one_backend_given(flags, strategy)
        needed_by = _what_needs_an_mpi_launch(flags, init_method)
        if needed_by is not None:
            check_mpi_launch(
                *needed_by,
                len(strategy.parallel_devices),
                strategy.num_nodes,
                devices_by_default=_what_auto_gave(strategy.parallel_devices) if devices_left_at_auto else None,
                owner=owner,
            )
        return cls(
            replace(flags, init_method=init_method),
            creates_process_group=True,
            setup_distributed_backend=setup_distributed_backend,
            process_group_backend=flags.backend or _lightning_internals.resolved_process_group_backend(strategy),
        )

    @property
    def backend(self) -> str | None:
        return self.flags.backend

    @property
    def init_method(self) -> InitMethodURL:
        """The init method the ranks use: the flag's, resolved, or Lightning's ``env://``."""
        return self.flags.init_method or LIGHTNING_DEFAULT_INIT_METHOD

    @property
    def location(self) -> str | None:
        """Where the ranks really meet, or None for Lightning's default: ``trainer.torch_dist_init_method``."""
        return None if self.flags.init_method is None else self.flags.init_method.location

    def takes_over(self, module_hook: Callable[..., None] | None) -> bool:
        """Whether the flags or a hook (Fabric's, else the LightningModule's ``module_hook``) make the process group
        ours; otherwise everything stays Lightning's."""
        return not self.flags.is_default or (self.setup_distributed_backend or module_hook) is not None


def creates_process_group(strategy: object) -> bool:
    """Whether ``strategy`` creates the default process group (DDP, FSDP, ModelParallel, of either side or package)."""
    flavour = _lightning_internals.flavour_of(strategy)
    return flavour is not None and isinstance(strategy, flavour.process_group_strategies(strategy))


def devices_left_at_auto(kwargs: dict[str, Any]) -> bool:
    """Whether the Trainer's or Fabric's keyword arguments leave ``devices`` at Lightning's default, ``"auto"``.

    >>> devices_left_at_auto({}), devices_left_at_auto({"devices": "auto"}), devices_left_at_auto({"devices": 2})
    (True, True, False)
    """
    devices = kwargs.get("devices", "auto")
    return isinstance(devices, str) and devices.strip().lower() == "auto"


def _what_needs_an_mpi_launch(flags: Flags, init_method: InitMethodURL | None) -> tuple[str, str] | None:
    """The flag whose transport or scheme needs its ranks started by an MPI launcher (``needs_mpi_launch``), as the
    messages name it, and what to use instead; None when neither does."""
    if flags.backend is not None and any(transport.needs_mpi_launch for transport in transports_of(flags.backend)):
        return backend_flag(flags.backend, flags.backend_as_given), "torch_dist_backend='gloo'"
    if init_method is not None and init_method.handler.needs_mpi_launch:
        return f"torch_dist_init_method={init_method.given!r}", "another init method, e.g. 'dir:///shared/rdzv/'"
    return None


def _what_auto_gave(parallel_devices: list[Any]) -> str:
    """What Lightning's ``devices="auto"`` gave on this machine, in words: ``"1 process per node on CPU"``."""
    count = len(parallel_devices)
    processes = f"{count} process{'' if count == 1 else 'es'} per node"
    kind = getattr(parallel_devices[0], "type", "cpu") if parallel_devices else "cpu"
    return f"{processes} on CPU" if kind == "cpu" else f"{processes}, one per visible {kind.upper()} device"


def _check_one_backend_given(flags: Flags, strategy: Any) -> None:
    requested = _lightning_internals.requested_process_group_backend(strategy)
    if requested is not None and requested.lower() != flags.backend:
        raise ValueError(
            f"torch_dist_backend={flags.backend!r} conflicts with {type(strategy).__name__}("
            f"process_group_backend={requested!r}). Give the backend in one place only: drop one of them."
        )


def _warn_ignored(flags: Flags, strategy: Any, flavour: Flavour, owner: str, has_hook: bool) -> None:
    given = None if flags.init_method is None else flags.init_method.given
    hook = ", setup_distributed_backend" if has_hook else ""
    flavour.rank_zero_warn(
        f"{flags.backend_flag} and torch_dist_init_method={given!r}{hook} are ignored: {type(strategy).__name__} "
        f"creates no process group. Use a multi-process strategy, e.g. {owner}(strategy='ddp', devices=2), for them "
        "to take effect."
    )
