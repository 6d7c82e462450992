"""Lightning ``ClusterEnvironment`` classes for the launchers Lightning does not know: OpenMPI, MPICH/Intel MPI
(Hydra), MVAPICH2, Flux and PBS Pro with HPE PALS.

Each launcher is one table of the environment variables it sets for every process (submitit's idea; the tables are
in :mod:`lightning_dist_hooks.launcher_variables`), and each class here is made from its table
(:func:`register_launcher`): a subclass of :class:`LauncherEnvironment`, which reads the table, with nothing of its
own. None of them initialises MPI to detect itself: they read variables only, unlike Lightning's
``MPIEnvironment.detect()``, which calls ``MPI_Init`` through mpi4py as a side effect.

Use one explicitly with ``Trainer(plugins=[OpenMPIEnvironment()])``, or let ``lightning_dist_hooks.Trainer``
pick it: :func:`detect_cluster_environment` gives the environment in the priority order below, to which
:func:`register_launcher` adds a table of your own (and :func:`register_cluster_environment` a class).

The classes import no Lightning package, so that they serve both: each package's ``ClusterEnvironment`` (an ABC)
registers :class:`LauncherEnvironment` as a virtual subclass (:func:`register_with`) when an environment is made
or this package's Trainer or Fabric of that package is used, so that Lightning's connectors accept them in
``plugins``. Lightning's own environments are named, not imported: each Lightning package has its own copy.
"""

from __future__ import annotations

import logging
import os
import sys
import zlib
from abc import ABC
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeAlias

from lightning_dist_hooks import launcher_variables
from lightning_dist_hooks._lightning_internals import (
    FLAVOURS,
    LIGHTNING_DETECTION_ORDER,
    PYTORCH_LIGHTNING,
    Flavour,
    flavour_of,
)
from lightning_dist_hooks.launcher_variables import LauncherVariables, LaunchSize, SizeMismatch

if TYPE_CHECKING:
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment

log = logging.getLogger(__name__)

# env:// without MASTER_PORT: a port derived from the job identity, so every rank computes the same one without
# talking to the others (Lightning's SLURMEnvironment does the same from the job id). 10000 ports from 20000 up.
_DERIVED_PORT_BASE, _DERIVED_PORT_RANGE = 20000, 10000
# torchrun's default, for a launcher that gives no job identity to derive a port from.
_DEFAULT_PORT = 29500


