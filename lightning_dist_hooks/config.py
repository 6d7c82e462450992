"""The two Trainer flags, checked once, before any process starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lightning_dist_hooks.backends import MPI_BACKENDS, normalize_backend
from lightning_dist_hooks.init_methods import validate_init_method


@dataclass(frozen=True)
class ProcessGroupConfig:
    """``torch_dist_backend`` and ``torch_dist_init_method`` after validation; None keeps Lightning's choice."""

    backend: Optional[str] = None
    init_method: Optional[str] = None

    @classmethod
    def validated(cls, backend: Optional[str], init_method: Optional[str]) -> "ProcessGroupConfig":
        """Check both values; raise ``ValueError``/``TypeError`` naming the bad one and the fix."""
        backend = None if backend is None else normalize_backend(backend)
        init_method = None if init_method is None else validate_init_method(init_method)
        uses_mpi = backend in MPI_BACKENDS
        if init_method == "mpi://" and not uses_mpi:
            raise ValueError(
                f"torch_dist_init_method='mpi://' needs an MPI backend, but torch_dist_backend={backend!r} "
                "rendezvous through a store that mpi:// does not provide. Use torch_dist_backend='mpi', or another "
                "init method."
            )
        if uses_mpi and init_method is None:
            # MPI already knows every rank: meeting through a TCP store would only add a listener.
            init_method = "mpi://"
        return cls(backend=backend, init_method=init_method)

    @property
    def is_default(self) -> bool:
        return self.backend is None and self.init_method is None
