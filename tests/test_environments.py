"""Scheduler environments, per-launch rendezvous files and leftover detection.

Flux, PBS/PALS, LSF and MVAPICH2 cannot run here: the ``test_emulated_*`` tests start two real processes with
exactly the variables those launchers set for each rank, and they meet through a real ``file:///DIR/`` rendezvous.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Rank, both_packages, job_environment, run_ranks
from lightning_fabric.plugins.environments import (
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

from lightning_dist_hooks import (
    FluxEnvironment,
    HydraEnvironment,
    LauncherEnvironment,
    LauncherVariables,
    MVAPICH2Environment,
    OpenMPIEnvironment,
    PALSEnvironment,
    Trainer,
    _lightning_internals,
    detect_cluster_environment,
    environments,
    launch_identity,
    launcher_variables,
    mpi,
    register_cluster_environment,
    register_launcher,
)
from lightning_dist_hooks._lightning_internals import PYTORCH_LIGHTNING
from lightning_dist_hooks.doctor.checks import check_launcher_layout
from lightning_dist_hooks.doctor.facts import launcher_layout
from lightning_dist_hooks.environment_plugin import with_detected_cluster_environment
from lightning_dist_hooks.environments import LAUNCHER_ENVIRONMENTS, detection_order
from lightning_dist_hooks.init_methods import FileInitMethod
from lightning_dist_hooks.init_methods._shared_filesystem.launches import LAUNCH_TOKEN_VARIABLE
from lightning_dist_hooks.launcher_variables import (
    LaunchSize,
    SizeMismatch,
    is_launcher_variable,
    launchers,
    started_by_an_mpi_launcher,
    without_launcher_variables,
)

FIT_FLAGS = ["--backend", "gloo", "--setup-hook", "record", "--sampler-hook", "super", "--epochs", "1"]

OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "PMIX_NAMESPACE": "806289409",
    "PMIX_RANK": "3",
}
HYDRA = {"PMI_RANK": "3", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "6"}
MVAPICH2 = {
    "MV2_COMM_WORLD_RANK": "3",
    "MV2_COMM_WORLD_SIZE": "8",
    "MV2_COMM_WORLD_LOCAL_RANK": "1",
    "MV2_COMM_WORLD_LOCAL_SIZE": "2",
}
FLUX = {
    "FLUX_TASK_RANK": "3",
    "FLUX_TASK_LOCAL_ID": "1",
    "FLUX_JOB_SIZE": "8",
    "FLUX_JOB_NNODES": "4",
    "FLUX_JOB_ID": "ƒ2Bt7T6Cw",
    "PMI_RANK": "3",
    "PMI_SIZE": "8",
    "PMI_FD": "6",
}
PALS = {
    "PALS_RANKID": "3",
    "PALS_LOCAL_RANKID": "1",
    "PALS_NODEID": "1",
    "PALS_APID": "7f1c-aa",
    "PALS_LOCAL_SIZE": "2",
    "PMI_RANK": "3",
    "PMI_SIZE": "8",
    "PMI_LOCAL_RANK": "1",
    "PMI_LOCAL_SIZE": "2",
    "PBS_JOBID": "1234.pbs01",
}
# What a process started by srun (mpi/pmi2 plugin) sees: PMI_RANK/PMI_SIZE but none of Hydra's MPI_LOCALRANKID.
SRUN = {
    "SLURM_NTASKS": "8",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NAME": "train",
    "PMI_RANK": "3",
    "PMI_SIZE": "8",
    "PMIX_NAMESPACE": "slurm.pmix.42.0",
}
# The batch step of an sbatch job, inherited by everything an mpirun inside it starts.
SBATCH_STEP = {key: SRUN[key] for key in ("SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_JOB_NAME")}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        (OPENMPI, OpenMPIEnvironment),
        (HYDRA, HydraEnvironment),
        (MVAPICH2, MVAPICH2Environment),
        (FLUX, FluxEnvironment),
        (PALS, PALSEnvironment),
        (SRUN, SLURMEnvironment),
        ({**SBATCH_STEP, **OPENMPI}, OpenMPIEnvironment),  # mpirun inside sbatch: the innermost launcher wins
        ({**SBATCH_STEP, **FLUX}, FluxEnvironment),
        (
            {
                **SRUN,
                "TORCHELASTIC_RUN_ID": "abc",
                "RANK": "3",
                "LOCAL_RANK": "1",
                "WORLD_SIZE": "8",
                "GROUP_RANK": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
            },
            None,
        ),  # torchrun in srun: Lightning's TorchElastic
        ({}, None),
    ],
)
def test_detection_priority(launcher_env, variables, expected):
    launcher_env(variables)
    detected = detect_cluster_environment()
    if expected is None:
        assert detected is None or detected.__module__.startswith("lightning_fabric")
    else:
        assert detected is expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("environment", "variables", "node_rank", "identity"),
    [
        (OpenMPIEnvironment, OPENMPI, 1, "PMIX_NAMESPACE=806289409"),  # 3 // 2 ranks per node; not NODE_RANK
        (HydraEnvironment, {**HYDRA, "PBS_JOBID": "9.pbs"}, 1, "PBS_JOBID=9.pbs"),
        (MVAPICH2Environment, {**MVAPICH2, "SLURM_JOB_ID": "42"}, 1, "SLURM_JOB_ID=42"),
        (FluxEnvironment, FLUX, 1, "FLUX_JOB_ID=ƒ2Bt7T6Cw"),  # 3 // (8 ranks / 4 nodes)
        (PALSEnvironment, PALS, 1, "PBS_JOBID=1234.pbs01,PALS_APID=7f1c-aa"),
    ],
)
def test_ranks_node_rank_and_identity_come_from_the_table(launcher_env, environment, variables, node_rank, identity):
    launcher_env(variables)
    cluster = environment()
    ranks = (cluster.global_rank(), cluster.world_size(), cluster.local_rank(), cluster.node_rank())
    assert ranks == (3, 8, 1, node_rank)
    assert cluster.creates_processes_externally is True
    assert launch_identity(cluster) == identity


@pytest.mark.unit
def test_env_main_address_on_several_nodes_needs_master_addr_or_file(launcher_env, tmp_path):
    launcher_env(OPENMPI)
    with pytest.raises(RuntimeError, match=r"OpenMPIEnvironment: env:// needs rank 0's address.*file:///SHARED/DIR/"):
        _ = OpenMPIEnvironment().main_address
    launcher_env({**OPENMPI, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29400"})
    assert (OpenMPIEnvironment().main_address, OpenMPIEnvironment().main_port) == ("10.1.2.3", 29400)


@pytest.mark.unit
@pytest.mark.parametrize(
    "environment, variables, devices, num_nodes, error",
    [
        (OpenMPIEnvironment, OPENMPI, 2, 4, None),  # rank 3, local rank 1 of 2: block placement
        (FluxEnvironment, FLUX, 2, 4, None),
        (PALSEnvironment, {**PALS, "PALS_LOCAL_RANKID": "0"}, 2, 4, None),  # PALS names the node: nothing derived
        (
            OpenMPIEnvironment,
            OPENMPI,
            2,
            2,
            r"started 8 processes \(OMPI_COMM_WORLD_SIZE=8\).*devices=2 and num_nodes=2, i.e. 4",
        ),
        (OpenMPIEnvironment, OPENMPI, 4, 2, r"placed 2 processes on each node, but the Trainer has devices=4"),
        (FluxEnvironment, FLUX, 1, 8, r"placed 2 processes on each node, but the Trainer has devices=1"),
        # mpirun --map-by node on 4 nodes of 2: rank 3 is the second rank of node 3, not of node 1.
        (
            OpenMPIEnvironment,
            {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
            2,
            4,
            r"rank 3 has local rank 0, but with 2 consecutive ranks per node it would have local rank 1.*round-robin",
        ),
        (HydraEnvironment, {**HYDRA, "MPI_LOCALRANKID": "0"}, 2, 4, r"round-robin.*ppr:2:node"),
    ],
)
def test_launch_placement_and_sizes_are_checked_against_devices_and_num_nodes(
    launcher_env, environment, variables, devices, num_nodes, error
):
    launcher_env(variables)
    if error is None:
        environment().validate_settings(num_devices=devices, num_nodes=num_nodes)
    else:
        with pytest.raises(ValueError, match=error):
            environment().validate_settings(num_devices=devices, num_nodes=num_nodes)


@pytest.mark.unit
def test_main_port_derives_from_the_job_and_pals_address_from_the_nodefile(launcher_env, tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1000c0s0b0n0\nx1000c0s0b0n1\n")
    launcher_env({**PALS, "PBS_NODEFILE": str(nodefile)})
    port = PALSEnvironment().main_port
    assert 20000 <= port < 30000 and port == PALSEnvironment().main_port
    assert PALSEnvironment().main_address == "x1000c0s0b0n0"


@pytest.mark.unit
@both_packages
def test_detection_finds_lightnings_own_environments_of_the_package_asked_for(launcher_env, package):
    launcher_env(SRUN)
    flavour = _lightning_internals.flavour_of(package.ours.Trainer)
    assert flavour is not None
    assert detect_cluster_environment(flavour) is package.fabric.plugins.environments.SLURMEnvironment


@pytest.mark.unit
@both_packages
def test_slurm_requeue_gets_a_new_rendezvous_file(launcher_env, tmp_path, package):
    Trainer, SLURMEnvironment = package.ours.Trainer, package.fabric.plugins.environments.SLURMEnvironment
    launcher_env(SRUN)
    first = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        torch_dist_init_method=f"file://{tmp_path}/",
        plugins=[SLURMEnvironment()],
        logger=False,
        num_nodes=4,
    ).torch_dist_init_method
    launcher_env({**SRUN, "SLURM_RESTART_COUNT": "1"})
    requeued = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        torch_dist_init_method=f"file://{tmp_path}/",
        plugins=[SLURMEnvironment()],
        logger=False,
        num_nodes=4,
    ).torch_dist_init_method
    assert first.startswith(f"file://{tmp_path}/ldh-uid-{os.geteuid()}/ldh-rendezvous-SLURM_JOB_ID-42-SLURM_STEP_ID-0-")
    assert "SLURM_RESTART_COUNT-1" in requeued and requeued != first


@pytest.mark.unit
def test_no_job_identity_asks_for_an_explicit_file(launcher_env, tmp_path):
    launcher_env(HYDRA)  # mpiexec.hydra outside any allocation names no launch
    with pytest.raises(
        ValueError,
        match=rf"torch_dist_init_method='file://{tmp_path}/': HydraEnvironment names no job"
        rf".*e.g. 'file://{tmp_path}/run42'",
    ):
        Trainer(
            accelerator="cpu",
            devices=2,
            num_nodes=4,
            strategy="ddp",
            torch_dist_init_method=f"file://{tmp_path}/",
            logger=False,
        )


@pytest.mark.unit
def test_processes_started_with_local_rank_by_hand_have_no_identity(launcher_env, tmp_path):
    launcher_env({"LOCAL_RANK": "0", "NODE_RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"LightningEnvironment names no job"):
        Trainer(
            accelerator="cpu", devices=2, strategy="ddp", torch_dist_init_method=f"file://{tmp_path}/", logger=False
        )


@pytest.mark.unit
@both_packages
def test_a_plugin_given_by_the_user_is_kept(launcher_env, package):
    LightningEnvironment = package.fabric.plugins.environments.LightningEnvironment
    launcher_env(OPENMPI)
    trainer = package.ours.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", plugins=[LightningEnvironment()], logger=False
    )
    assert type(trainer.strategy.cluster_environment) is LightningEnvironment


@pytest.mark.unit
def test_nothing_is_added_where_lightning_would_choose_the_same_environment(launcher_env):
    launcher_env(SRUN)
    kwargs = {"plugins": None}
    # Lightning makes its SLURMEnvironment itself.
    assert with_detected_cluster_environment(kwargs, PYTORCH_LIGHTNING) is kwargs
    launcher_env({**SBATCH_STEP, **OPENMPI})
    (added,) = with_detected_cluster_environment(kwargs, PYTORCH_LIGHTNING)["plugins"]
    assert type(added) is OpenMPIEnvironment


@pytest.mark.unit
def test_a_process_no_launcher_started_gets_lightnings_environment_without_a_detour_through_mpi(launcher_env):
    launcher_env({})
    (added,) = with_detected_cluster_environment({"plugins": None}, PYTORCH_LIGHTNING)["plugins"]
    assert type(added) is LightningEnvironment
    # Started by an MPI launcher none of ours knows (Cray ALPS): Lightning's own detection decides, MPIEnvironment too.
    launcher_env({"ALPS_APP_PE": "0"})
    kwargs = {"plugins": None}
    assert with_detected_cluster_environment(kwargs, PYTORCH_LIGHTNING) is kwargs


# Sockets of this process and of its children: the singleton's orted is a child, and another run's orted, which
# outlives its own process for a moment, is not counted.
_TRAINER_AND_ITS_LISTENERS = """
import os, re, subprocess, sys
import pytorch_lightning
from lightning_dist_hooks import Trainer
trainer = (pytorch_lightning.Trainer if sys.argv[1] == "lightning" else Trainer)(
    accelerator="cpu", devices=2, strategy="ddp", logger=False)

