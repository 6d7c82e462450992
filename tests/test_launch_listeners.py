"""What listens on one node, per launch: the facts of docs/mpi.md's table "What listens, per launch", measured.

Each test starts a tiny job under one launch (the probe below, written to the test's directory): MPI_Init and an
all-reduce, so that every transport Open MPI chose is up, then every rank records the listening TCP sockets it holds
and those of each process above it (read from /proc, by socket inode), and exits. A socket a rank holds that its
launcher (mpirun, slurmstepd) holds too is one the rank inherited across exec; any other the rank opened itself.
The table measures Open MPI 4.1 (and SLURM's mpi/pmix plugin); elsewhere these tests skip.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import OPENMPI_MPIRUN, job_environment, needs_mpi, run_command, slurm_environment

pytestmark = pytest.mark.slow

PROBE = r'''
"""One rank: its listening TCP sockets and those of every process above it, as JSON in OUT_DIR/rank<N>.json."""
import ipaddress
import json
import os
import sys
from pathlib import Path


def socket_inodes(pid):
    inodes = set()
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(descriptor)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def listening(pid):
    held, found = socket_inodes(pid), []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        for line in (path.read_text().splitlines()[1:] if path.exists() else []):
            fields = line.split()
            if fields[3] == "0A" and fields[9] in held:
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                packed = b"".join(raw[word:word + 4][::-1] for word in range(0, len(raw), 4))
                found.append({"address": str(ipaddress.ip_address(packed)), "port": int(port, 16),
                              "inode": fields[9]})
    return found


def ancestors():
    chain, pid = [], os.getppid()
    while pid > 1:
        try:
            sockets = listening(pid)
        except OSError:
            sockets = None  # not ours to list
        chain.append({"pid": pid, "command": Path(f"/proc/{pid}/comm").read_text().strip(), "listening": sockets})
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return chain


out_dir, mode = Path(sys.argv[1]), sys.argv[2]
if mode == "mpi":
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    comm.allreduce(comm.rank)
    rank = comm.rank
else:
    rank = int(os.environ["SLURM_PROCID"])
record = {"rank": rank, "pid": os.getpid(), "listening": listening("self"), "ancestors": ancestors()}
(out_dir / f"rank{rank}.json").write_text(json.dumps(record))
if mode == "mpi":
    comm.Barrier()  # the launcher, and the other rank, still run while every rank looks
'''


def _open_mpi_major() -> int | None:
    if OPENMPI_MPIRUN is None:
        return None
    version = subprocess.run([OPENMPI_MPIRUN, "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"Open MPI\)? (\d+)\.", version)
    return int(found.group(1)) if found else None


needs_open_mpi_4 = pytest.mark.skipif(
    _open_mpi_major() not in (None, 4), reason="the table measures Open MPI 4.1 (btl vader, ORTE's mpirun)"
)
IPV6 = Path("/proc/net/if_inet6").exists()
WILDCARDS = {"0.0.0.0", "::"}


@dataclass
class Rank:
    rank: int
    pid: int
    listening: list[dict]
    ancestors: list[dict]

    def held_by(self, process: dict) -> list[dict]:
        """This rank's listening sockets that ``process`` (an ancestor) holds too: inherited from it."""
        theirs = {each["inode"] for each in process["listening"]}
        return [each for each in self.listening if each["inode"] in theirs]

    def ancestor(self, command: str) -> dict:
        """The nearest process above this rank running ``command``."""
        found = [each for each in self.ancestors if each["command"] == command]
        assert found, f"rank {self.rank} has no {command} above it: {self.ancestors}"
        return found[0]


def probe(tmp_path: Path, launcher: list[str], env: dict[str, str], mode: str = "mpi") -> list[Rank]:
    out_dir = tmp_path / "records"
    out_dir.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    command = ["timeout", "90", *launcher, sys.executable, str(script), str(out_dir), mode]
    result = run_command(command, cwd=tmp_path, out_dir=out_dir, timeout=120, env=env).assert_ok()
    records = sorted(out_dir.glob("rank*.json"))
    assert [record.name for record in records] == ["rank0.json", "rank1.json"], result.output[-3000:]
    return [Rank(**json.loads(record.read_text())) for record in records]


def without_btl_choice(env: dict[str, str]) -> dict[str, str]:
    """``env`` where Open MPI chooses its own transports (no OMPI_MCA_btl* of the machine's)."""
    return {name: value for name, value in env.items() if not name.startswith("OMPI_MCA_btl")}


