"""The doctor's checks and reading of /proc, on facts given directly (no processes started)."""

from __future__ import annotations

import os
import socket

import pytest

from lightning_dist_hooks.doctor.checks import (
    FAIL,
    OK,
    WARN,
    Verdict,
    check_directory_privacy,
    check_hosts,
    check_launcher_layout,
    merge,
)
from lightning_dist_hooks.doctor.facts import LauncherLayout, expand_slurm_counts
from lightning_dist_hooks.doctor.gathered import gathered_verdicts
from lightning_dist_hooks.doctor.report import verdict_lines
from lightning_dist_hooks.listening_sockets import Ancestor, inherited_from, listening_sockets
from lightning_dist_hooks.mpi._doctor_checks import check_mpi_sockets
from lightning_dist_hooks.transports import transports_taking_part

pytestmark = pytest.mark.unit


def test_slurm_task_counts_are_expanded_per_node():
    assert expand_slurm_counts("4(x2),3") == [4, 4, 3]
    assert expand_slurm_counts("2") == [2]


def test_an_uneven_layout_fails_naming_the_variables():
    (tasks, nodes) = check_launcher_layout(LauncherLayout([4, 4, 3], 3, "SLURM_STEP_TASKS_PER_NODE=4(x2),3"), 4, 3)
    assert tasks.status == FAIL and "a different number of processes on each node (SLURM_STEP_TASKS_PER_NODE" in (
        tasks.message
    )
    assert nodes.status == OK


def test_ranks_per_host_when_the_launcher_does_not_say():
    ranks = [{"host": "node1"}, {"host": "node1"}, {"host": "node2"}]
    tasks, nodes = check_hosts(ranks, devices=2, num_nodes=1)
    assert (tasks.status, tasks.message) == (FAIL, "ranks per host (node1: 2, node2: 1) differ from devices=2")
    assert (nodes.status, nodes.message) == (FAIL, "the ranks run on 2 host(s) (node1: 2, node2: 1), but num_nodes=1")


def test_equal_verdicts_of_several_ranks_merge_and_failures_come_first():
    merged = merge(
        [
            Verdict("a", OK, "fine", ranks=[0]),
            Verdict("b", FAIL, "bad", "do x", ranks=[3]),
            Verdict("b", FAIL, "bad", "do x", ranks=[1]),
            Verdict("b", FAIL, "bad", "do x", ranks=[2]),
        ]
    )
    assert [(verdict.check, verdict.ranks) for verdict in merged] == [("b", [1, 2, 3]), ("a", [0])]
    assert verdict_lines(merged) == [
        "verdicts:",
        "  FAIL  b: bad [ranks 1-3]",
        "        fix: do x",
        "  ok    a: fine",
        "1 check(s) failed",
    ]


