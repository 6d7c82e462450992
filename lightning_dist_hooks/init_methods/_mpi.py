"""``mpi://``: rank and world size come from the MPI launcher, and the ranks meet through a store whose messages
travel over MPI (:class:`lightning_dist_hooks.mpi.MpiStore`): no socket is opened and no file is made, for any
backend."""

from __future__ import annotations

import re

from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks import mpi
from lightning_dist_hooks.init_methods._base import AddresslessInitMethod, Rendezvous
from lightning_dist_hooks.torch_rendezvous import RendezvousHandler


class MpiInitMethod(AddresslessInitMethod):
    """``mpi://``, for every backend; the default of the MPI backends (``"mpi"``, ``"mpi4py"``)."""

    scheme = "mpi"
    form = '``"mpi://"`` (through MPI: nobody listens, no file; ranks started by an MPI launcher)'
    needs_mpi_launch = True
    address_source = "rank and world size come from the MPI launcher (mpirun, srun --mpi=pmix, ...). Use 'mpi://'."

    @override
    def check_backend(self, url: str, backend: str | None) -> None:
        if not mpi.is_available():
            raise ValueError(
                f"torch_dist_init_method={url!r} carries the rendezvous over MPI, which needs mpi4py, and this Python "
                f"cannot import it. Install it: {mpi.INSTALL_HINT}; or use another init method, e.g. "
                "'dir:///shared/rdzv/' (a shared directory, no listening socket)."
            )

    @override
    def default_for_backend(self, backend: str | None) -> str | None:
        # MPI already knows every rank: meeting through a TCP store would only add a listener.
        return "mpi://" if backend in mpi.MPI_BACKENDS else None

    @override
    def torch_rendezvous_handler(self) -> RendezvousHandler:
        return mpi.mpi_rendezvous

    @override
    def missing_ranks(self, rendezvous: Rendezvous, world_size: int, error: Exception) -> str:
        # The store's own timeout names them, as far as the rank that keeps the key can tell.
        named = ranks_never_reached(str(error))
        if named is None:
            return super().missing_ranks(rendezvous, world_size, error)
        return f"ranks that never arrived: {named}"


def ranks_never_reached(text: str) -> str | None:
    """The list of ranks an ``MpiStore`` timeout names as never having reached its keys, or None.

    >>> ranks_never_reached("... ranks that never reached them: [2, 3].")
    '[2, 3]'
    """
    found = re.search(r"ranks that never reached them: (\[[0-9, ]*\])", text)
    return None if found is None else found.group(1)
