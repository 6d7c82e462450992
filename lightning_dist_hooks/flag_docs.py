"""The two flags as a user reads them: their documentation, written from the registries, and their parameters.

``--help``, LightningCLI and the Trainer's and Fabric's docstrings show these; the lists of backends and of
rendezvous schemes come from what is registered when this module is imported (the built-in schemes, ``dir://`` and
``mpi://`` included, and the transports), so the documentation cannot fall behind a new scheme or transport.
"""

from __future__ import annotations

from typing import Optional

from lightning_dist_hooks.init_methods import registered_forms
from lightning_dist_hooks.signatures import keyword_parameter
from lightning_dist_hooks.transports import registered_transport_forms


def _backend_doc() -> str:
    return (
        f"the ``torch.distributed`` backend: {', '.join(registered_transport_forms())} or a registered name; "
        "case-insensitive. None keeps Lightning's choice: nccl on CUDA, gloo on CPU, or the strategy's "
        "``process_group_backend``."
    )


def _init_method_doc() -> str:
    return (
        f"how ranks meet: {'; '.join(registered_forms())}. None keeps Lightning's ``env://`` with the address and "
        "port of the cluster environment."
    )


FLAG_DOCS = {"torch_dist_backend": _backend_doc(), "torch_dist_init_method": _init_method_doc()}

# The same, as keyword-only parameters of the generated signatures. typing.Optional, not `str | None`: a runtime
# annotation, shown by `--help` and LightningCLI next to Lightning's own (typing's).
FLAG_PARAMETERS = {name: keyword_parameter(name, Optional[str]) for name in FLAG_DOCS}  # noqa: UP045 - see above
