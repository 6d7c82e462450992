"""``env://`` and ``tcp://``: rank 0 runs torch's ``TCPStore`` and the other ranks connect to it."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, urlsplit

from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.init_methods._base import AddresslessInitMethod, InitMethod, Rendezvous, RendezvousDiagnostics

if TYPE_CHECKING:  # either Lightning package's; this module imports neither
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment


class TCPStoreInitMethod(InitMethod, RendezvousDiagnostics):
    """What the schemes served by a ``TCPStore`` share: how a timeout tells the missing ranks, and that rank 0
    listens (the doctor checks the port)."""

    @override
    def missing_ranks(self, rendezvous: Rendezvous, world_size: int, error: Exception) -> str:
        # Rank 0's TCPStore counts connected clients, its own included, but does not say which ranks they are.
        joined = re.search(r"(\d+)/(\d+) clients joined", str(error))
        if joined is None:
            return super().missing_ranks(rendezvous, world_size, error)
        arrived, expected = map(int, joined.groups())
        if arrived == 1:
            return f"ranks that never arrived: {list(range(1, expected))}"
        return f"{expected - arrived} of {expected} ranks never arrived (a TCP rendezvous does not say which)"


class EnvInitMethod(AddresslessInitMethod, TCPStoreInitMethod):
    """``env://``: torch reads ``MASTER_ADDR``/``MASTER_PORT``, which Lightning takes from the cluster environment."""

    scheme = "env"
    form = '``"env://"`` (rank 0 listens at the launcher\'s address and port)'
    address_source = (
        "the address comes from MASTER_ADDR and MASTER_PORT (or your cluster environment). "
        "Use 'env://', or 'tcp://HOST:PORT' to name one."
    )

    @override
    def main_address(self, url: str) -> tuple[str, int] | None:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    @override
    def rank_zero_listens(self, url: str) -> bool:
        # As torch's env:// handler: under torchrun, the agent hosts the store on MASTER_PORT and says so here.
        return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"

    @override
    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
        # Exactly what Lightning's own ``_init_dist_connection`` does before ``init_process_group``.
        os.environ["MASTER_ADDR"] = cluster_environment.main_address
        os.environ["MASTER_PORT"] = str(cluster_environment.main_port)
        return Rendezvous("env://")


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


class TcpInitMethod(TCPStoreInitMethod):
    """``tcp://HOST:PORT``: rank 0 listens on HOST:PORT, the other ranks connect to it."""

    scheme = "tcp"
    form = '``"tcp://HOST:PORT"`` (rank 0 listens there)'

    @override
    def main_address(self, url: str) -> tuple[str, int] | None:
        parts = urlsplit(url)
        return parts.hostname or "", int(parts.port or 0)

    @override
    def validate(self, url: str, parts: SplitResult) -> str:
        host = parts.hostname or ""
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is None or not 0 < port < 65536:
            raise ValueError(
                f"torch_dist_init_method={url!r} needs a port between 1 and 65535 that rank 0 can listen on, "
                "e.g. 'tcp://10.0.0.1:29500'."
            )
        if not (_is_ip_address(host) or _HOSTNAME.match(host)):
            raise ValueError(
                f"torch_dist_init_method={url!r}: {host!r} is not a host name or IP address. "
                "Give rank 0's address, e.g. 'tcp://10.0.0.1:29500' or 'tcp://node001:29500'."
            )
        # Every rank builds its Trainer, so a host one node cannot resolve fails there at once, not after the
        # timeout inside torch's store client.
        problem = _resolution_problem(host, port)
        if problem is not None:
            raise ValueError(
                f"torch_dist_init_method={url!r}: the host {host!r} does not resolve on {socket.gethostname()} "
                f"({problem}). Give rank 0's IP address or a name every node resolves (check /etc/hosts and DNS), "
                "e.g. 'tcp://10.0.0.1:29500'."
            )
        return url

    @override
    def prepare(self, url: str, cluster_environment: ClusterEnvironment) -> Rendezvous:
        # Under torchrun, TORCHELASTIC_USE_AGENT_STORE=True makes init_process_group take tcp://HOST:PORT for the
        # agent's own store and connect every rank, rank 0 too, as a client: nobody would listen on the port named
        # here, and all ranks would wait until the timeout. tcp://HOST:PORT means rank 0 listens there.
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        return Rendezvous(url)


def _resolution_problem(host: str, port: int) -> str | None:
    """Why ``host`` does not resolve here (the resolver's words), or None when it does.

    >>> _resolution_problem("127.0.0.1", 29500) is None
    True
    """
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        return getattr(error, "strerror", None) or str(error)
    return None


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
