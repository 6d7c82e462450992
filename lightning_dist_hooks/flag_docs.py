"""The two flags as a user reads them: their documentation, written from the registries, and their parameters.

``--help``, LightningCLI and the Trainer's and Fabric's docstrings show these, and the README's and
docs/reference.md's flag tables are :func:`flags_table` (``tests/test_docs.py`` checks both pages); the lists of
backends and of rendezvous schemes come from what is registered when this module is imported (the built-in schemes,
``dir://`` and ``mpi://`` included, and the transports), so the documentation cannot fall behind a new scheme or
transport.
"""

from __future__ import annotations

from typing import Optional

from lightning_dist_hooks.init_methods import default_init_method_for, registered_forms
from lightning_dist_hooks.signatures import keyword_parameter
from lightning_dist_hooks.transports import registered_transport_forms, registered_transport_names


def _backend_accepts() -> str:
    return (
        f"the ``torch.distributed`` backend: {', '.join(registered_transport_forms())}, a composite such as "
        '``"cpu:gloo,cuda:nccl"``, or a name registered with ``lightning_dist_hooks.register_transport`` or '
        "``torch.distributed.Backend.register_backend``; case-insensitive"
    )


def _init_method_accepts() -> str:
    return f"how ranks meet: {'; '.join(registered_forms())}"


def _init_method_default() -> str:
    """Lightning's ``env://``, or the scheme a registered handler offers as a backend's own."""
    offered: dict[str, list[str]] = {}
    for backend in registered_transport_names():
        url = default_init_method_for(backend)
        if url is not None:
            offered.setdefault(url, []).append(f'``"{backend}"``')
    own = "".join(f"; ``{url}`` for {' and '.join(backends)}" for url, backends in offered.items())
    return f"Lightning's ``env://`` with the address and port of the cluster environment{own}"


# What each flag accepts, and what None, its default, keeps.
FLAG_VALUES = {
    "torch_dist_backend": (
        _backend_accepts(),
        "Lightning's choice: nccl on CUDA, gloo on CPU, or the strategy's ``process_group_backend``",
    ),
    "torch_dist_init_method": (_init_method_accepts(), _init_method_default()),
}

FLAG_DOCS = {name: f"{accepts}. None keeps {default}." for name, (accepts, default) in FLAG_VALUES.items()}

# The same, as keyword-only parameters of the generated signatures. typing.Optional, not `str | None`: a runtime
# annotation, shown by `--help` and LightningCLI next to Lightning's own (typing's).
FLAG_PARAMETERS = {name: keyword_parameter(name, Optional[str]) for name in FLAG_DOCS}  # noqa: UP045 - see above


def flags_table() -> str:
    """The flags' table in Markdown, as the README and docs/reference.md hold it between their markers.

    >>> print(flags_table().splitlines()[0])
    | flag | accepts | `None` (default) keeps |
    """
    rows = [f"| `{name}` | {accepts} | {default} |" for name, (accepts, default) in FLAG_VALUES.items()]
    table = "\n".join(["| flag | accepts | `None` (default) keeps |", "|---|---|---|", *rows])
    return table.replace("``", "`") + "\n"