class LauncherEnvironment(ABC):
    """A launcher described by the environment variables it sets in every process it starts.

    Subclasses give the table (``variables``, a :class:`~lightning_dist_hooks.launcher_variables.LauncherVariables`);
    everything else is shared. :func:`register_launcher` makes the subclass from a table and makes it detectable::

        SiteEnvironment = register_launcher(
            LauncherVariables(detect=("SITE_RANK", "SITE_SIZE", "SITE_LOCAL_RANK"), rank="SITE_RANK",
                              world_size="SITE_SIZE", local_rank="SITE_LOCAL_RANK", identity=(("SITE_JOB_ID",),),
                              name="SiteEnvironment")
        )

    * ``detect()``: every variable in ``variables.detect`` is set;
    * ranks and world size: straight from the variables;
    * node rank: ``variables.node_rank`` when the launcher gives one, otherwise derived as
      ``global_rank // ranks_per_node``, where ranks per node is ``world_size // nodes`` (``variables.node_count``)
      or this node's ``variables.local_size``. That holds for block placement (ranks 0..k-1 on the first node, the
      default of every launcher here) with the same number of ranks on each node; Lightning uses the node rank only
      for its own logging and paths, never to address a peer;
    * main address (read only for ``env://``): ``MASTER_ADDR``, else the scheduler's own
      (:meth:`scheduler_main_address`: the first line of the file ``variables.main_address_file`` names), else
      ``127.0.0.1`` when all ranks are on this node; otherwise a ``RuntimeError`` saying to use ``file://`` or set
      ``MASTER_ADDR``. A ``file://`` rendezvous never reads it;
    * main port (read only for ``env://``): ``MASTER_PORT``, else one derived from the job identity, else 29500.
    """

    variables: ClassVar[LauncherVariables]

    def __init__(self) -> None:
        _register_with_imported_packages()

    @classmethod
    def detect(cls) -> bool:
        return cls.variables.detected(os.environ)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return _int_variable(self.variables.world_size)

    def global_rank(self) -> int:
        return _int_variable(self.variables.rank)

    def local_rank(self) -> int:
        return _int_variable(self.variables.local_rank)

    def set_world_size(self, size: int) -> None:
        log.debug("%s.set_world_size ignored: the launcher decides the world size.", type(self).__name__)

    def set_global_rank(self, rank: int) -> None:
        log.debug("%s.set_global_rank ignored: the launcher decides the rank.", type(self).__name__)

    def node_rank(self) -> int:
        node_rank = self.variables.node_rank
        if node_rank is not None and node_rank in os.environ:
            return _int_variable(node_rank)
        return self.global_rank() // self._ranks_per_node()

    def _ranks_per_node(self) -> int:
        node_count, local_size = self.variables.node_count, self.variables.local_size
        if node_count is not None and node_count in os.environ:
            return max(1, self.world_size() // _int_variable(node_count))
        if local_size is not None and local_size in os.environ:
            return max(1, _int_variable(local_size))
        return self.world_size()  # nothing says otherwise: one node

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check the launcher's sizes and placement against ``Trainer(devices=..., num_nodes=...)`` at start-up.

        Lightning calls this on every rank before the process group exists, as for its own environments. A
        mismatch raises ``ValueError`` naming both numbers: the derived node rank would be silently wrong.
        """
        check_launch_matches_trainer(self, num_devices, num_nodes)

    def _all_ranks_on_this_node(self) -> bool:
        return self._ranks_per_node() >= self.world_size()

    def teardown(self) -> None:  # noqa: B027 - a no-op on purpose, not abstract
        """Nothing to undo: reading variables changes nothing (Lightning's ``ClusterEnvironment`` API)."""

    def scheduler_main_address(self) -> str | None:
        """Rank 0's host as the scheduler tells it, if it does: the first line of the file that the variable
        ``variables.main_address_file`` names (PBS's nodefile, where PALS places rank 0), else None."""
        variable = self.variables.main_address_file
        path = os.environ.get(variable) if variable is not None else None
        if not path or not Path(path).is_file():
            return None
        with open(path) as lines:
            first = lines.readline().strip()
        return first or None

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
    def job_identity(cls) -> str | None:
        """A name for this launch that every rank derives from its own environment, or None."""
        return identity_from(cls.variables.identity)


def check_launch_matches_trainer(environment: LauncherEnvironment, num_devices: int, num_nodes: int) -> None:
    """Raise ``ValueError`` unless the launch has ``num_devices * num_nodes`` ranks, ``num_devices`` on this node,
    placed in blocks (ranks ``n*k .. n*k+k-1`` on node ``n``) where the node rank is derived from the rank.

    The sizes are compared by :meth:`~lightning_dist_hooks.launcher_variables.LaunchSize.mismatches`, as for the MPI
    transport and the doctor. A round-robin placement (``mpirun --map-by node``) shows on a rank whose local rank
    differs from ``global_rank % ranks_per_node``; the launcher then stops the ranks that could not tell.
    """
    name = type(environment).__name__
    world_size = environment.world_size()
    node_rank = environment.variables.node_rank
    names_the_node = node_rank is not None and node_rank in os.environ  # then nothing is derived from the rank
    ranks_per_node = None if names_the_node else environment._ranks_per_node()
    size = LaunchSize(world_size, per_node=() if ranks_per_node is None else (ranks_per_node,))
    mismatches = size.mismatches(num_devices, num_nodes)
    if SizeMismatch.WORLD_SIZE in mismatches:
        raise ValueError(
            f"{name}: the launcher started {world_size} processes ({environment.variables.world_size}={world_size}), "
            f"but the Trainer has devices={num_devices} and num_nodes={num_nodes}, i.e. {num_devices * num_nodes}. "
            f"Start {num_devices} processes on each of {num_nodes} nodes, or set devices and num_nodes to match."
        )
    if SizeMismatch.PER_NODE in mismatches:
        raise ValueError(
            f"{name}: the launcher placed {ranks_per_node} processes on each node, but the Trainer has "
            f"devices={num_devices}. Set devices={ranks_per_node}, or start {num_devices} processes per node "
            f"(e.g. mpirun --map-by ppr:{num_devices}:node)."
        )
    if ranks_per_node is None:
        return
    rank, local_rank = environment.global_rank(), environment.local_rank()
    if local_rank != rank % ranks_per_node:
        raise ValueError(
            f"{name}: rank {rank} has local rank {local_rank}, but with {ranks_per_node} consecutive ranks per node "
            f"it would have local rank {rank % ranks_per_node}: the launcher placed the ranks round-robin "
            f"(e.g. mpirun --map-by node), so the node rank cannot be derived. Place consecutive ranks on each node: "
            f"mpirun --map-by ppr:{num_devices}:node."
        )


def identity_from(alternatives: tuple[tuple[str, ...], ...]) -> str | None:
    """``"NAME=value,NAME=value"`` from the first alternative whose first variable is set, else None."""
    for names in alternatives:
        if names[0] in os.environ:
            return ",".join(f"{name}={os.environ[name]}" for name in names if name in os.environ)
    return None


def _int_variable(name: str) -> int:
    value = os.environ.get(name)
    if value is not None:
        try:
            return int(value)
        except ValueError:
            pass
    raise RuntimeError(f"The launcher should set {name} to an integer, but it is {value!r}.")


def _environment_class(variables: LauncherVariables, module: str) -> type[LauncherEnvironment]:
    """The :class:`LauncherEnvironment` subclass that reads ``variables``, named ``variables.name``, documented by
    ``variables.about``; ``module`` is where it is found by name again (pickle, a spawned process)."""
    if not variables.name.isidentifier():
        raise ValueError(
            f"A launcher's table needs a class name to register, e.g. name='SiteEnvironment'; got {variables.name!r}."
        )
    namespace = {"variables": variables, "__doc__": variables.about or None, "__module__": module}
    return type(variables.name, (LauncherEnvironment,), namespace)


# The built-in launchers' classes: written out as classes (so that readers and type checkers see classes one can
# subclass), each nothing but its table.
class OpenMPIEnvironment(LauncherEnvironment):
    __doc__ = launcher_variables.OPEN_MPI.about
    variables = launcher_variables.OPEN_MPI


class HydraEnvironment(LauncherEnvironment):
    __doc__ = launcher_variables.HYDRA.about
    variables = launcher_variables.HYDRA


class MVAPICH2Environment(LauncherEnvironment):
    __doc__ = launcher_variables.MVAPICH2.about
    variables = launcher_variables.MVAPICH2


class FluxEnvironment(LauncherEnvironment):
    __doc__ = launcher_variables.FLUX.about
    variables = launcher_variables.FLUX


class PALSEnvironment(LauncherEnvironment):
    __doc__ = launcher_variables.PALS.about
    variables = launcher_variables.PALS


# In the launcher registry's order.
_BUILT_IN = {
    environment.variables: environment
    for environment in (OpenMPIEnvironment, HydraEnvironment, MVAPICH2Environment, FluxEnvironment, PALSEnvironment)
}
LAUNCHER_ENVIRONMENTS: tuple[type[LauncherEnvironment], ...] = tuple(
    _BUILT_IN[variables] for variables in launcher_variables.launchers()
)

# The built-in detection priority. The innermost launcher wins: the one that started this very process, which sets
# per-process rank variables no outer launcher sets. Lightning's TorchElastic comes first as in Lightning; ours go
# before SLURM; and LSF moves from after SLURM (Lightning's place) to before ours:
#
# * TorchElastic first, as in Lightning: torchrun is always the innermost launcher when its variables are set.
# * LSF (jsrun) before OpenMPI: jsrun's Spectrum MPI also sets OMPI_COMM_WORLD_*, and LSFEnvironment knows the
#   main address. OpenMPI must in turn come before SLURM (below), so LSF cannot keep Lightning's place after SLURM.
#   The two disagree only for a process that has both LSF's per-process JSM_NAMESPACE_* and SLURM's variables,
#   i.e. a jsrun task that inherited SLURM_* from outside (jsrun exists only inside LSF jobs, and the schedulers do
#   not nest). jsrun's variables are then the innermost, and the Trainer takes LSFEnvironment, where Lightning
#   alone would take SLURMEnvironment. In every other case the choice among Lightning's classes is Lightning's.
# * Flux before Hydra: Flux sets PMI_RANK/PMI_SIZE too. PALS before Hydra: PALS sets PMI_SIZE.
# * ours (in the launcher registry's order, launcher_variables.launchers()) before SLURM: an mpirun/flux/PALS
#   inside an sbatch allocation inherits SLURM_* from the batch step (or from the srun that started its daemons),
#   where SLURM_PROCID is not this process's rank. Each of ours requires a variable srun never sets
#   (OMPI_COMM_WORLD_*, MPI_LOCALRANKID, MV2_*, FLUX_TASK_RANK, PBS_JOBID), so a process srun started, an OpenMPI
#   program with PMIX_* from srun --mpi=pmix included, stays SLURM's.
# * Lightning's MPIEnvironment is left out: its detect() initialises MPI. When nothing here detects, Lightning's
#   own detection runs as usual and may still choose it.
# An environment class: one of ours, or a ClusterEnvironment of either Lightning package (ours are registered as
# virtual subclasses of those, which a type checker does not see).
EnvironmentClass: TypeAlias = "type[LauncherEnvironment] | type[ClusterEnvironment]"
# Lightning's classes by name (a str), ours and registered ones as classes.
DetectionEntry: TypeAlias = "str | EnvironmentClass"
DETECTION_ORDER: tuple[DetectionEntry, ...] = (
    "TorchElasticEnvironment",
    "LSFEnvironment",
    *LAUNCHER_ENVIRONMENTS,
    "SLURMEnvironment",
)

_detection_order: list[DetectionEntry] = list(DETECTION_ORDER)


def _name(entry: DetectionEntry) -> str:
    return entry if isinstance(entry, str) else entry.__name__


def register_cluster_environment(
    environment: EnvironmentClass,
    *,
    before: DetectionEntry = "LSFEnvironment",
    replace: bool = False,
) -> None:
    """Make :func:`detect_cluster_environment`, and so ``lightning_dist_hooks.Trainer``, detect ``environment``.

    It is tried just before ``before``: by default right after TorchElastic (torchrun is the innermost launcher
    whenever its variables are set) and ahead of every scheduler, whose variables an outer allocation can leave in
    the environment. Its ``detect()`` must therefore require a variable that only its own launcher sets in each
    process. Environments registered later with the same ``before`` go after earlier ones.

    An environment whose class name is already in the order (``OpenMPIEnvironment``, or one registered before) is
    refused with ``ValueError``; ``replace=True`` puts the new class in the old one's place instead, keeping its
    priority, e.g. a site-specific subclass of ``SLURMEnvironment``::

        register_cluster_environment(SiteLauncherEnvironment)
        register_cluster_environment(MySLURMEnvironment, replace=True)  # if named "SLURMEnvironment"
    """
    is_environment = isinstance(environment, type) and (
        issubclass(environment, LauncherEnvironment) or flavour_of(environment) is not None
    )
    if not is_environment:
        raise TypeError(f"register_cluster_environment needs a ClusterEnvironment subclass, got {environment!r}.")
    names = [_name(known) for known in _detection_order]
    if environment.__name__ in names:
        if not replace:
            raise ValueError(
                f"{environment.__name__} is already in the detection order (position "
                f"{names.index(environment.__name__)} of {names}). Pass replace=True to put {environment!r} in its "
                "place, or give your class another name."
            )
        _detection_order[names.index(environment.__name__)] = environment
    elif _name(before) not in names:  # by name, like the check above: a replaced class keeps its place
        raise ValueError(f"before={before!r} is not in the detection order {names}.")
    else:
        _detection_order.insert(names.index(_name(before)), environment)
    launcher_variables.arrange_launchers(
        entry.variables
        for entry in _detection_order
        if isinstance(entry, type) and issubclass(entry, LauncherEnvironment)
    )


def register_launcher(
    variables: LauncherVariables,
    *,
    before: DetectionEntry = "LSFEnvironment",
    replace: bool = False,
    module: str | None = None,
) -> type[LauncherEnvironment]:
    """Add a launcher from its table alone: the :class:`LauncherEnvironment` subclass named ``variables.name`` is
    made, detected (:func:`register_cluster_environment`, whose ``before`` and ``replace`` these are), and the
    launcher joins :func:`~lightning_dist_hooks.launcher_variables.launchers`. It then gets what the built-in ones
    get: the Trainer's check of its sizes against ``devices`` and ``num_nodes``, a per-launch ``file://`` and
    ``dir://`` rendezvous from its ``identity``, its variables scrubbed from jobs started inside it, and, with
    ``mpi=True``, the MPI transport's detection of its ranks. Returns the class; bind it to a module-level name of
    the same spelling in ``module`` (by default the caller's), where a spawned process finds it again::

        SiteEnvironment = register_launcher(
            LauncherVariables(detect=("SITE_RANK", "SITE_SIZE", "SITE_LOCAL_RANK"), rank="SITE_RANK",
                              world_size="SITE_SIZE", local_rank="SITE_LOCAL_RANK", local_size="SITE_LOCAL_SIZE",
                              identity=(("SITE_JOB_ID",),), name="SiteEnvironment", mpi=True)
        )
    """
    caller = sys._getframe(1).f_globals.get("__name__", "__main__") if module is None else module
    environment = _environment_class(variables, caller)
    register_cluster_environment(environment, before=before, replace=replace)
    return environment


def detection_order(flavour: Flavour = PYTORCH_LIGHTNING) -> tuple[EnvironmentClass, ...]:
    """The classes :func:`detect_cluster_environment` tries, in order: ``DETECTION_ORDER`` plus registrations.

    Lightning's own classes are ``flavour``'s (``pytorch_lightning``'s unless told).
    """
    return tuple(
        flavour.lightning_environment(entry) if isinstance(entry, str) else entry for entry in _detection_order
    )


def detect_cluster_environment(flavour: Flavour = PYTORCH_LIGHTNING) -> EnvironmentClass | None:
    """The first class of :func:`detection_order` that detects this process's launcher, or None.

    Lightning's ``SLURMEnvironment.detect()`` may warn that ``srun`` is available but unused; nothing here
    initialises MPI or talks to another process.
    """
    return next((environment for environment in detection_order(flavour) if environment.detect()), None)


def lightning_would_choose(environment: EnvironmentClass, flavour: Flavour = PYTORCH_LIGHTNING) -> bool:
    """Whether Lightning's own detection, left alone, would pick ``environment`` too (so nothing need be added)."""
    lightning_order = (flavour.lightning_environment(name) for name in LIGHTNING_DETECTION_ORDER)
    return next((known for known in lightning_order if known.detect()), None) is environment


def register_with(flavour: Flavour) -> None:
    """Make ``flavour``'s Lightning accept these environments as its own ``ClusterEnvironment`` plugins."""
    flavour.ClusterEnvironment.register(LauncherEnvironment)


def _register_with_imported_packages() -> None:
    # A Lightning package that is not imported yet gets registered when this package's Trainer or Fabric of it is
    # made; importing it here would import a package the user may not use.
    for flavour in FLAVOURS:
        if f"{flavour.fabric}.plugins.environments" in sys.modules:
            register_with(flavour)