def ours_or_our_childs(pid):
    try:
        return pid == os.getpid() or int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except OSError:
        return False

listening = [line for line in subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout.splitlines()
             if any(ours_or_our_childs(int(pid)) for pid in re.findall(r"pid=(\\d+)", line))]
print(type(trainer.strategy.cluster_environment).__name__, "mpi4py.MPI" in sys.modules, len(listening))
"""


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="Lightning initialises MPI only with mpi4py")
def test_a_trainer_outside_any_launcher_starts_no_mpi_and_opens_no_listening_socket(tmp_path):
    # Lightning's MPIEnvironment.detect() initialises MPI to learn that the world has one process: an Open MPI
    # singleton starts an orted and listens on every interface. Shown for Lightning's Trainer, then for ours.
    seen = {}
    for trainer in ("lightning", "ours"):
        done = subprocess.run(
            [sys.executable, "-c", _TRAINER_AND_ITS_LISTENERS, trainer],
            cwd=tmp_path,
            env=job_environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen[trainer] = done.stdout.split()[-3:]
    assert seen["lightning"][:2] == ["LightningEnvironment", "True"], seen
    assert int(seen["lightning"][2]) > 0, "Open MPI's singleton no longer listens: the contrast shows nothing"
    assert seen["ours"] == ["LightningEnvironment", "False", "0"], seen


# Rank 1 of 2 started by LSF's jsrun (Spectrum MPI sets OMPI_COMM_WORLD_* too); LSB_DJOB_RANKFILE is set per test.
JSRUN = {
    "LSB_JOBID": "4242",
    "JSM_NAMESPACE_RANK": "1",
    "JSM_NAMESPACE_LOCAL_RANK": "1",
    "JSM_NAMESPACE_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
}


def _jsrun_variables(tmp_path: Path) -> dict[str, str]:
    rankfile = tmp_path / "rankfile"
    rankfile.write_text(f"launchnode\n{socket.gethostname()}\n{socket.gethostname()}\n")
    return {**JSRUN, "LSB_DJOB_RANKFILE": str(rankfile)}


@pytest.mark.unit
def test_a_jsrun_task_that_inherited_slurm_variables_is_lsfs(launcher_env, tmp_path):
    # The one case where this order (LSF before SLURM) and Lightning's differ: jsrun's per-process JSM_NAMESPACE_*
    # are the innermost launcher's, so the Trainer gives Lightning the LSFEnvironment it would not pick itself.
    launcher_env({**SRUN, **_jsrun_variables(tmp_path)})
    assert detect_cluster_environment() is LSFEnvironment and SLURMEnvironment.detect()
    trainer = Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", logger=False)
    assert type(trainer.strategy.cluster_environment) is LSFEnvironment
    assert trainer.strategy.cluster_environment.global_rank() == 1


class SiteLauncherEnvironment(LauncherEnvironment):
    variables = LauncherVariables(
        detect=("SITE_RANK", "SITE_SIZE", "SITE_LOCAL_RANK"),
        rank="SITE_RANK",
        world_size="SITE_SIZE",
        local_rank="SITE_LOCAL_RANK",
        node_count="SITE_NODES",
        local_size="SITE_LOCAL_SIZE",
        identity=(("SITE_JOB_ID",),),
    )


SITE = {"SITE_RANK": "3", "SITE_SIZE": "8", "SITE_LOCAL_RANK": "1", "SITE_JOB_ID": "77"}


@pytest.fixture
def detection_order_restored(monkeypatch):
    monkeypatch.setattr(environments, "_detection_order", list(environments.DETECTION_ORDER))
    monkeypatch.setattr(launcher_variables, "_launchers", list(launcher_variables.launchers()))


@pytest.mark.unit
def test_a_registered_environment_is_detected_before_the_schedulers(launcher_env, detection_order_restored):
    register_cluster_environment(SiteLauncherEnvironment)
    assert detection_order()[:3] == (TorchElasticEnvironment, SiteLauncherEnvironment, LSFEnvironment)
    launcher_env({**SBATCH_STEP, **OPENMPI, **SITE})  # the site's launcher inside sbatch, an mpirun's variables too
    assert detect_cluster_environment() is SiteLauncherEnvironment
    trainer = Trainer(
        accelerator="cpu", devices=2, num_nodes=4, strategy="ddp", logger=False, torch_dist_init_method="env://"
    )
    cluster = trainer.strategy.cluster_environment
    assert type(cluster) is SiteLauncherEnvironment and (cluster.global_rank(), cluster.world_size()) == (3, 8)
    # A LauncherEnvironment is either package's ClusterEnvironment through ABC.register, which mypy cannot see.
    assert launch_identity(cluster) == "SITE_JOB_ID=77"


@pytest.mark.unit
def test_registration_takes_a_place_and_refuses_to_replace_silently(detection_order_restored):
    register_cluster_environment(SiteLauncherEnvironment, before=SLURMEnvironment)
    assert detection_order()[-2:] == (SiteLauncherEnvironment, SLURMEnvironment)
    with pytest.raises(
        ValueError,
        match=r"SiteLauncherEnvironment is already in the detection order \(position 7 "
        r"of .*\). Pass replace=True",
    ):
        register_cluster_environment(SiteLauncherEnvironment)

    class OpenMPIEnvironment(LauncherEnvironment):  # a site's fix, under the built-in's name
        variables = environments.OpenMPIEnvironment.variables

    class FluxEnvironmentOfAnotherSite(FluxEnvironment):
        pass

    with pytest.raises(ValueError, match=r"OpenMPIEnvironment is already in the detection order"):
        register_cluster_environment(OpenMPIEnvironment)
    register_cluster_environment(OpenMPIEnvironment, replace=True)
    order = detection_order()
    assert OpenMPIEnvironment in order and environments.OpenMPIEnvironment not in order
    assert order.index(OpenMPIEnvironment) == environments.DETECTION_ORDER.index(environments.OpenMPIEnvironment)
    with pytest.raises(TypeError, match=r"needs a ClusterEnvironment subclass, got 'OpenMPI'"):
        register_cluster_environment("OpenMPI")  # type: ignore[arg-type]  # the wrong type is the test
    with pytest.raises(ValueError, match=r"before=<class '.*MPIEnvironment'> is not in the detection order"):
        register_cluster_environment(FluxEnvironmentOfAnotherSite, before=MPIEnvironment)


@pytest.mark.unit
def test_the_classes_and_the_detection_order_are_made_from_the_launcher_tables(detection_order_restored):
    ours = [entry for entry in detection_order() if issubclass(entry, LauncherEnvironment)]
    assert [environment.variables for environment in ours] == list(launchers())
    assert [environment.__name__ for environment in LAUNCHER_ENVIRONMENTS] == [table.name for table in launchers()]
    assert PALSEnvironment.__doc__ is not None
    assert PALSEnvironment.__doc__.startswith("Processes started by HPE PALS's ``mpiexec`` inside a PBS Pro job.")
    assert PALSEnvironment.__module__ == "lightning_dist_hooks.environments"
    register_cluster_environment(SiteLauncherEnvironment, before=OpenMPIEnvironment)  # a class: its table joins too
    assert [table.name for table in launchers()] == [
        "FluxEnvironment",
        "PALSEnvironment",
        "",
        "OpenMPIEnvironment",
        "MVAPICH2Environment",
        "HydraEnvironment",
    ]


# A site's MPI launcher, added by its table alone: what the scheduler sets in each of 8 ranks, 2 on each of 4 nodes.
SITE_MPI_TABLE = LauncherVariables(
    detect=("SITEMPI_RANK", "SITEMPI_SIZE", "SITEMPI_LOCAL_RANK"),
    rank="SITEMPI_RANK",
    world_size="SITEMPI_SIZE",
    local_rank="SITEMPI_LOCAL_RANK",
    local_size="SITEMPI_LOCAL_SIZE",
    identity=(("SITEMPI_JOB",),),
    name="SiteMPIEnvironment",
    about="Processes started by the site's own MPI launcher.",
    mpi=True,
)
SITE_MPI = {
    "SITEMPI_RANK": "3",
    "SITEMPI_SIZE": "8",
    "SITEMPI_LOCAL_RANK": "1",
    "SITEMPI_LOCAL_SIZE": "2",
    "SITEMPI_JOB": "j-77",
}


@pytest.mark.unit
def test_a_launcher_registered_by_its_table_gets_detection_the_size_checks_and_the_mpi_transport(
    launcher_env, detection_order_restored
):
    SiteMPIEnvironment = register_launcher(SITE_MPI_TABLE)
    assert issubclass(SiteMPIEnvironment, LauncherEnvironment) and SiteMPIEnvironment.__name__ == "SiteMPIEnvironment"
    assert SiteMPIEnvironment.__module__ == __name__ and SiteMPIEnvironment.variables is SITE_MPI_TABLE
    assert detection_order()[:3] == (TorchElasticEnvironment, SiteMPIEnvironment, LSFEnvironment)
    assert launchers()[0] is SITE_MPI_TABLE
    launcher_env({**SBATCH_STEP, **SITE_MPI})
    assert detect_cluster_environment() is SiteMPIEnvironment
    cluster = SiteMPIEnvironment()
    assert (cluster.global_rank(), cluster.local_rank(), cluster.node_rank()) == (3, 1, 1)
    assert launch_identity(cluster) == "SITEMPI_JOB=j-77"
    # The MPI transport reads the table, and so does the scrub of a job started from inside this one.
    assert mpi.detect_mpi_launch() == mpi.MpiLaunch(rank=3, world_size=8, local_rank=1, local_world_size=2)
    assert started_by_an_mpi_launcher(os.environ)
    assert without_launcher_variables({**SITE_MPI, "PATH": "/bin"}) == {"PATH": "/bin"}
    # The one size check, from the Trainer's validation, the MPI transport's launch check and the doctor.
    cluster.validate_settings(num_devices=2, num_nodes=4)
    with pytest.raises(ValueError, match=r"SiteMPIEnvironment: the launcher started 8 processes \(SITEMPI_SIZE=8\)"):
        cluster.validate_settings(num_devices=2, num_nodes=2)
    with pytest.raises(ValueError, match=r"makes a world of 4 processes, but the MPI launcher started 8"):
        mpi.check_mpi_launch("torch_dist_backend='mpi4py'", "torch_dist_backend='gloo'", 2, 2)
    mpi.check_mpi_launch("torch_dist_backend='mpi4py'", "torch_dist_backend='gloo'", 2, 4)
    layout = launcher_layout()
    assert layout is not None
    assert (layout.tasks_per_node, layout.nodes) == ([2], 4)
    (tasks, nodes) = check_launcher_layout(layout, devices=2, num_nodes=2)
    assert (tasks.status, nodes.status) == ("ok", "fail") and "num_nodes=2" in nodes.message


@pytest.mark.unit
def test_a_launcher_table_needs_a_class_name_to_register(detection_order_restored):
    with pytest.raises(ValueError, match=r"needs a class name to register, e.g. name='SiteEnvironment'; got ''"):
        register_launcher(SiteLauncherEnvironment.variables)
    register_launcher(SITE_MPI_TABLE)
    with pytest.raises(ValueError, match=r"SiteMPIEnvironment is already in the detection order"):
        register_launcher(SITE_MPI_TABLE)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("size", "devices", "num_nodes", "mismatches"),
    [
        (LaunchSize(8, (2,), 4), 2, 4, []),
        (LaunchSize(8, (2,), 4), 2, 2, [SizeMismatch.WORLD_SIZE, SizeMismatch.NODES]),
        (LaunchSize(8, (2,), 4), 4, 2, [SizeMismatch.PER_NODE, SizeMismatch.NODES]),
        (LaunchSize(per_node=(4, 4, 3), nodes=3), 4, 3, [SizeMismatch.UNEVEN]),
        (LaunchSize(world_size=6), 2, 3, []),  # nothing said per node: nothing compared there
        (LaunchSize(), 2, 3, []),
    ],
)
def test_one_size_check_compares_a_launch_with_devices_and_num_nodes(size, devices, num_nodes, mismatches):
    assert size.mismatches(devices, num_nodes) == mismatches


@pytest.mark.unit
@pytest.mark.parametrize(
    ("variables", "node_rank"),
    [
        ({**SITE, "SITE_NODES": "2", "SITE_LOCAL_SIZE": "8"}, 0),  # nodes first: 8 ranks / 2 nodes -> rank 3 on node 0
        ({**SITE, "SITE_LOCAL_SIZE": "2"}, 1),  # else this node's size: 2 per node -> node 1
        (SITE, 0),  # neither: one node
    ],
)
def test_node_rank_is_derived_from_the_node_count_else_the_local_size(launcher_env, variables, node_rank):
    launcher_env(variables)
    assert SiteLauncherEnvironment().node_rank() == node_rank


@pytest.mark.unit
@pytest.mark.parametrize(
    ("environment", "variables"),
    [
        (OpenMPIEnvironment, OPENMPI),
        (HydraEnvironment, HYDRA),
        (MVAPICH2Environment, MVAPICH2),
        (PALSEnvironment, PALS),
    ],
)
def test_the_mpi_transport_reads_the_same_tables(launcher_env, environment, variables):
    launcher_env(variables)
    cluster = environment()
    launch = mpi.detect_mpi_launch()
    assert launch is not None
    assert (launch.rank, launch.world_size, launch.local_rank) == (
        cluster.global_rank(),
        cluster.world_size(),
        cluster.local_rank(),
    )
    assert launch.local_world_size == 2


@pytest.mark.unit
def test_the_scrub_list_covers_every_launcher_variable():
    tables = {environment.__name__: environment.variables.names() for environment in LAUNCHER_ENVIRONMENTS}
    lightnings = {
        "SLURM": SRUN,
        "torchrun": {
            "TORCHELASTIC_RUN_ID": "",
            "RANK": "",
            "LOCAL_RANK": "",
            "WORLD_SIZE": "",
            "GROUP_RANK": "",
            "LOCAL_WORLD_SIZE": "",
            "MASTER_ADDR": "",
            "MASTER_PORT": "",
            "TORCHELASTIC_RESTART_COUNT": "",
        },
        "jsrun": {**JSRUN, "LSB_DJOB_RANKFILE": ""},
        "Lightning": {"NODE_RANK": "", LAUNCH_TOKEN_VARIABLE: ""},
    }
    for name, variables in [*tables.items(), *((name, set(env)) for name, env in lightnings.items())]:
        assert not [variable for variable in variables if not is_launcher_variable(variable)], name
    assert not is_launcher_variable("PATH") and not is_launcher_variable("GLOO_SOCKET_IFNAME")


@pytest.mark.slow  # the rendezvous file's janitor is a process
def test_a_leftover_file_with_its_claim_stops_the_rerun_with_the_file_named(tmp_path):
    url = f"file://{tmp_path}/ldh-rendezvous-job"
    first = FileInitMethod().prepare(url, Rank(1))  # an earlier run, killed: nothing removed
    private = tmp_path / f"ldh-uid-{os.geteuid()}"  # the per-user directory (issue 9)
    assert first.claim == private / "ldh-rendezvous-job.rank1.claim"
    assert oct(first.claim.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(RuntimeError, match=rf"rank 1 found {first.claim} and {first.file} left by an earlier run"):
        FileInitMethod().prepare(url, Rank(1))
    # A peer of the same launch (another rank) is never mistaken for a leftover.
    assert FileInitMethod().prepare(url, Rank(0)).claim == private / "ldh-rendezvous-job.rank0.claim"


@pytest.mark.slow  # the rendezvous file's janitor is a process
def test_a_leftover_claim_without_its_file_is_taken_over(tmp_path):
    private = tmp_path / f"ldh-uid-{os.geteuid()}"  # the per-user directory (issue 9)
    private.mkdir(mode=0o700)
    (private / "ldh-rendezvous-job.rank0.claim").touch(mode=0o600)
    rendezvous = FileInitMethod().prepare(f"file://{tmp_path}/ldh-rendezvous-job", Rank(0))
    assert rendezvous.file.exists() and rendezvous.claim.exists()


def _assert_emulated_fit(result, environment: str, rendezvous_dir: Path, identity_part: str) -> None:
    result.assert_ok()
    assert sorted(result.ranks) == [0, 1], result.output
    for rank, record in result.ranks.items():
        assert (record["environment"], record["world_size"], record["local_rank"]) == (environment, 2, rank)
        (call,) = record["setup_calls"]
        assert call["rank"] == rank and call["rendezvous_file_mode"] == "0o600"
        assert call["init_method"].startswith(
            f"file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/ldh-rendezvous-{identity_part}"
        )
    result.same_on_all_ranks("weights_sha256")
    result.same_on_all_ranks("store")
    assert list(rendezvous_dir.iterdir()) == []


def _run_emulated(per_rank, tmp_path, rendezvous_dir, *extra_flags: str):
    # MASTER_ADDR/MASTER_PORT point nowhere: a file:// rendezvous must not read them.
    def environment(rank: int) -> dict[str, str]:
        return {**per_rank(rank), "MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "1"}

    flags = [*FIT_FLAGS, "--init-method", f"file://{rendezvous_dir}/", *extra_flags]
    return run_ranks([job_environment(**environment(rank)) for rank in range(2)], flags, tmp_path / "out", tmp_path)


@pytest.mark.slow
def test_emulated_flux_run(tmp_path, rendezvous_dir):
    result = _run_emulated(
        lambda rank: {
            "FLUX_TASK_RANK": str(rank),
            "FLUX_TASK_LOCAL_ID": str(rank),
            "FLUX_JOB_SIZE": "2",
            "FLUX_JOB_NNODES": "1",
            "FLUX_JOB_ID": "ƒ2Bt7T6Cw",
            "PMI_RANK": str(rank),
            "PMI_SIZE": "2",
        },
        tmp_path,
        rendezvous_dir,
    )
    _assert_emulated_fit(result, "FluxEnvironment", rendezvous_dir, "FLUX_JOB_ID-2Bt7T6Cw")


@pytest.mark.slow
def test_emulated_pbs_pals_mpiexec_through_plugins(tmp_path, rendezvous_dir):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("127.0.0.1\n127.0.0.1\n")
    result = _run_emulated(
        lambda rank: {
            "PALS_RANKID": str(rank),
            "PALS_LOCAL_RANKID": str(rank),
            "PALS_NODEID": "0",
            "PALS_APID": "7f1c-aa",
            "PMI_RANK": str(rank),
            "PMI_SIZE": "2",
            "PBS_JOBID": "1234.pbs01",
            "PBS_NODEFILE": str(nodefile),
        },
        tmp_path,
        rendezvous_dir,
        "--cluster-environment",
        "PALSEnvironment",
    )
    _assert_emulated_fit(result, "PALSEnvironment", rendezvous_dir, "PBS_JOBID-1234.pbs01-PALS_APID-7f1c-aa")


@pytest.mark.slow
def test_emulated_lsf_jsrun(tmp_path, rendezvous_dir):
    # jsrun with Spectrum MPI sets OMPI_COMM_WORLD_* too; Lightning's LSFEnvironment must still win.
    rankfile = tmp_path / "rankfile"
    rankfile.write_text(f"launchnode\n{socket.gethostname()}\n{socket.gethostname()}\n")
    result = _run_emulated(
        lambda rank: {
            "LSB_JOBID": "4242",
            "LSB_DJOB_RANKFILE": str(rankfile),
            "JSM_NAMESPACE_RANK": str(rank),
            "JSM_NAMESPACE_LOCAL_RANK": str(rank),
            "JSM_NAMESPACE_SIZE": "2",
            "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
        },
        tmp_path,
        rendezvous_dir,
    )
    _assert_emulated_fit(result, "LSFEnvironment", rendezvous_dir, "LSB_JOBID-4242")


@pytest.mark.slow
def test_emulated_mvapich2_mpirun_rsh_inside_an_sbatch_job(tmp_path, rendezvous_dir):
    # The batch step's SLURM_* are inherited (SLURM_PROCID=0 on both ranks): MVAPICH2's own variables must win.
    result = _run_emulated(
        lambda rank: {
            **SBATCH_STEP,
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "MV2_COMM_WORLD_RANK": str(rank),
            "MV2_COMM_WORLD_SIZE": "2",
            "MV2_COMM_WORLD_LOCAL_RANK": str(rank),
            "MV2_COMM_WORLD_LOCAL_SIZE": "2",
        },
        tmp_path,
        rendezvous_dir,
    )
    _assert_emulated_fit(result, "MVAPICH2Environment", rendezvous_dir, "SLURM_JOB_ID-42")