def mpirun(*flags: str) -> list[str]:
    """``mpirun -n 2`` on one node with its out-of-band channel restricted to loopback (as the other tests run it)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert OPENMPI_MPIRUN is not None  # the tests that run it need Open MPI's mpirun
    return [
        OPENMPI_MPIRUN,
        "-n",
        "2",
        *root,
        "--oversubscribe",
        "--mca",
        "oob_tcp_if_include",
        "lo",
        "-x",
        "PYTHONPATH",
        *flags,
    ]


def assert_mpirun_listens_on_every_interface(ranks: list[Rank]) -> None:
    """mpirun itself (the ranks' parent) listens on every interface although oob_tcp_if_include says lo, and hands
    none of its sockets to the ranks."""
    launcher = ranks[0].ancestors[0]
    assert launcher["command"].startswith("mpirun"), ranks[0].ancestors
    addresses = {each["address"] for each in launcher["listening"]}
    assert "0.0.0.0" in addresses, launcher  # ORTE's out-of-band listener (and [::] beside it)
    assert addresses <= WILDCARDS | {"127.0.0.1"}, launcher  # 127.0.0.1: its PMIx server, for the ranks
    assert all(rank.held_by(launcher) == [] for rank in ranks)


@pytest.mark.mpi
@needs_mpi
@needs_open_mpi_4
@pytest.mark.parametrize("flags", [(), ("--mca", "btl_tcp_if_include", "lo")], ids=["plain", "btl_tcp_if_include"])
def test_plain_mpirun_ranks_listen_on_every_interface(tmp_path, flags):
    ranks = probe(tmp_path, mpirun(*flags), without_btl_choice(job_environment()))
    for rank in ranks:
        # Open MPI's tcp BTL, on ports from 1024, bound to every interface whatever btl_tcp_if_include says.
        addresses = {each["address"] for each in rank.listening}
        assert "0.0.0.0" in addresses and ("::" in addresses or not IPV6), rank
        assert all(each["port"] >= 1024 and each["address"] in WILDCARDS for each in rank.listening), rank
    assert_mpirun_listens_on_every_interface(ranks)


@pytest.mark.mpi
@needs_mpi
@needs_open_mpi_4
def test_mpirun_btl_self_vader_ranks_hold_no_listening_socket(tmp_path):
    ranks = probe(tmp_path, mpirun("--mca", "btl", "self,vader"), without_btl_choice(job_environment()))
    assert [rank.listening for rank in ranks] == [[], []]
    assert_mpirun_listens_on_every_interface(ranks)


def needs_slurm_pmix() -> None:
    plugins = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30)
    if "pmix" not in plugins.stdout + plugins.stderr:
        pytest.skip("SLURM's mpi/pmix plugin is not installed (Debian: slurm-wlm ships it)")


SRUN = ["srun", "-N1", "--ntasks-per-node=2", "-J", "ldhlisteners", "--kill-on-bad-exit=1"]


@pytest.mark.mpi
@pytest.mark.cluster
@needs_mpi
@needs_open_mpi_4
@pytest.mark.parametrize("btl", [None, "self,vader"], ids=["plain", "btl_self_vader"])
def test_srun_mpi_pmix_ranks_hold_slurmstepds_socket(slurm_cluster, tmp_path, btl):
    needs_slurm_pmix()
    env = without_btl_choice(slurm_environment()) | ({"OMPI_MCA_btl": btl} if btl else {})
    ranks = probe(tmp_path, [SRUN[0], "--mpi=pmix", *SRUN[1:]], env)
    inherited = [rank.held_by(rank.ancestor("slurmstepd")) for rank in ranks]
    # One socket on every interface, opened by slurmstepd's PMIx plugin and held by every rank it started.
    assert len(inherited[0]) == 1 and inherited[0] == inherited[1], inherited
    assert inherited[0][0]["address"] == "0.0.0.0", inherited
    slurmstepd = ranks[0].ancestor("slurmstepd")
    others = [each for each in slurmstepd["listening"] if each not in inherited[0]]
    assert {each["address"] for each in others} <= {"127.0.0.1"}, slurmstepd  # its PMIx server, for the ranks
    own = [[each for each in rank.listening if each not in inherited[0]] for rank in ranks]
    if btl:
        assert own == [[], []]  # the only listening socket the ranks hold is slurmstepd's
    else:
        for sockets in own:  # and the tcp BTL's, as under plain mpirun
            assert "0.0.0.0" in {each["address"] for each in sockets}, own


@pytest.mark.cluster
def test_srun_without_mpi_plugin_gives_the_ranks_no_socket(slurm_cluster, tmp_path):
    # No MPI at all (SLURM's own launch, as Lightning's SLURMEnvironment uses it): slurmstepd opens no TCP listener
    # and the ranks inherit none, so the socket above is the PMIx plugin's.
    ranks = probe(tmp_path, SRUN, slurm_environment(), mode="none")
    assert [rank.listening for rank in ranks] == [[], []]
    assert [rank.ancestor("slurmstepd")["listening"] for rank in ranks] == [[], []]
