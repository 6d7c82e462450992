"""``torch_dist_backend`` values: one transport per backend, looked up in a registry.

A transport (:class:`Transport`) says which names it answers to and what they become, which devices it serves,
whether its ranks need an MPI launcher, how torch learns of it (registered when first asked for, never at import),
what it does once the group exists and when a rank fails, and what the doctor should check. Like
:mod:`lightning_dist_hooks.init_methods`, new transports plug in with :func:`register_transport`, or through the
``lightning_dist_hooks.transports`` entry point group; torch's own backends and the MPI transport use nothing a
registered transport could not.
"""

from lightning_dist_hooks.transports._base import (
    ENTRY_POINT_GROUP,
    CreatedGroup,
    Transport,
    announce_failure,
    announce_run_started,
    backend_parts,
    register_backend_with_torch,
    register_transport,
    registered_transport_forms,
    registered_transport_names,
    registered_transports,
    transport_named,
    transports_of,
    transports_taking_part,
)
from lightning_dist_hooks.transports._mpi import MpiTransport, TorchMpiTransport
from lightning_dist_hooks.transports._native import GLOO, NCCL, UCC, XCCL, NativeTransport

# In the order the flag's documentation lists them.
for _transport in (GLOO, NCCL, TorchMpiTransport(), UCC, XCCL, MpiTransport()):
    register_transport(_transport)

__all__ = [
    "ENTRY_POINT_GROUP",
    "CreatedGroup",
    "MpiTransport",
    "NativeTransport",
    "TorchMpiTransport",
    "Transport",
    "announce_failure",
    "announce_run_started",
    "backend_parts",
    "register_backend_with_torch",
    "register_transport",
    "registered_transport_forms",
    "registered_transport_names",
    "registered_transports",
    "transport_named",
    "transports_of",
    "transports_taking_part",
]
