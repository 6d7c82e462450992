"""``mpi://``: rank and world size come from the MPI launcher; no store to meet through, nobody listens."""

from __future__ import annotations

from lightning_dist_hooks.backends import MPI_BACKENDS
from lightning_dist_hooks.init_methods._base import AddresslessInitMethod


class MpiInitMethod(AddresslessInitMethod):
    """``mpi://``, for the MPI backends (``"mpi"``, ``"mpi4py"``) only, and their default."""

    scheme = "mpi"
    needs_mpi_launch = True
    address_source = "rank and world size come from mpirun. Use 'mpi://'."

    def check_backend(self, url: str, backend: str | None) -> None:
        if backend not in MPI_BACKENDS:
            raise ValueError(
                f"torch_dist_init_method={url!r} needs an MPI backend, but torch_dist_backend={backend!r} "
                f"rendezvous through a store that {url} does not provide. Use torch_dist_backend='mpi', or another "
                "init method."
            )

    def default_for_backend(self, backend: str | None) -> str | None:
        # MPI already knows every rank: meeting through a TCP store would only add a listener.
        return "mpi://" if backend in MPI_BACKENDS else None
