"""Who opened each listening TCP socket the doctor finds on a rank: as the job's own warning says it
(:func:`lightning_dist_hooks.listening_sockets.who_opened`), and, for a socket no opener claimed, whether it was
already there before the rendezvous."""

from __future__ import annotations

from lightning_dist_hooks.listening_sockets import UNKNOWN_OPENER, ListeningSocket, who_opened


def opened_by(
    socket: ListeningSocket, before: set[str], store_port: int | None, opened_earlier_by: str | None = None
) -> str:
    """Who most likely opened this process's listening ``socket``.

    ``before`` holds the inodes that were listening before the rendezvous; ``store_port`` is rank 0's TCPStore port
    (None on other ranks); ``opened_earlier_by``, who a transport says opened the sockets held before the rendezvous
    (``Transport.opened_before_rendezvous``), if one does. A socket that the rendezvous did not need is what the
    doctor's verdicts point at.

    >>> opened_by(ListeningSocket("0.0.0.0", 29500, "no-such-inode"), before=set(), store_port=29500)
    "torch's TCPStore, the rendezvous store rank 0 serves"
    """
    attribution = who_opened(socket, store_port)
    if attribution != UNKNOWN_OPENER or socket.inode not in before:
        return attribution
    return opened_earlier_by or "open before the rendezvous (the launcher's library or the program)"
