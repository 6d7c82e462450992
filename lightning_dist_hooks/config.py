"""The two Trainer flags, checked once, before any process starts."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lightning_dist_hooks.backends import backend_flag, normalize_backend
from lightning_dist_hooks.init_methods import (
    LIGHTNING_DEFAULT,
    InitMethod,
    default_init_method_for,
    init_method_handler,
    resolve_init_method,
    validate_init_method,
)

if TYPE_CHECKING:  # either Lightning package's; this module imports neither
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment


@dataclass(frozen=True)
class ProcessGroupConfig:
    """``torch_dist_backend`` and ``torch_dist_init_method`` after validation; None keeps Lightning's choice."""

    backend: str | None = None
    init_method: str | None = None
    # torch_dist_backend as the user wrote it (e.g. "mpi" for backend "mpi4py"), for messages only.
    given_backend: str | None = field(default=None, compare=False)

    @classmethod
    def validated(cls, backend: str | None, init_method: str | None) -> ProcessGroupConfig:
        """Check both values; raise ``ValueError``/``TypeError`` naming the bad one and the fix."""
        given = backend
        backend = None if backend is None else normalize_backend(backend)
        if init_method is None:
            init_method = default_init_method_for(backend)
        else:
            init_method = validate_init_method(init_method)
            init_method_handler(init_method).check_backend(init_method, backend)
        return cls(backend=backend, init_method=init_method, given_backend=given)

    @property
    def backend_flag(self) -> str:
        """``torch_dist_backend=...`` as messages show it: as the user wrote it, e.g. ``torch_dist_backend='mpi'
        (the mpi4py transport)``."""
        return "torch_dist_backend=None" if self.backend is None else backend_flag(self.backend, self.given_backend)

    def resolved(self, cluster_environment: ClusterEnvironment, num_nodes: int) -> ProcessGroupConfig:
        """This config with the init method every rank of this launch uses (e.g. ``file:///DIR/`` named)."""
        if self.init_method is None:
            return self
        return replace(self, init_method=resolve_init_method(self.init_method, cluster_environment, num_nodes))

    @property
    def handler(self) -> InitMethod:
        """The handler of ``init_method``'s scheme (``env://``'s for Lightning's default): every question about the
        rendezvous is asked of it."""
        return init_method_handler(self.init_method or LIGHTNING_DEFAULT)

    @property
    def location(self) -> str | None:
        """Where the ranks really meet (``init_method`` after its scheme's moves), or None for Lightning's default."""
        return None if self.init_method is None else self.handler.location(self.init_method)

    @property
    def is_default(self) -> bool:
        return self.backend is None and self.init_method is None
