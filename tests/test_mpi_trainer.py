"""``Trainer(torch_dist_backend="mpi")`` under a real ``mpirun``: stock torch, no store, no listening socket."""

from __future__ import annotations

import re
import sys

import pytest
from helpers import FIT_JOB, free_port, needs_mpi, openmpi_run, run_command, slurm_environment

from lightning_dist_hooks import Trainer, mpi


def fit_under_mpirun(tmp_path, name: str, *flags: str):
    out_dir = tmp_path / name
    command = [
        "timeout",
        "150",
        *openmpi_run(),
        sys.executable,
        str(FIT_JOB),
        "--out",
        str(out_dir),
        "--epochs",
        "2",
        *flags,
    ]
    return run_command(command, cwd=tmp_path, out_dir=out_dir, timeout=180).assert_ok()


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@needs_mpi
def test_mpi_fit_is_bitwise_gloos_with_the_hooks_and_holds_no_listening_socket(tmp_path):
    gloo = fit_under_mpirun(tmp_path, "gloo", "--backend", "gloo", "--init-method", f"file://{tmp_path}/")
    ours = fit_under_mpirun(tmp_path, "mpi", "--backend", "mpi", "--setup-hook", "record")
    assert ours.same_on_all_ranks("weights_sha256") == gloo.same_on_all_ranks("weights_sha256")
    for rank, record in ours.ranks.items():
        assert record["environment"] == "OpenMPIEnvironment"
        assert record["process_group_backend"] == "mpi4py"
        (call,) = record["setup_calls"]
        # The hook forwards what it gets: mpi:// keeps even an overriding hook free of any TCP store.
        assert (call["backend"], call["init_method"], call["rank"], call["world_size"]) == ("mpi4py", "mpi://", rank, 2)
        assert "TCPStore" not in record["store"]
        assert record["listening_tcp_ports"] == []
    assert gloo.ranks[0]["listening_tcp_ports"], "the socket check must see gloo's listeners"


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
def test_mpi_fit_with_a_custom_sampler_and_sync_dist_logging(tmp_path):
    result = fit_under_mpirun(tmp_path, "sampler", "--backend", "MPI", "--sampler-hook", "custom")
    for rank, record in result.ranks.items():
        assert record["seen"]["train"] == list(range(rank, 24, 3)) * 2
        assert record["sampler_calls"] == ["validate", "train"]
    result.same_on_all_ranks("weights_sha256")


@pytest.mark.unit
def test_mpi_without_mpi4py_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes `import mpi4py` fail, as on a machine without it
    with pytest.raises(
        ValueError,
        match=r"needs mpi4py, which is not installed. Install it: pip install "
        r"\"mpi4py>=4\.0,<5\" \(from a clone of lightning-dist-hooks: pip install "
        r"\"\.\[mpi\]\"\)",
    ):
        Trainer(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="mpi", logger=False)


def as_if_started_by_mpirun(monkeypatch, ranks: int) -> None:
    """The variables Open MPI's mpirun sets for rank 0 of ``ranks`` on one node."""
    for name, value in {"RANK": 0, "SIZE": ranks, "LOCAL_RANK": 0, "LOCAL_SIZE": ranks}.items():
        monkeypatch.setenv(f"OMPI_COMM_WORLD_{name}", str(value))


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
def test_mpi_selects_the_mpi4py_transport_and_the_socket_free_init_method(monkeypatch):
    as_if_started_by_mpirun(monkeypatch, ranks=2)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="MPI", logger=False)
    assert (trainer.torch_dist_backend, trainer.torch_dist_init_method) == ("mpi4py", "mpi://")


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
@pytest.mark.parametrize("backend", ["gloo", "mpi4py", "cpu:gloo"])
def test_mpi_init_method_takes_any_backend_under_an_mpi_launcher(monkeypatch, backend):
    as_if_started_by_mpirun(monkeypatch, ranks=2)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        torch_dist_backend=backend,
        torch_dist_init_method="mpi://",
        logger=False,
    )
    assert (trainer.torch_dist_backend, trainer.torch_dist_init_method) == (backend, "mpi://")


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
def test_mpi_init_method_outside_an_mpi_launcher_names_the_launchers_and_another_init_method():
    with pytest.raises(
        ValueError,
        match=r"torch_dist_init_method='mpi://' needs every rank started by an MPI "
        r"launcher, but this process was not .* `srun --mpi=pmix "
        r"--ntasks-per-node=2 python \.\.\.` under SLURM\), or use another init "
        r"method, e\.g\. 'dir:///shared/rdzv/'",
    ):
        Trainer(
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            torch_dist_backend="gloo",
            torch_dist_init_method="mpi://",
            logger=False,
        )


