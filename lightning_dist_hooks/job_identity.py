"""The name of one launch, which every rank derives from its own environment without talking to the others.

``file:///DIR/`` puts the rendezvous file for a launch at ``DIR/ldh-rendezvous-<identity>``. The identity comes
from the cluster environment that started the process, so every rank of one launch takes it from the same
launcher, even where several are nested (an mpirun inside an sbatch job sees both).
"""

from __future__ import annotations

import os
import uuid
from typing import Optional
from urllib.parse import urlsplit

from lightning_fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

from lightning_dist_hooks.environments import LauncherEnvironment, identity_from
from lightning_dist_hooks.init_methods import rendezvous_file_for_job

# Set by the process that runs Lightning's own launcher (``ddp``), inherited by the children it starts
# (Lightning's subprocess launcher copies os.environ into them). ``ddp_spawn``/``ddp_fork`` need no variable:
# their children receive the resolved rendezvous path inside the pickled strategy.
LAUNCH_TOKEN_VARIABLE = "LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN"

# Lightning's environments: which variables name one launch. SLURM: the job id survives a requeue, so the step id
# (a new one for every srun) and the restart count (absent at first, 1, 2, ... after each requeue) go with it.
# torchrun: the run id ("none" unless --rdzv-id or --standalone gives a fresh uuid) and the restart count, which
# changes every time the agent restarts its workers. LSF: LSB_JOBINDEX tells the elements of a job array apart.
_LIGHTNING_IDENTITIES: dict[type, tuple[tuple[str, ...], ...]] = {
    SLURMEnvironment: (("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"),),
    TorchElasticEnvironment: (("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"),),
    LSFEnvironment: (("LSB_JOBID", "LSB_JOBINDEX", "PMIX_NAMESPACE"),),
}

_token_made_here: Optional[str] = None


def job_identity(environment: ClusterEnvironment) -> Optional[str]:
    """This launch's identity under ``environment``, or None when the launcher gives none.

    For example ``'SLURM_JOB_ID=42,SLURM_STEP_ID=0'`` in the first step of SLURM job 42.
    """
    if isinstance(environment, LauncherEnvironment):
        return environment.job_identity()
    if isinstance(environment, LightningEnvironment):
        return _lightning_launch_token(environment)
    for environment_class, alternatives in _LIGHTNING_IDENTITIES.items():
        if isinstance(environment, environment_class):
            return identity_from(alternatives)
    return None


def _lightning_launch_token(environment: LightningEnvironment) -> Optional[str]:
    """A fresh token in the process that launches the others; the inherited one in the processes it launched.

    Lightning marks processes started by its launcher (or by a user's script that sets LOCAL_RANK) as created
    externally. Such a process must use the token its launcher set; without one no identity exists. The
    launching process makes one token for its lifetime, replacing any it inherited from an unrelated ancestor.
    """
    global _token_made_here
    if environment.creates_processes_externally:
        token = os.environ.get(LAUNCH_TOKEN_VARIABLE)
        return None if token is None else f"{LAUNCH_TOKEN_VARIABLE}={token}"
    if _token_made_here is None:
        _token_made_here = uuid.uuid4().hex
        os.environ[LAUNCH_TOKEN_VARIABLE] = _token_made_here
    return f"{LAUNCH_TOKEN_VARIABLE}={_token_made_here}"


def resolve_rendezvous_directory(url: str, environment: ClusterEnvironment) -> str:
    """Turn ``file:///DIR/`` into this launch's rendezvous file in DIR; raise ``ValueError`` without an identity."""
    identity = job_identity(environment)
    if identity is None:
        raise ValueError(
            f"torch_dist_init_method={url!r}: {type(environment).__name__} names no job to call the rendezvous file "
            "after, so the ranks could not agree on one without talking to each other. Name a file unique to this "
            f"run instead, e.g. 'file://{urlsplit(url).path}run42' (a per-job file needs SLURM, Flux, LSF, PBS, "
            "torchrun, OpenMPI's mpirun, or Lightning's own launcher)."
        )
    return rendezvous_file_for_job(url, identity)
