"""Registering a rendezvous handler with torch, once per scheme, for every URL scheme of ours torch does not know.

torch keeps one process-wide table (``torch.distributed.register_rendezvous_handler``) and refuses a second handler
for a scheme. Ours are registered when first needed, never at import, so that importing this package changes no
registry of torch's; this module is the one place that does it, for the built-in ``dir://`` and ``mpi://`` and for a
user's scheme alike (:meth:`lightning_dist_hooks.InitMethod.torch_rendezvous_handler`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import torch.distributed as dist

RendezvousHandler = Callable[..., Iterator[tuple[dist.Store, int, int]]]

_lock = threading.Lock()
_registered: set[str] = set()


def register_once(
    scheme: str,
    handler: RendezvousHandler,
    otherwise: str = "Use another init method, or do not import that package.",
) -> None:
    """Make ``init_process_group(init_method="SCHEME://...")`` use ``handler`` in this process (idempotent).

    ``otherwise`` completes the error raised when another package holds the scheme already: what to use instead.
    """
    with _lock:
        if scheme in _registered:
            return
        try:
            dist.register_rendezvous_handler(scheme, handler)
        except RuntimeError:  # torch refuses a second handler for a scheme
            raise RuntimeError(
                f"another package registered a torch.distributed rendezvous handler for {scheme}://, which "
                f"lightning_dist_hooks' {scheme}:// needs. {otherwise}"
            ) from None
        _registered.add(scheme)
