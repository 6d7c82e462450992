"""What launchers tell the processes they start: one table of environment variables per launcher.

The one place that knows these names. The registry (:func:`launchers`, in detection order) is what everything else
derives from: ``environments.py`` makes one Lightning cluster environment class per table and tries them in this
order, ``mpi._launch`` finds its rank before MPI starts in the tables marked ``mpi``, the Trainer, the MPI transport
and the doctor compare the launch with ``devices`` and ``num_nodes`` through :class:`LaunchSize`, and tests and
benchmarks scrub every launcher's variables (:func:`without_launcher_variables`) before starting a job of their own.
A launcher of a user's joins the registry through ``environments.register_launcher``.

This module imports neither torch nor Lightning, so the MPI transport and the benchmark harness can use it alone.

>>> OPEN_MPI.rank
'OMPI_COMM_WORLD_RANK'
>>> without_launcher_variables({"PATH": "/bin", "SLURM_PROCID": "3", "MASTER_PORT": "29500"})
{'PATH': '/bin'}
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherVariables:
    """One launcher: the variables it sets in every process it starts, and what follows from them.

    ``detect``: all of them set means this launcher started the process. ``rank``, ``world_size``, ``local_rank``:
    always set. ``local_size``, ``node_rank``, ``node_count``: set by some launchers only. ``identity``: names for
    this launch, alternatives of which the first complete one wins; in each, the first name is required and the
    others are appended when set (see ``environments.identity_from``). ``name``: the cluster environment class made
    from the table (``environments.register_launcher``); ``about``: that class's docstring. ``mpi``: MPI numbers the
    processes (an MPI launcher), so the MPI transport takes its rank from ``rank`` and ``world_size`` as soon as both
    are set. ``main_address_file``: a variable naming a file whose first line is rank 0's host (PBS's nodefile).
    """

    detect: tuple[str, ...]
    rank: str
    world_size: str
    local_rank: str
    local_size: str | None = None
    node_rank: str | None = None
    node_count: str | None = None
    identity: tuple[tuple[str, ...], ...] = ()
    name: str = ""
    about: str = ""
    mpi: bool = False
    main_address_file: str | None = None

    def detected(self, environ: Mapping[str, str]) -> bool:
        """Whether this launcher started the process whose environment is ``environ``."""
        return all(name in environ for name in self.detect)

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
                *filter(None, (self.main_address_file,)),
            )
        )


class SizeMismatch(enum.Enum):
    """How a launch can differ from ``devices`` processes on each of ``num_nodes`` nodes."""

    WORLD_SIZE = "world size"  # processes in all, against devices * num_nodes
    UNEVEN = "uneven"  # a different number of processes on some node
    PER_NODE = "per node"  # processes on a node, against devices
    NODES = "nodes"  # nodes, against num_nodes


@dataclass(frozen=True)
class LaunchSize:
    """What a launcher says of its launch: processes in all, on each node (one number: the same on every node), and
    nodes; None or empty where it does not say.

    The one check of a launch against ``Trainer(devices=..., num_nodes=...)``, read by the cluster environments'
    ``validate_settings``, the MPI transport's launch check and the doctor's layout verdicts:

    >>> LaunchSize(world_size=8, per_node=(2,), nodes=4).mismatches(devices=2, num_nodes=2)
    [<SizeMismatch.WORLD_SIZE: 'world size'>, <SizeMismatch.NODES: 'nodes'>]
    >>> LaunchSize(per_node=(4, 4, 3), nodes=3).mismatches(devices=4, num_nodes=3)
    [<SizeMismatch.UNEVEN: 'uneven'>]
    """

    world_size: int | None = None
    per_node: tuple[int, ...] = ()
    nodes: int | None = None

    def mismatches(self, devices: int, num_nodes: int) -> list[SizeMismatch]:
        """Every way this launch differs from ``devices`` processes on each of ``num_nodes`` nodes, none if it fits."""
        found = []
        if self.world_size is not None and self.world_size != devices * num_nodes:
            found.append(SizeMismatch.WORLD_SIZE)
        if len(set(self.per_node)) > 1:
            found.append(SizeMismatch.UNEVEN)
        elif self.per_node and self.per_node[0] != devices:
            found.append(SizeMismatch.PER_NODE)
        if self.nodes is not None and self.nodes != num_nodes:
            found.append(SizeMismatch.NODES)
        return found


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
    name="OpenMPIEnvironment",
    about="Processes started by OpenMPI's ``mpirun``/``mpiexec`` (or PRRTE's ``prterun``); identity "
    "``PMIX_NAMESPACE``.",
    mpi=True,
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
    name="HydraEnvironment",
    about="""Processes started by the Hydra process manager: MPICH's and Intel MPI's ``mpiexec``/``mpirun``.

    A process ``srun --mpi=pmi2`` started stays SLURM's (no ``MPI_LOCALRANKID``). Hydra names no launch, so the
    identity is the enclosing allocation's.
    """,
    mpi=True,
)

# MVAPICH2's mpirun_rsh and mpiexec.
MVAPICH2 = LauncherVariables(
    detect=("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK"),
    rank="MV2_COMM_WORLD_RANK",
    world_size="MV2_COMM_WORLD_SIZE",
    local_rank="MV2_COMM_WORLD_LOCAL_RANK",
    local_size="MV2_COMM_WORLD_LOCAL_SIZE",
    identity=ALLOCATION_IDENTITY,
    name="MVAPICH2Environment",
    about="Processes started by MVAPICH2's ``mpirun_rsh`` or ``mpiexec``.",
    mpi=True,
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
    name="FluxEnvironment",
    about="""Tasks started by ``flux run`` / ``flux submit``; ``FLUX_JOB_ID`` is unique for every job, never reused.

    Flux also sets ``PMI_RANK``/``PMI_SIZE`` (its PMI server), which is why Flux is detected before Hydra.
    """,
)

# HPE PALS's mpiexec inside a PBS Pro job. PBS_JOBID is required for detection, so srun --mpi=cray_shasta (which
# sets PALS_* too) is not taken for it. PALS_APID names each mpiexec inside the job. PALS places rank 0 on the first
# host of PBS_NODEFILE.
PALS = LauncherVariables(
    detect=("PALS_RANKID", "PALS_LOCAL_RANKID", "PMI_SIZE", "PBS_JOBID"),
    rank="PALS_RANKID",
    world_size="PMI_SIZE",
    local_rank="PALS_LOCAL_RANKID",
    local_size="PALS_LOCAL_SIZE",
    node_rank="PALS_NODEID",
    identity=(("PBS_JOBID", "PALS_APID"),),
    name="PALSEnvironment",
    about="""Processes started by HPE PALS's ``mpiexec`` inside a PBS Pro job.

    PALS gives the node index (``PALS_NODEID``); the main address is the first host of ``PBS_NODEFILE``, where
    PALS places rank 0.
    """,
    mpi=True,
    main_address_file="PBS_NODEFILE",
)

# Every launcher known, innermost first: the order in which a process's launcher is looked for. An mpirun, flux
# or PALS mpiexec inside another launcher's allocation inherits the outer one's variables, never the other way
# round (see environments.DETECTION_ORDER). Flux and PALS go before Hydra: both set PMI_RANK/PMI_SIZE too.
# environments.register_launcher keeps it in the cluster environments' detection order.
_launchers: list[LauncherVariables] = [FLUX, PALS, OPEN_MPI, MVAPICH2, HYDRA]


def launchers() -> tuple[LauncherVariables, ...]:
    """Every launcher's table, built-in and registered, in detection order.

    >>> [launcher.name for launcher in launchers()][:2]
    ['FluxEnvironment', 'PALSEnvironment']
    """
    return tuple(_launchers)


def arrange_launchers(tables: Iterable[LauncherVariables]) -> None:
    """Make ``tables`` the registry, in their order: ``environments`` calls it whenever its detection order changes,
    so that the two agree."""
    _launchers[:] = tables


# Lightning's launchers, whose cluster environments are Lightning's own: the variables that name one launch
# (launches.py). SLURM: the job id survives a requeue, so the step id (a new one for every srun) and the restart count
# (absent at first, 1, 2, ... after each requeue) go with it. LSF: LSB_JOBINDEX tells the elements of a job array
# apart. torchrun: the run id and, on one node only, the restart count (each agent counts its own workers' restarts).
# Keyed by Lightning's class name: either Lightning package's copy of the class.
LIGHTNING_IDENTITIES: dict[str, tuple[tuple[str, ...], ...]] = {
    "SLURMEnvironment": (("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"),),
    "LSFEnvironment": (("LSB_JOBID", "LSB_JOBINDEX", "PMIX_NAMESPACE"),),
}
TORCHRUN_SINGLE_NODE_IDENTITY = (("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"),)
TORCHRUN_MULTI_NODE_IDENTITY = (("TORCHELASTIC_RUN_ID",),)
# Set by the process that runs Lightning's own launcher (``ddp``), inherited by the children it starts: this
# package's name for such a launch (launches.py).
LAUNCH_TOKEN_VARIABLE = "LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN"


def mpi_launchers() -> tuple[LauncherVariables, ...]:
    """The launchers whose processes MPI itself numbers (``mpi``), in detection order."""
    return tuple(launcher for launcher in _launchers if launcher.mpi)


# Rank variables of MPI launchers without a table here (PMIx's prun, Cray ALPS), and Hydra's local rank, which srun
# --mpi=pmi2 does not set. Rank variables only: OMPI_MCA_*, MV2_*, I_MPI_* are also users' own settings.
_OTHER_MPI_RANK_VARIABLES = frozenset({HYDRA.local_rank, "PMIX_RANK", "ALPS_APP_PE"})


def mpi_rank_variables() -> frozenset[str]:
    """The rank variable each MPI launcher sets for the processes it starts, the registry's (Open MPI, MPICH's and
    Intel MPI's Hydra, MVAPICH2, Cray PALS, and any registered with ``mpi``) and others (PMIx's prun, Cray ALPS): a
    process with none of them was not started by one."""
    return frozenset({*(launcher.rank for launcher in mpi_launchers()), *_OTHER_MPI_RANK_VARIABLES})


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
        LAUNCH_TOKEN_VARIABLE,
    }
)


def is_launcher_variable(name: str) -> bool:
    """Whether a launcher (or torch's ``env://``) sets ``name`` for the processes it starts: by the prefixes and
    names above, or as a variable of a registered launcher's table."""
    return (
        name.startswith(LAUNCHER_VARIABLE_PREFIXES)
        or name in LAUNCHER_VARIABLES
        or any(name in launcher.names() for launcher in _launchers)
    )


def started_by_an_mpi_launcher(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` holds the rank variable of some MPI launcher (:func:`mpi_rank_variables`).

    >>> started_by_an_mpi_launcher({"PMI_RANK": "0"}), started_by_an_mpi_launcher({"OMPI_MCA_btl": "self,vader"})
    (True, False)
    """
    return not mpi_rank_variables().isdisjoint(environ)


# How many tasks SLURM starts on this node: "4", or "4(x2)" for four on each of two nodes, "4,3" per node in turn.
SLURM_TASKS_ON_NODES = "SLURM_STEP_TASKS_PER_NODE"


def local_rank_count(environ: Mapping[str, str]) -> int | None:
    """How many ranks the launcher started on this node, where it says so (an MPI launcher's ``local_size``, or
    SLURM's tasks on the first node of the step), else None.

    >>> local_rank_count({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}), local_rank_count({"SLURM_STEP_TASKS_PER_NODE": "4(x2)"})
    (8, 4)
    """
    for launcher in mpi_launchers():
        if launcher.local_size is not None and environ.get(launcher.local_size, "").isdigit():
            return int(environ[launcher.local_size])
    leading = environ.get(SLURM_TASKS_ON_NODES, "").split("(")[0].split(",")[0]
    return int(leading) if leading.isdigit() else None


# What SLURM and PMIx tell a rank that srun --mpi=pmix started (srun sets none of an MPI launcher's own variables).
SLURM_RANK_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST")
PMIX_VARIABLES = ("PMIX_RANK", "PMIX_NAMESPACE")


def launcher_facts(environ: Mapping[str, str]) -> str:
    """What the launchers told this process of its place in the job, as ``NAME=value`` in the registry's order: what
    a rank can say of a launch before MPI knows its peers.

    >>> launcher_facts({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "HOME": "/root"})
    'OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2'
    """
    names: list[str] = []
    for launcher in _launchers:
        names += [launcher.rank, launcher.world_size, launcher.local_rank, *filter(None, (launcher.local_size,))]
    names += [*SLURM_RANK_VARIABLES, *PMIX_VARIABLES]
    shown = [f"{name}={environ[name]}" for name in dict.fromkeys(names) if name in environ]
    return ", ".join(shown) or "no launcher variable is set"


def without_launcher_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` minus every launcher variable: the environment for a job that must start a launch of its own."""
    return {name: value for name, value in environ.items() if not is_launcher_variable(name)}
