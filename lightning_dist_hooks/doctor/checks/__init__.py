"""The doctor's checks: each turns facts into a :class:`Verdict` that says what is wrong and how to fix it.

Checks before the rendezvous need only this rank; they still give their verdict when the rendezvous fails. Checks
after it read the facts every rank gathered (``ranks``: one dict per rank, see ``facts.rank_facts``). One concern
per module (a transport's own checks are its ``Transport.doctor_checks_before`` and ``doctor_checks_after``):

* ``verdict``: the :class:`Verdict` every check gives, and :func:`merge`, the verdicts of all ranks as one list;
* ``layout``: processes per node and nodes against ``devices`` and ``num_nodes``;
* ``privacy``: the rendezvous directory and file, safe from other users;
* ``shared_filesystem``: the rendezvous directory, one directory on every node, with file locks where needed;
* ``network``: rank 0's main address and port, gloo's interface, what host names resolve to;
* ``allreduce``: the all-reduce's sum, correct on every rank.
"""

from lightning_dist_hooks.doctor.checks.allreduce import check_allreduce
from lightning_dist_hooks.doctor.checks.layout import check_hosts, check_launcher_layout
from lightning_dist_hooks.doctor.checks.network import (
    check_host_names,
    check_interfaces,
    check_main_address,
    check_main_port,
)
from lightning_dist_hooks.doctor.checks.privacy import check_directory_privacy, check_file_privacy
from lightning_dist_hooks.doctor.checks.shared_filesystem import check_all_tokens, check_file_locking, check_tokens
from lightning_dist_hooks.doctor.checks.verdict import FAIL, OK, WARN, Verdict, merge

__all__ = [
    "FAIL",
    "OK",
    "WARN",
    "Verdict",
    "check_all_tokens",
    "check_allreduce",
    "check_directory_privacy",
    "check_file_locking",
    "check_file_privacy",
    "check_host_names",
    "check_hosts",
    "check_interfaces",
    "check_launcher_layout",
    "check_main_address",
    "check_main_port",
    "check_tokens",
    "merge",
]