@pytest.mark.unit
def test_mpi_init_method_without_mpi4py_names_the_install_command_and_a_socket_free_alternative(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes `import mpi4py` fail, as on a machine without it
    as_if_started_by_mpirun(monkeypatch, ranks=2)
    with pytest.raises(
        ValueError,
        match=r"torch_dist_init_method='mpi://' carries the rendezvous over MPI, which "
        r"needs mpi4py, and this Python cannot import it\. Install it: pip install "
        r"\"mpi4py>=4\.0,<5\".* or use another init method, e\.g\. "
        r"'dir:///shared/rdzv/'",
    ):
        Trainer(
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            torch_dist_backend="gloo",
            torch_dist_init_method="mpi://",
            logger=False,
        )


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
@pytest.mark.parametrize(
    "flags", [{"torch_dist_backend": "mpi"}, {"torch_dist_backend": "mpi4py", "torch_dist_init_method": "mpi://"}]
)
def test_mpi_outside_an_mpi_launcher_says_to_start_with_mpirun(flags):
    with pytest.raises(
        ValueError,
        match=r"torch_dist_backend='mpi(' \(the mpi4py transport\)|4py') needs every rank "
        r"started by an MPI launcher, "
        r"but this process was not .* Start the script with `mpirun -n 4 python "
        r"\.\.\.` \(or `srun --mpi=pmix --ntasks-per-node=2",
    ):
        Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", logger=False, **flags)


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
def test_mpi_job_of_another_size_than_the_trainer_names_both(monkeypatch):
    as_if_started_by_mpirun(monkeypatch, ranks=3)
    with pytest.raises(
        ValueError,
        match=r"Trainer\(devices=2, num_nodes=1\) makes a world of 2 processes, but the "
        r"MPI launcher started 3 \(torch_dist_backend='mpi' \(the mpi4py "
        r"transport\)\)\. Start the job "
        r"with `mpirun -n 2`, or set devices x num_nodes to 3\.",
    ):
        Trainer(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="mpi", logger=False)


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
@pytest.mark.parametrize("devices", [{}, {"devices": "auto"}], ids=["devices left out", "devices='auto'"])
def test_devices_left_at_auto_under_mpirun_says_so_and_names_the_ranks_per_node(monkeypatch, devices):
    # Issue 30: Lightning's devices="auto" is 1 process on CPU; the message must not show a devices=1 never written.
    as_if_started_by_mpirun(monkeypatch, ranks=2)
    with pytest.raises(ValueError) as error:
        Trainer(accelerator="cpu", strategy="ddp", torch_dist_backend="mpi", logger=False, **devices)
    assert str(error.value) == (
        "Trainer(num_nodes=1) leaves devices at its default ('auto': 1 process per node on CPU), which makes a world "
        "of 1 process, but the MPI launcher started 2 (torch_dist_backend='mpi' (the mpi4py transport)). Pass "
        "devices=2, the launcher's ranks per node: Trainer(devices=2, num_nodes=1)."
    )


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
def test_devices_left_at_auto_on_several_nodes_names_devices_and_num_nodes(monkeypatch):
    for name, value in {"RANK": 0, "SIZE": 8, "LOCAL_RANK": 0, "LOCAL_SIZE": 4}.items():
        monkeypatch.setenv(f"OMPI_COMM_WORLD_{name}", str(value))
    with pytest.raises(
        ValueError,
        match=r"^Trainer\(num_nodes=1\) leaves devices at its default \('auto': 1 process "
        r"per node on CPU\), .* started 8 \(torch_dist_init_method='mpi://'\)\. "
        r"Pass devices=4, the launcher's ranks per node, and num_nodes=2: "
        r"Trainer\(devices=4, num_nodes=2\)\.$",
    ):
        Trainer(
            accelerator="cpu", strategy="ddp", torch_dist_backend="gloo", torch_dist_init_method="mpi://", logger=False
        )


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
def test_fabric_with_devices_left_at_auto_under_mpirun_names_itself(monkeypatch):
    from lightning_dist_hooks import Fabric

    as_if_started_by_mpirun(monkeypatch, ranks=2)
    with pytest.raises(
        ValueError,
        match=r"^Fabric\(num_nodes=1\) leaves devices at its default \('auto': 1 process "
        r"per node on CPU\).* Pass devices=2, the launcher's ranks per node: "
        r"Fabric\(devices=2, num_nodes=1\)\.$",
    ):
        Fabric(accelerator="cpu", strategy="ddp", torch_dist_backend="mpi")


@pytest.mark.unit
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
def test_mpi_outside_an_mpi_launcher_names_the_backend_as_written():
    with pytest.raises(
        ValueError,
        match=r"^torch_dist_backend='MPI' \(the mpi4py transport\) needs every rank "
        r"started by an MPI launcher",
    ):
        Trainer(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="MPI", logger=False)


@pytest.mark.slow  # Lightning's MPIEnvironment.detect() initialises MPI: Open MPI's singleton starts an orted
@pytest.mark.mpi
@pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py")
def test_mpi_under_a_pmix_launcher_is_accepted(monkeypatch):
    # srun --mpi=pmix sets PMIX_RANK (and SLURM's variables), none of the MPI launchers' rank/size pairs.
    monkeypatch.setenv("PMIX_RANK", "0")
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="mpi", logger=False)
    assert trainer.torch_dist_backend == "mpi4py"


