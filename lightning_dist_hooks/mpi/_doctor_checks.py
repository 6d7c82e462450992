"""The MPI transport's doctor checks, for an MPI backend (``torch_dist_backend`` in ``MPI_BACKENDS``) or launcher:
mpi4py importable, and no needless listening socket.

The MPI transport needs mpi4py on every rank, or the process group cannot form. Once formed, ranks on one node need
no listening TCP socket (shared memory carries MPI's messages), so one that MPI opened (Open MPI's tcp transport)
fails, naming the option that closes it, under any torch backend an MPI launcher started (gloo + ``mpi://`` too);
across nodes it only warns, as MPI may need TCP there. A TCP rendezvous store under an MPI launch warns, naming
``mpi://``. A socket the rank inherited from its launcher is named apart, since no option removes it. Without MPI
these checks give no verdict (None).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_dist_hooks.listening_sockets import TCP_STORE, is_launchers, is_mpi_librarys
from lightning_dist_hooks.mpi._registration import MPI_BACKENDS
from lightning_dist_hooks.verdict import FAIL, OK, WARN, Verdict


def check_mpi4py(backend: str | None, mpi4py_installed: bool, install_hint: str) -> Verdict | None:
    if backend not in MPI_BACKENDS:
        return None
    if mpi4py_installed:
        return Verdict("mpi4py", OK, f"mpi4py is installed for torch_dist_backend={backend!r}")
    return Verdict(
        "mpi4py",
        FAIL,
        f"torch_dist_backend={backend!r} needs mpi4py, which this Python cannot import",
        f"{install_hint}, in the environment every rank runs",
    )


def check_mpi_sockets(backend: str | None, ranks: list[dict[str, Any]], spans_nodes: bool) -> Verdict | None:
    """Under an MPI backend or launcher, nothing needs to listen on one node: Open MPI's tcp transport listens unless
    excluded, and a TCP rendezvous store listens although MPI knows every rank.

    Each socket is judged by who opened it (``"opened_by"``, ``listening_sockets.who_opened``), so that the fix
    matches the cause: ``--mca btl self,vader`` for the MPI library's, ``mpi://`` for the TCP store's. A socket a
    rank inherited from its launcher (slurmstepd's PMIx server under ``srun --mpi=pmix``) is neither MPI's nor one
    the user can close: it is named, never failed; the backend's own (gloo's) are the backend's business. ``ranks``
    holds each rank's ``"listening"`` entries (``{"socket": ..., "opened_by": ...}``) and ``"mpi_launched"``.

    >>> check_mpi_sockets("gloo", [], spans_nodes=False) is None
    True
    >>> launchers = {"socket": "0.0.0.0:35929", "opened_by": "inherited from the launcher (slurmstepd, pid 7)"}
    >>> check_mpi_sockets("mpi", [{"rank": 0, "listening": [launchers]}], spans_nodes=False).status
    'ok'
    """
    if backend not in MPI_BACKENDS and not any(rank.get("mpi_launched") for rank in ranks):
        return None
    by_mpi = _opened(ranks, is_mpi_librarys)
    by_store = _opened(ranks, lambda opener: opener == TCP_STORE)
    inherited = _launchers_sockets(ranks)
    if not by_mpi and not by_store:
        if inherited:
            return Verdict(
                "mpi-sockets",
                OK,
                f"torch_dist_backend={backend!r}: neither MPI nor a rendezvous store opened a listening TCP socket; "
                f"the ranks hold their launcher's, which MPI did not open: {inherited}",
            )
        return Verdict(
            "mpi-sockets", OK, f"torch_dist_backend={backend!r}: neither MPI nor a rendezvous store opened a listening "
            "TCP socket"
        )  # fmt: skip
    # Named so that the user does not take the launcher's socket for one the fixes below remove.
    besides = f"; besides, the launcher's, which MPI did not open: {inherited}" if inherited else ""
    findings, fixes, status = [], [], WARN
    if by_mpi and spans_nodes:
        findings.append(f"ranks listen ({_shown(by_mpi)}): the MPI library's transport between nodes, reachable from "
                        "other nodes")  # fmt: skip
        fixes.append("use a network MPI reaches without TCP (InfiniBand, e.g. --mca btl ^tcp with UCX) where the "
                     "cluster has one, or restrict TCP to the job's network with --mca btl_tcp_if_include")  # fmt: skip
    elif by_mpi:
        status = FAIL
        findings.append(f"on one node, yet ranks listen ({_shown(by_mpi)}): the MPI library opened them (Open MPI's "
                        "tcp transport), though shared memory needs none")  # fmt: skip
        fixes.append("start with mpirun --mca btl self,vader (Open MPI 4; self,sm on Open MPI 5), or export "
                     "OMPI_MCA_btl=self,vader")  # fmt: skip
    if by_store:
        findings.append(f"rank 0 serves a TCP rendezvous store ({_shown(by_store)}), reachable by anyone who can reach "
                        "its node, though MPI already knows every rank")  # fmt: skip
        fixes.append("torch_dist_init_method='mpi://': the ranks meet over MPI, and no store listens")
    return Verdict(
        "mpi-sockets",
        status,
        f"torch_dist_backend={backend!r} {'; '.join(findings)}{besides}",
        "; ".join(fixes),
        ranks=sorted({*by_mpi, *by_store}),
    )


def _opened(ranks: list[dict[str, Any]], by: Callable[[str], bool]) -> dict[int, list[str]]:
    """Rank -> its listening sockets whose opener ``by`` accepts (ranks with none left out)."""
    found = {rank["rank"]: [each["socket"] for each in rank["listening"] if by(each["opened_by"])] for rank in ranks}
    return {rank: sockets for rank, sockets in found.items() if sockets}


def _shown(sockets: dict[int, list[str]]) -> str:
    return "; ".join(f"rank {rank}: {', '.join(each)}" for rank, each in sorted(sockets.items()))


def _launchers_sockets(ranks: list[dict[str, Any]]) -> str:
    """The launcher's sockets the ranks inherited, each once with the ranks that hold it: under srun every rank of a
    node holds the same slurmstepd socket.

    >>> held = {"socket": "0.0.0.0:35929", "opened_by": "inherited from the launcher (slurmstepd, pid 7)"}
    >>> _launchers_sockets([{"rank": 0, "listening": [held]}, {"rank": 1, "listening": [held]}])
    '0.0.0.0:35929, inherited from the launcher (slurmstepd, pid 7) by ranks [0, 1]'
    """
    holders: dict[tuple[str, str], list[int]] = {}
    for rank in ranks:
        for each in rank["listening"]:
            if is_launchers(each["opened_by"]):
                holders.setdefault((each["socket"], each["opened_by"]), []).append(rank["rank"])
    return "; ".join(
        f"{address}, {attribution} by ranks {sorted(holding)}" for (address, attribution), holding in holders.items()
    )
