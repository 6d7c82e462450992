"""Lightning ``ClusterEnvironment`` classes for the launchers Lightning does not know: OpenMPI, MPICH/Intel MPI
(Hydra), MVAPICH2, Flux and PBS Pro with HPE PALS.

Each launcher is one table of the environment variables it sets for every process (submitit's idea), read by a
shared base class. None of them initialises MPI to detect itself: they read variables only, unlike Lightning's
``MPIEnvironment.detect()``, which calls ``MPI_Init`` through mpi4py as a side effect.

Use one explicitly with ``Trainer(plugins=[OpenMPIEnvironment()])``, or let ``lightning_dist_hooks.Trainer``
pick it: :func:`detect_cluster_environment` gives the environment in the priority order below.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path
from typing import ClassVar, Optional

from lightning_fabric.plugins.environments import (
    ClusterEnvironment,
    LSFEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

log = logging.getLogger(__name__)

# env:// without MASTER_PORT: a port derived from the job identity, so every rank computes the same one without
# talking to the others (Lightning's SLURMEnvironment does the same from the job id). 10000 ports from 20000 up.
_DERIVED_PORT_BASE, _DERIVED_PORT_RANGE = 20000, 10000
# torchrun's default, for a launcher that gives no job identity to derive a port from.
_DEFAULT_PORT = 29500


class SchedulerEnvironment(ClusterEnvironment):
    """A launcher described by the environment variables it sets in every process it starts.

    Subclasses fill in the table (class attributes); everything else is shared:

    * ``detect()``: every variable in ``detect_variables`` is set;
    * ranks and world size: straight from the variables;
    * node rank: ``node_rank_variable`` when the launcher gives one, otherwise derived as
      ``global_rank // ranks_per_node``, where ranks per node is ``world_size // nodes`` (``node_count_variable``)
      or this node's ``local_size_variable``. That holds for block placement (ranks 0..k-1 on the first node, the
      default of every launcher here) with the same number of ranks on each node; Lightning uses the node rank only
      for its own logging and paths, never to address a peer;
    * main address (read only for ``env://``): ``MASTER_ADDR``, else the scheduler's own (:meth:`scheduler_main_address`),
      else ``127.0.0.1`` when all ranks are on this node; otherwise a ``RuntimeError`` saying to use ``file://`` or
      set ``MASTER_ADDR``. A ``file://`` rendezvous never reads it;
    * main port (read only for ``env://``): ``MASTER_PORT``, else one derived from the job identity, else 29500.
    """

    detect_variables: ClassVar[tuple[str, ...]] = ()
    rank_variable: ClassVar[str] = ""
    world_size_variable: ClassVar[str] = ""
    local_rank_variable: ClassVar[str] = ""
    local_size_variable: ClassVar[Optional[str]] = None
    node_rank_variable: ClassVar[Optional[str]] = None
    node_count_variable: ClassVar[Optional[str]] = None
    # Alternatives, first complete one wins; the first name of each is required, the others are appended when set.
    identity_variables: ClassVar[tuple[tuple[str, ...], ...]] = ()

    @classmethod
    def detect(cls) -> bool:
        return all(name in os.environ for name in cls.detect_variables)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return _int_variable(self.world_size_variable)

    def global_rank(self) -> int:
        return _int_variable(self.rank_variable)

    def local_rank(self) -> int:
        return _int_variable(self.local_rank_variable)

    def set_world_size(self, size: int) -> None:
        log.debug(f"{type(self).__name__}.set_world_size ignored: the launcher decides the world size.")

    def set_global_rank(self, rank: int) -> None:
        log.debug(f"{type(self).__name__}.set_global_rank ignored: the launcher decides the rank.")

    def node_rank(self) -> int:
        if self.node_rank_variable is not None and self.node_rank_variable in os.environ:
            return _int_variable(self.node_rank_variable)
        return self.global_rank() // self._ranks_per_node()

    def _ranks_per_node(self) -> int:
        if self.node_count_variable is not None and self.node_count_variable in os.environ:
            return max(1, self.world_size() // _int_variable(self.node_count_variable))
        if self.local_size_variable is not None and self.local_size_variable in os.environ:
            return max(1, _int_variable(self.local_size_variable))
        return self.world_size()  # nothing says otherwise: one node

    def _all_ranks_on_this_node(self) -> bool:
        return self._ranks_per_node() >= self.world_size()

    def scheduler_main_address(self) -> Optional[str]:
        """Rank 0's host as the scheduler tells it, if it does (None here; PBS overrides it)."""
        return None

    @property
    def main_address(self) -> str:
        address = os.environ.get("MASTER_ADDR") or self.scheduler_main_address()
        if address:
            return address
        if self._all_ranks_on_this_node():
            return "127.0.0.1"
        raise RuntimeError(
            f"{type(self).__name__}: env:// needs rank 0's address, and this launcher does not give it. Use "
            "torch_dist_init_method='file:///SHARED/DIR/' (no address needed), 'tcp://RANK0_HOST:PORT', or export "
            "MASTER_ADDR to every rank."
        )

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return _int_variable("MASTER_PORT")
        identity = self.job_identity()
        if identity is None:
            return _DEFAULT_PORT
        return _DERIVED_PORT_BASE + zlib.crc32(identity.encode()) % _DERIVED_PORT_RANGE

    @classmethod
    def job_identity(cls) -> Optional[str]:
        """A name for this launch that every rank derives from its own environment, or None."""
        return identity_from(cls.identity_variables)


def identity_from(alternatives: tuple[tuple[str, ...], ...]) -> Optional[str]:
    """``"NAME=value,NAME=value"`` from the first alternative whose first variable is set, else None."""
    for names in alternatives:
        if names[0] in os.environ:
            return ",".join(f"{name}={os.environ[name]}" for name in names if name in os.environ)
    return None


def _int_variable(name: str) -> int:
    value = os.environ.get(name)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise RuntimeError(f"The launcher should set {name} to an integer, but it is {value!r}.") from None


# The enclosing allocation, for MPI launchers that name no launch of their own. Several launches inside one
# allocation share it; the rendezvous claim files (init_methods.py) turn a leftover from one into a clear error.
_ALLOCATION_IDENTITY = (("FLUX_JOB_ID",), ("PBS_JOBID",), ("LSB_JOBID", "LSB_JOBINDEX"), ("SLURM_JOB_ID",))


class OpenMPIEnvironment(SchedulerEnvironment):
    """Processes started by OpenMPI's ``mpirun``/``mpiexec`` (or PRRTE's ``prterun``).

    ``OMPI_COMM_WORLD_NODE_RANK`` is deliberately unused: despite its name it is a rank among the processes on
    this node, not a node index. ``PMIX_NAMESPACE`` names the launch (new for every ``mpirun``).
    """

    detect_variables = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")
    rank_variable = "OMPI_COMM_WORLD_RANK"
    world_size_variable = "OMPI_COMM_WORLD_SIZE"
    local_rank_variable = "OMPI_COMM_WORLD_LOCAL_RANK"
    local_size_variable = "OMPI_COMM_WORLD_LOCAL_SIZE"
    identity_variables = (("PMIX_NAMESPACE",), *_ALLOCATION_IDENTITY)


class HydraEnvironment(SchedulerEnvironment):
    """Processes started by the Hydra process manager: MPICH's and Intel MPI's ``mpiexec``/``mpirun``.

    ``MPI_LOCALRANKID`` is required: ``srun --mpi=pmi2`` sets ``PMI_RANK``/``PMI_SIZE`` too, but not it, so a
    process ``srun`` started stays SLURM's. Hydra names no launch, so the identity is the enclosing allocation's.
    """

    detect_variables = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")
    rank_variable = "PMI_RANK"
    world_size_variable = "PMI_SIZE"
    local_rank_variable = "MPI_LOCALRANKID"
    local_size_variable = "MPI_LOCALNRANKS"
    identity_variables = _ALLOCATION_IDENTITY


class MVAPICH2Environment(SchedulerEnvironment):
    """Processes started by MVAPICH2's ``mpirun_rsh`` or ``mpiexec``."""

    detect_variables = ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK")
    rank_variable = "MV2_COMM_WORLD_RANK"
    world_size_variable = "MV2_COMM_WORLD_SIZE"
    local_rank_variable = "MV2_COMM_WORLD_LOCAL_RANK"
    local_size_variable = "MV2_COMM_WORLD_LOCAL_SIZE"
    identity_variables = _ALLOCATION_IDENTITY


class FluxEnvironment(SchedulerEnvironment):
    """Tasks started by ``flux run`` / ``flux submit``; ``FLUX_JOB_ID`` is unique for every job, never reused.

    Flux also sets ``PMI_RANK``/``PMI_SIZE`` (its PMI server), which is why Flux is detected before Hydra.
    """

    detect_variables = ("FLUX_TASK_RANK", "FLUX_TASK_LOCAL_ID", "FLUX_JOB_SIZE", "FLUX_JOB_ID")
    rank_variable = "FLUX_TASK_RANK"
    world_size_variable = "FLUX_JOB_SIZE"
    local_rank_variable = "FLUX_TASK_LOCAL_ID"
    node_count_variable = "FLUX_JOB_NNODES"
    identity_variables = (("FLUX_JOB_ID",),)


class PALSEnvironment(SchedulerEnvironment):
    """Processes started by HPE PALS's ``mpiexec`` inside a PBS Pro job.

    PALS gives the node index (``PALS_NODEID``); the main address is the first host of ``PBS_NODEFILE``, where
    PALS places rank 0. ``PBS_JOBID`` is required for detection, so ``srun --mpi=cray_shasta`` (which sets
    ``PALS_*`` too) stays SLURM's. ``PALS_APID`` names each ``mpiexec`` inside the job.
    """

    detect_variables = ("PALS_RANKID", "PALS_LOCAL_RANKID", "PMI_SIZE", "PBS_JOBID")
    rank_variable = "PALS_RANKID"
    world_size_variable = "PMI_SIZE"
    local_rank_variable = "PALS_LOCAL_RANKID"
    local_size_variable = "PALS_LOCAL_SIZE"
    node_rank_variable = "PALS_NODEID"
    identity_variables = (("PBS_JOBID", "PALS_APID"),)

    def scheduler_main_address(self) -> Optional[str]:
        nodefile = os.environ.get("PBS_NODEFILE")
        if not nodefile or not Path(nodefile).is_file():
            return None
        with open(nodefile) as lines:
            first = lines.readline().strip()
        return first or None


# Detection priority. The innermost launcher wins: the one that started this very process, which sets per-process
# rank variables no outer launcher sets. Lightning's own classes keep their relative order (TorchElastic, SLURM,
# LSF, MPI, Lightning); ours go between LSF's place and SLURM's:
#
# * TorchElastic first, as in Lightning: torchrun is always the innermost launcher when its variables are set.
# * LSF (jsrun) before ours: jsrun's Spectrum MPI also sets OMPI_COMM_WORLD_*, and LSFEnvironment knows the main
#   address. jsrun never runs inside SLURM, so keeping it above SLURM changes nothing Lightning would decide.
# * Flux before Hydra: Flux sets PMI_RANK/PMI_SIZE too. PALS before Hydra: PALS sets PMI_SIZE.
# * ours before SLURM: an mpirun/flux/PALS inside an sbatch allocation inherits SLURM_* from the batch step
#   (or from the srun that started its daemons), where SLURM_PROCID is not this process's rank. Each of ours
#   requires a variable srun never sets (OMPI_COMM_WORLD_*, MPI_LOCALRANKID, MV2_*, FLUX_TASK_RANK, PBS_JOBID),
#   so a process srun started, an OpenMPI program with PMIX_* from srun --mpi=pmix included, stays SLURM's.
# * Lightning's MPIEnvironment last of all: its detect() initialises MPI.
DETECTION_ORDER: tuple[type[ClusterEnvironment], ...] = (
    TorchElasticEnvironment,
    LSFEnvironment,
    FluxEnvironment,
    PALSEnvironment,
    OpenMPIEnvironment,
    MVAPICH2Environment,
    HydraEnvironment,
    SLURMEnvironment,
)

SCHEDULER_ENVIRONMENTS: tuple[type[SchedulerEnvironment], ...] = tuple(
    environment for environment in DETECTION_ORDER if issubclass(environment, SchedulerEnvironment)
)


def detect_cluster_environment() -> Optional[type[ClusterEnvironment]]:
    """The first class of ``DETECTION_ORDER`` that detects this process's launcher, or None.

    Lightning's ``SLURMEnvironment.detect()`` may warn that ``srun`` is available but unused; nothing here
    initialises MPI or talks to another process.
    """
    for environment in DETECTION_ORDER:
        if environment.detect():
            return environment
    return None