def assert_meets_through_the_mpi_store_as_file_does(ours, file, environment: str) -> None:
    """gloo through mpi:// trained exactly as gloo through file://, meeting in an MpiStore, with no TCPStore: every
    rank listens on as many ports as it does with file:// (gloo's own), none more."""
    assert ours.same_on_all_ranks("weights_sha256") == file.same_on_all_ranks("weights_sha256")
    for rank, record in ours.ranks.items():
        assert record["environment"] == environment
        assert record["process_group_backend"] == "gloo"
        assert record["store"][-1] == "MpiStore" and "TCPStore" not in record["store"], record["store"]
        assert len(record["listening_tcp_ports"]) == len(file.ranks[rank]["listening_tcp_ports"]), (
            record["listening_tcp_ports"],
            file.ranks[rank]["listening_tcp_ports"],
        )


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@needs_mpi
def test_gloo_through_mpi_trains_as_through_file_under_mpirun_with_no_tcp_store(tmp_path):
    file = fit_under_mpirun(tmp_path, "file", "--backend", "gloo", "--init-method", f"file://{tmp_path}/")
    ours = fit_under_mpirun(tmp_path, "mpi", "--backend", "gloo", "--init-method", "mpi://")
    assert_meets_through_the_mpi_store_as_file_does(ours, file, "OpenMPIEnvironment")


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.cluster
@needs_mpi
def test_gloo_through_mpi_trains_as_through_file_under_srun_mpi_pmix(slurm_cluster, tmp_path):
    def fit_under_srun(name: str, *flags: str):
        out_dir = tmp_path / name
        command = [
            "timeout",
            "150",
            "srun",
            "--mpi=pmix",
            "-N1",
            "--ntasks-per-node=2",
            "-J",
            "ldhmpistore",
            "--kill-on-bad-exit=1",
            sys.executable,
            str(FIT_JOB),
            "--out",
            str(out_dir),
            "--epochs",
            "2",
            *flags,
        ]
        # Shared memory only between the ranks: what a site that forbids listening sockets sets.
        environment = {**slurm_environment(), "OMPI_MCA_btl": "self,vader"}
        return run_command(command, cwd=tmp_path, out_dir=out_dir, timeout=180, env=environment).assert_ok()

    file = fit_under_srun("file", "--backend", "gloo", "--init-method", f"file://{tmp_path}/")
    ours = fit_under_srun("mpi", "--backend", "gloo", "--init-method", "mpi://")
    assert_meets_through_the_mpi_store_as_file_does(ours, file, "SLURMEnvironment")


