"""An MPI backend (``torch_dist_backend`` in ``MPI_BACKENDS``): mpi4py importable, and no needless listening socket.

The MPI transport needs mpi4py on every rank, or the process group cannot form. Once formed, ranks on one node need
no listening TCP socket (shared memory carries their messages), so one that MPI opened (Open MPI's tcp transport)
fails, naming the option that closes it; across nodes it only warns, as MPI may need TCP there. A socket the rank
inherited from its launcher is named apart, since no MPI option removes it. Under any other backend these checks
give no verdict (None).
"""

from __future__ import annotations

from typing import Any

from lightning_dist_hooks.backends import MPI_BACKENDS
from lightning_dist_hooks.doctor.checks.verdict import FAIL, OK, WARN, Verdict
from lightning_dist_hooks.listening_sockets import is_launchers


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
    """Under an MPI backend nothing needs to listen on one node; Open MPI's tcp transport listens unless excluded.

    A socket a rank inherited from its launcher (slurmstepd's PMIx server under ``srun --mpi=pmix``) is neither
    MPI's nor one the user can exclude: it is named, never failed. ``ranks`` holds each rank's ``"listening"``
    entries (``{"socket": ..., "opened_by": ...}``).

    >>> check_mpi_sockets("gloo", [], spans_nodes=False) is None
    True
    >>> launchers = {"socket": "0.0.0.0:35929", "opened_by": "inherited from the launcher (slurmstepd, pid 7)"}
    >>> check_mpi_sockets("mpi", [{"rank": 0, "listening": [launchers]}], spans_nodes=False).status
    'ok'
    """
    if backend not in MPI_BACKENDS:
        return None
    opened = {rank["rank"]: [each["socket"] for each in _not_launchers(rank)] for rank in ranks if _not_launchers(rank)}
    inherited = _launchers_sockets(ranks)
    if not opened:
        if inherited:
            return Verdict(
                "mpi-sockets",
                OK,
                f"torch_dist_backend={backend!r}: no rank opened a listening TCP socket; the ranks hold only their "
                f"launcher's, which MPI did not open: {inherited}",
            )
        return Verdict("mpi-sockets", OK, f"torch_dist_backend={backend!r}: no rank holds a listening TCP socket")
    shown = "; ".join(f"rank {rank}: {', '.join(sockets)}" for rank, sockets in sorted(opened.items()))
    # Named so that the user does not take the launcher's socket for one the fix below removes.
    besides = f"; besides, the launcher's, which MPI did not open: {inherited}" if inherited else ""
    if spans_nodes:
        return Verdict(
            "mpi-sockets",
            WARN,
            f"torch_dist_backend={backend!r}: ranks listen ({shown}): the MPI "
            f"library's transport between nodes, reachable from other nodes{besides}",
            "use a network MPI reaches without TCP (InfiniBand, e.g. --mca btl ^tcp with UCX) where the "
            "cluster has one, or restrict TCP to the job's network with --mca btl_tcp_if_include",
            ranks=sorted(opened),
        )
    return Verdict(
        "mpi-sockets",
        FAIL,
        f"torch_dist_backend={backend!r} on one node, yet ranks listen ({shown}): "
        f"the MPI library opened them (Open MPI's tcp transport), though shared memory needs none{besides}",
        "start with mpirun --mca btl self,vader (Open MPI 4; self,sm on Open MPI 5), or export OMPI_MCA_btl=self,vader",
        ranks=sorted(opened),
    )


def _not_launchers(rank: dict[str, Any]) -> list[dict[str, str]]:
    """The rank's listening sockets that it opened itself (or its MPI library did)."""
    return [each for each in rank["listening"] if not is_launchers(each["opened_by"])]


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
