"""What launchers tell the processes they start: one table of environment variables per launcher.

The one place that knows these names. ``environments.py`` builds Lightning cluster environments on the tables,
``mpi._launch`` reads the MPI launchers' tables to find its rank before MPI starts, and tests and benchmarks
scrub every launcher's variables (:func:`without_launcher_variables`) before starting a job of their own.

This module imports neither torch nor Lightning, so the MPI transport and the benchmark harness can use it alone.

>>> OPEN_MPI.rank
'OMPI_COMM_WORLD_RANK'
>>> without_launcher_variables({"PATH": "/bin", "SLURM_PROCID": "3", "MASTER_PORT": "29500"})
{'PATH': '/bin'}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherVariables:
    """The variables one launcher sets in every process it starts.

    ``detect``: all of them set means this launcher started the process. ``rank``, ``world_size``, ``local_rank``:
    always set. ``local_size``, ``node_rank``, ``node_count``: set by some launchers only. ``identity``: names for
    this launch, alternatives of which the first complete one wins; in each, the first name is required and the
    others are appended when set (see ``environments.identity_from``).
    """

    detect: tuple[str, ...]
    rank: str
    world_size: str
    local_rank: str
    local_size: str | None = None
    node_rank: str | None = None
    node_count: str | None = None
    identity: tuple[tuple[str, ...], ...] = ()

    def names(self) -> frozenset[str]:
        """Every variable this table mentions."""
        optional = (self.local_size, self.node_rank, self.node_count)
        return frozenset(
            (
                *self.detect,
                self.rank,
                self.world_size,
                self.local_rank,
                *filter(None, optional),
                *(name for names in self.identity for name in names),
            )
        )


# The enclosing allocation, for MPI launchers that name no launch of their own. Several launches inside one
# allocation share it; the rendezvous claim files (init_methods.py) turn a leftover from one into a clear error.
ALLOCATION_IDENTITY = (("FLUX_JOB_ID",), ("PBS_JOBID",), ("LSB_JOBID", "LSB_JOBINDEX"), ("SLURM_JOB_ID",))

# OpenMPI's mpirun/mpiexec (and PRRTE's prterun). OMPI_COMM_WORLD_NODE_RANK is deliberately absent: despite its
# name it is a rank among the processes on this node, not a node index. PMIX_NAMESPACE is new for every mpirun.
OPEN_MPI = LauncherVariables(
    detect=("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    rank="OMPI_COMM_WORLD_RANK",
    world_size="OMPI_COMM_WORLD_SIZE",
    local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
    local_size="OMPI_COMM_WORLD_LOCAL_SIZE",
    identity=(("PMIX_NAMESPACE",), *ALLOCATION_IDENTITY),
)

# The Hydra process manager: MPICH's and Intel MPI's mpiexec/mpirun. MPI_LOCALRANKID is required for detection:
# srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE too, but not it. Hydra names no launch: the allocation's identity.
HYDRA = LauncherVariables(
    detect=("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    rank="PMI_RANK",
    world_size="PMI_SIZE",
    local_rank="MPI_LOCALRANKID",
    local_size="MPI_LOCALNRANKS",
    identity=ALLOCATION_IDENTITY,
)

# MVAPICH2's mpirun_rsh and mpiexec.
MVAPICH2 = LauncherVariables(
    detect=("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK"),
    rank="MV2_COMM_WORLD_RANK",
    world_size="MV2_COMM_WORLD_SIZE",
    local_rank="MV2_COMM_WORLD_LOCAL_RANK",
    local_size="MV2_COMM_WORLD_LOCAL_SIZE",
    identity=ALLOCATION_IDENTITY,
)

# flux run / flux submit. FLUX_JOB_ID is unique for every job, never reused. Flux's PMI server sets
# PMI_RANK/PMI_SIZE too.
FLUX = LauncherVariables(
    detect=("FLUX_TASK_RANK", "FLUX_TASK_LOCAL_ID", "FLUX_JOB_SIZE", "FLUX_JOB_ID"),
    rank="FLUX_TASK_RANK",
    world_size="FLUX_JOB_SIZE",
    local_rank="FLUX_TASK_LOCAL_ID",
    node_count="FLUX_JOB_NNODES",
    identity=(("FLUX_JOB_ID",),),
)

# HPE PALS's mpiexec inside a PBS Pro job. PBS_JOBID is required for detection, so srun --mpi=cray_shasta (which
# sets PALS_* too) is not taken for it. PALS_APID names each mpiexec inside the job.
PALS = LauncherVariables(
    detect=("PALS_RANKID", "PALS_LOCAL_RANKID", "PMI_SIZE", "PBS_JOBID"),
    rank="PALS_RANKID",
    world_size="PMI_SIZE",
    local_rank="PALS_LOCAL_RANKID",
    local_size="PALS_LOCAL_SIZE",
    node_rank="PALS_NODEID",
    identity=(("PBS_JOBID", "PALS_APID"),),
)

# The launchers whose processes MPI itself numbers, in the order the MPI transport looks for them.
MPI_LAUNCHERS = (OPEN_MPI, HYDRA, MVAPICH2)

# The rank variable each MPI launcher sets for the processes it starts, ours above (Open MPI, MPICH's and Intel
# MPI's Hydra, MVAPICH2, Cray PALS) and others (PMIx's prun, Cray ALPS): a process with none of them was not
# started by one. Rank variables only: OMPI_MCA_*, MV2_*, I_MPI_* are also users' own settings.
MPI_RANK_VARIABLES = frozenset(
    {*(launcher.rank for launcher in (*MPI_LAUNCHERS, PALS)), HYDRA.local_rank, "PMIX_RANK", "ALPS_APP_PE"}
)

# What a launcher sets that a job started from inside it must not inherit, or that job would take the outer
# launcher's ranks (or an earlier launch's identity) for its own: every family above and Lightning's (SLURM, LSF's
# jsrun, torchrun), by prefix, and single names torch and Lightning read.
LAUNCHER_VARIABLE_PREFIXES = (
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_LOCAL",
    "MV2_",
    "FLUX_",
    "PALS_",
    "PBS_",
    "LSB_",
    "JSM_",
    "TORCHELASTIC_",
)
LAUNCHER_VARIABLES = frozenset(
    {
        # torch's env:// and torchrun
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        # Lightning's own launcher (LightningEnvironment), and this package's token for its launches (launches.py)
        "NODE_RANK",
        "LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN",
    }
)


def is_launcher_variable(name: str) -> bool:
    """Whether a launcher (or torch's ``env://``) sets ``name`` for the processes it starts."""
    return name.startswith(LAUNCHER_VARIABLE_PREFIXES) or name in LAUNCHER_VARIABLES


def started_by_an_mpi_launcher(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` holds the rank variable of some MPI launcher (``MPI_RANK_VARIABLES``).

    >>> started_by_an_mpi_launcher({"PMI_RANK": "0"}), started_by_an_mpi_launcher({"OMPI_MCA_btl": "self,vader"})
    (True, False)
    """
    return not MPI_RANK_VARIABLES.isdisjoint(environ)


# How many tasks SLURM starts on this node: "4", or "4(x2)" for four on each of two nodes, "4,3" per node in turn.
SLURM_TASKS_ON_NODES = "SLURM_STEP_TASKS_PER_NODE"


def local_rank_count(environ: Mapping[str, str]) -> int | None:
    """How many ranks the launcher started on this node, where it says so (an MPI launcher's ``local_size``, or
    SLURM's tasks on the first node of the step), else None.

    >>> local_rank_count({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}), local_rank_count({"SLURM_STEP_TASKS_PER_NODE": "4(x2)"})
    (8, 4)
    """
    for launcher in (*MPI_LAUNCHERS, PALS):
        if launcher.local_size is not None and environ.get(launcher.local_size, "").isdigit():
            return int(environ[launcher.local_size])
    leading = environ.get(SLURM_TASKS_ON_NODES, "").split("(")[0].split(",")[0]
    return int(leading) if leading.isdigit() else None


# What SLURM and PMIx tell a rank that srun --mpi=pmix started (srun sets none of an MPI launcher's own variables).
SLURM_RANK_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST")
PMIX_VARIABLES = ("PMIX_RANK", "PMIX_NAMESPACE")


def launcher_facts(environ: Mapping[str, str]) -> str:
    """What the launchers told this process of its place in the job, as ``NAME=value`` in table order: what a rank
    can say of a launch before MPI knows its peers.

    >>> launcher_facts({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "HOME": "/root"})
    'OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2'
    """
    names: list[str] = []
    for launcher in (*MPI_LAUNCHERS, PALS, FLUX):
        names += [launcher.rank, launcher.world_size, launcher.local_rank, *filter(None, (launcher.local_size,))]
    names += [*SLURM_RANK_VARIABLES, *PMIX_VARIABLES]
    shown = [f"{name}={environ[name]}" for name in dict.fromkeys(names) if name in environ]
    return ", ".join(shown) or "no launcher variable is set"


def without_launcher_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` minus every launcher variable: the environment for a job that must start a launch of its own."""
    return {name: value for name, value in environ.items() if not is_launcher_variable(name)}