WARNING = "under an MPI launcher, yet ranks listen on TCP sockets a setting would close"
MPI_LIBRARY_OPENED = re.compile(r"(\S+:\d+) \(the MPI library \(Open MPI's tcp transport\)\)")
MPI_LIBRARY_FIX = "Fixes: for the MPI library's: start the job with mpirun --mca btl self,vader"


def fit_under(launcher: list[str], tmp_path, name: str, *flags: str):
    out_dir = tmp_path / name
    command = [
        "timeout",
        "150",
        *launcher,
        sys.executable,
        str(FIT_JOB),
        "--out",
        str(out_dir),
        "--epochs",
        "1",
        *flags,
    ]
    return run_command(command, cwd=tmp_path, out_dir=out_dir, timeout=180).assert_ok()


def plain_mpirun() -> list[str]:
    """``openmpi_run()`` without its ``--mca btl self,vader``: Open MPI's tcp transport then listens on every rank."""
    shared_memory_only = openmpi_run()
    at = shared_memory_only.index("btl") - 1
    assert shared_memory_only[at : at + 3] == ["--mca", "btl", "self,vader"]
    return shared_memory_only[:at] + shared_memory_only[at + 3 :]


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize(("backend", "init_method"), [("mpi", None), ("gloo", "mpi://")])
def test_under_plain_mpirun_the_job_log_names_open_mpis_tcp_transport_with_its_fix(tmp_path, backend, init_method):
    flags = ["--backend", backend, *(["--init-method", init_method] if init_method else [])]
    listening = fit_under(plain_mpirun(), tmp_path, "plain", *flags)
    process_group_backend = listening.ranks[0]["process_group_backend"]
    assert f"torch_dist_backend={process_group_backend!r} {WARNING}" in listening.output, listening.output[-4000:]
    assert listening.output.count(WARNING) == 1, "rank 0 warns, once"
    assert MPI_LIBRARY_FIX in listening.output
    named = {int(address.rsplit(":", 1)[1]) for address in MPI_LIBRARY_OPENED.findall(listening.output)}
    held = {port for rank in (0, 1) for port in listening.ranks[rank]["listening_tcp_ports"]}
    assert named and named <= held, (named, held)
    if backend == "gloo":  # gloo's own sockets are named as gloo's, not as MPI's
        assert "(the gloo backend, for connections between ranks)" in listening.output
    quiet = fit_under(openmpi_run(), tmp_path, "shared-memory", *flags)
    assert WARNING not in quiet.output


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
def test_the_mpi_transport_through_a_tcp_store_is_told_of_the_store_and_mpi_not_of_open_mpi(tmp_path):
    port = free_port()
    run = fit_under(openmpi_run(), tmp_path, "tcp", "--backend", "mpi", "--init-method", f"tcp://127.0.0.1:{port}")
    assert f"rank 0: [::]:{port} (torch's TCPStore, the rendezvous store rank 0 serves)" in run.output or (
        f"rank 0: 0.0.0.0:{port} (torch's TCPStore, the rendezvous store rank 0 serves)" in run.output
    ), run.output[-4000:]
    assert "Fixes: for the TCP store's: torch_dist_init_method='mpi://'" in run.output
    assert "MPI library" not in run.output and "--mca btl" not in run.output