def test_a_symlinked_directory_is_not_private(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    verdict = check_directory_privacy(tmp_path / "link")
    assert verdict.status == FAIL
    assert verdict.message == f"{tmp_path / 'link'} is a symbolic link, which another user may point elsewhere"


def test_a_sticky_shared_directory_is_private_enough(tmp_path):
    tmp_path.chmod(0o1777)
    assert check_directory_privacy(tmp_path).status == OK


def test_listening_sockets_of_this_process_are_read_from_proc():
    with socket.socket(socket.AF_INET6) as listener:
        listener.bind(("::1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        # Only this port: MPI, once initialised by another test in this process, listens too.
        mine = [each for each in listening_sockets(os.getpid()) if each.port == port]
        assert [(each.address, str(each)) for each in mine] == [("::1", f"[::1]:{port}")]
    assert [each for each in listening_sockets() if each.port == port] == []


def mpi_sockets_verdict(backend: str, ranks: list[dict], spans_nodes: bool) -> Verdict:
    """``check_mpi_sockets`` where the backend or the launch is MPI's: there it always gives a verdict."""
    verdict = check_mpi_sockets(backend, ranks, spans_nodes)
    assert verdict is not None
    return verdict


MPI_OPENED = "the MPI library, initialised before the rendezvous"
SLURMSTEPD = "inherited from the launcher (slurmstepd, pid 1234)"


def test_mpi_sockets_fail_on_one_node_warn_across_nodes_and_pass_when_none_listen():
    quiet = {"rank": 0, "listening": []}
    listening = {"rank": 1, "listening": [{"socket": "0.0.0.0:1025", "opened_by": MPI_OPENED}]}
    assert mpi_sockets_verdict("mpi4py", [quiet, quiet], spans_nodes=False).status == OK
    one_node = mpi_sockets_verdict("mpi", [quiet, listening], spans_nodes=False)
    assert (one_node.status, one_node.ranks) == (FAIL, [1]) and "rank 1: 0.0.0.0:1025" in one_node.message
    assert "--mca btl self,vader" in one_node.fix
    assert mpi_sockets_verdict("mpi4py", [quiet, listening], spans_nodes=True).status == WARN
    assert check_mpi_sockets("gloo", [listening], spans_nodes=False) is None


def test_a_socket_only_the_launcher_opened_passes_mpi_sockets_and_is_named():
    # srun --mpi=pmix with OMPI_MCA_btl=self,vader: both ranks hold slurmstepd's PMIx socket, inherited across exec.
    ranks = [{"rank": rank, "listening": [{"socket": "0.0.0.0:35929", "opened_by": SLURMSTEPD}]} for rank in (0, 1)]
    verdict = mpi_sockets_verdict("mpi4py", ranks, spans_nodes=False)
    assert (verdict.status, verdict.ranks) == (OK, [])
    assert verdict.message == (
        "torch_dist_backend='mpi4py': neither MPI nor a rendezvous store opened a listening TCP socket; the ranks hold "
        "their launcher's, which MPI did not open: 0.0.0.0:35929, inherited from the launcher (slurmstepd, pid 1234) "
        "by ranks [0, 1]"
    )


def test_a_socket_mpi_opened_still_fails_beside_the_launchers():
    launchers = {"socket": "0.0.0.0:35929", "opened_by": SLURMSTEPD}
    ranks = [
        {"rank": 0, "listening": [launchers]},
        {"rank": 1, "listening": [launchers, {"socket": "0.0.0.0:1025", "opened_by": MPI_OPENED}]},
    ]
    verdict = mpi_sockets_verdict("mpi", ranks, spans_nodes=False)
    assert (verdict.status, verdict.ranks) == (FAIL, [1])
    assert verdict.message == (
        "torch_dist_backend='mpi' on one node, yet ranks listen (rank 1: 0.0.0.0:1025): the MPI library opened them "
        "(Open MPI's tcp transport), though shared memory needs none; besides, the launcher's, which MPI did not "
        "open: 0.0.0.0:35929, inherited from the launcher (slurmstepd, pid 1234) by ranks [0, 1]"
    )
    assert "export OMPI_MCA_btl=self,vader" in verdict.fix
    assert mpi_sockets_verdict("mpi", ranks, spans_nodes=True).status == WARN


GLOO_OPENED = "the gloo backend, for connections between ranks"
TCP_STORE_OPENED = "torch's TCPStore, the rendezvous store rank 0 serves"


def test_under_an_mpi_launcher_gloos_own_sockets_pass_and_the_mpi_librarys_fail_naming_open_mpi():
    gloo = {"socket": "127.0.0.1:40000", "opened_by": GLOO_OPENED}
    mpi = {"socket": "0.0.0.0:1024", "opened_by": "the MPI library (Open MPI's tcp transport)"}
    quiet = [{"rank": 0, "mpi_launched": True, "listening": [gloo]}]
    assert mpi_sockets_verdict("gloo", quiet, spans_nodes=False).status == OK
    assert check_mpi_sockets("gloo", [{**quiet[0], "mpi_launched": False}], spans_nodes=False) is None
    verdict = mpi_sockets_verdict("gloo", [{"rank": 0, "mpi_launched": True, "listening": [gloo, mpi]}], False)
    assert (verdict.status, verdict.ranks) == (FAIL, [0])
    assert "ranks listen (rank 0: 0.0.0.0:1024): the MPI library opened them (Open MPI's tcp transport)" in (
        verdict.message
    )
    assert "127.0.0.1:40000" not in verdict.message and "--mca btl self,vader" in verdict.fix


def test_a_tcp_store_under_the_mpi_transport_is_named_as_the_stores_with_mpi_as_its_fix_not_open_mpis():
    store = {"socket": "[::]:29500", "opened_by": TCP_STORE_OPENED}
    verdict = mpi_sockets_verdict("mpi4py", [{"rank": 0, "listening": [store]}, {"rank": 1, "listening": []}], False)
    assert (verdict.status, verdict.ranks) == (WARN, [0])
    assert verdict.message == (
        "torch_dist_backend='mpi4py' rank 0 serves a TCP rendezvous store (rank 0: [::]:29500), reachable by anyone "
        "who can reach its node, though MPI already knows every rank"
    )
    assert "Open MPI" not in verdict.message and "btl" not in verdict.fix and "mpi://" in verdict.fix


def test_the_farthest_ancestor_holding_the_socket_opened_it():
    # slurmstepd -> a wrapper shell -> the rank: the shell only passed slurmstepd's socket on.
    shell, stepd = Ancestor(20, "bash", 1000, holds=True), Ancestor(10, "slurmstepd", 1000, holds=True)
    assert inherited_from([shell, stepd, Ancestor(1, "systemd", 0, holds=None)], socket_uid=1000, own_uid=1000) == (
        "inherited from the launcher (slurmstepd, pid 10)"
    )


def test_another_users_socket_is_the_launchers_even_where_its_descriptors_are_hidden():
    # A user's rank may not list root's slurmstepd's descriptors; the socket belongs to root, so the rank did not
    # open it: the nearest ancestor running as root is named.
    ancestors = [
        Ancestor(20, "bash", 1000, holds=False),
        Ancestor(10, "slurmstepd", 0, holds=None),
        Ancestor(1, "systemd", 0, holds=None),
    ]
    assert inherited_from(ancestors, socket_uid=0, own_uid=1000) == (
        "inherited from the launcher (slurmstepd, pid 10; the socket belongs to uid 0, not to this rank's user 1000)"
    )
    assert inherited_from(ancestors[:1], socket_uid=0, own_uid=1000) == (
        "inherited from the launcher (the socket belongs to uid 0, not to this rank's user 1000)"
    )


def test_a_socket_of_the_ranks_own_user_that_no_ancestor_holds_is_the_ranks():
    ancestors = [Ancestor(10, "mpirun", 1000, holds=False), Ancestor(1, "systemd", 0, holds=None)]
    assert inherited_from(ancestors, socket_uid=1000, own_uid=1000) is None
    assert inherited_from(ancestors, socket_uid=None, own_uid=1000) is None  # gone from the tables meanwhile


def gathered_rank(rank, host, *, verdicts=(), tokens_seen=None, listening=(), correct=True, addresses=("10.0.0.1",)):
    """One rank's facts as all_gather_object hands them to every rank (only what the verdicts after it read)."""
    return {
        "rank": rank,
        "host": host,
        "host_addresses": list(addresses),
        "allreduce": {"correct": correct},
        "listening": [{"socket": each, "opened_by": MPI_OPENED} for each in listening],
        "tokens_seen": tokens_seen,
        "verdicts": [verdict.as_dict() for verdict in verdicts],
    }


def test_gathered_verdicts_merge_every_ranks_own_with_those_of_all_ranks_together(tmp_path):
    ranks = [
        gathered_rank(0, "node1", verdicts=[Verdict("interfaces", OK, "fine", ranks=[0])], tokens_seen=[0, 1]),
        gathered_rank(
            1, "node1", verdicts=[Verdict("interfaces", OK, "fine", ranks=[1])], tokens_seen=[1], correct=False
        ),
    ]
    verdicts = gathered_verdicts(
        ranks,
        backend="gloo",
        devices=2,
        num_nodes=1,
        launcher_layout_checked=False,
        token_directory=tmp_path,
        transports=transports_taking_part("gloo"),
    )
    assert [(verdict.check, verdict.status, verdict.ranks) for verdict in verdicts] == [
        ("all-reduce", FAIL, []),
        ("shared-directory", FAIL, [1]),
        ("interfaces", OK, [0, 1]),
        ("tasks-per-node", OK, []),
        ("nodes", OK, []),
        ("host-name", OK, []),
    ]  # no mpi-sockets under gloo
    assert verdicts[0].message == "the all-reduce gave a wrong sum on ranks [1]"
    assert verdicts[1].message.startswith(f"{tmp_path} holds the doctor's tokens of ranks [1] only: ranks [0]")


def test_gathered_verdicts_see_nodes_by_host_name_when_the_launcher_already_said_how_many():
    ranks = [gathered_rank(0, "node1", addresses=["127.0.1.1"]), gathered_rank(1, "node2", listening=["0.0.0.0:1025"])]
    verdicts = gathered_verdicts(
        ranks,
        backend="mpi",
        devices=1,
        num_nodes=1,
        launcher_layout_checked=True,
        token_directory=None,
        transports=transports_taking_part("mpi"),
    )
    # Two hosts though num_nodes=1: node1's loopback name fails, and MPI's listening socket only warns across nodes.
    assert [(verdict.check, verdict.status, verdict.ranks) for verdict in verdicts] == [
        ("host-name", FAIL, []),
        ("mpi-sockets", WARN, [1]),
        ("all-reduce", OK, []),
    ]
    assert "['node1'] resolve to a loopback address" in verdicts[0].message
