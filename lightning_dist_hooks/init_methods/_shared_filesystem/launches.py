"""The name of one launch, which every rank derives from its own environment without talking to the others.

``file:///DIR/`` puts the rendezvous file for a launch at ``DIR/ldh-rendezvous-<identity>`` (inside this user's
private directory there). The identity comes from the cluster environment that started the process, so every
rank of one launch takes it from the same launcher, even where several are nested (an mpirun inside an sbatch job
sees both). It must also be the same on every node: see :func:`no_identity_shared_by_nodes`.

Which identities agree across the nodes of one launch: SLURM's job, step and restart count (one job-wide value
each); Flux's job id; PBS's job id and PALS application id; LSF's job id and array index; OpenMPI's
``PMIX_NAMESPACE`` (one per ``mpirun``); torchrun's ``TORCHELASTIC_RUN_ID`` (``--rdzv-id``, which the c10d
rendezvous itself needs to be equal; ``"none"`` without it, which is the same for every run of every user: the
per-user directory keeps users apart, and the claim files turn two concurrent runs of one user into an error).
torchrun's restart count is not: each agent counts the restarts of its own workers, and a node whose workers did
not fail restarts without counting; so it is used only on a single node. Lightning's own launcher has none: each
node's launching process makes its own token.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING

from lightning_dist_hooks._lightning_internals import lightning_environment_name
from lightning_dist_hooks.environments import LauncherEnvironment, identity_from
from lightning_dist_hooks.launcher_variables import (
    LAUNCH_TOKEN_VARIABLE,
    LIGHTNING_IDENTITIES,
    TORCHRUN_MULTI_NODE_IDENTITY,
    TORCHRUN_SINGLE_NODE_IDENTITY,
)

# The identities of our launchers are in their tables, those of Lightning's in LIGHTNING_IDENTITIES. Lightning's
# subprocess launcher (``ddp``) copies os.environ, LAUNCH_TOKEN_VARIABLE included, into the children it starts;
# ``ddp_spawn``/``ddp_fork`` need no variable: their children receive the resolved rendezvous path inside the
# pickled strategy.

_token_made_here: str | None = None

if TYPE_CHECKING:
    from lightning_dist_hooks._lightning_internals import ClusterEnvironment


def launch_identity(environment: ClusterEnvironment | LauncherEnvironment) -> str | None:
    """This launch's identity under ``environment``, or None when the launcher gives none.

    For example ``'SLURM_JOB_ID=42,SLURM_STEP_ID=0'`` in the first step of SLURM job 42.
    """
    if isinstance(environment, LauncherEnvironment):
        return environment.job_identity()
    name = lightning_environment_name(environment)
    if name == "LightningEnvironment":
        return _lightning_launch_token(environment)
    if name == "TorchElasticEnvironment":
        one_node = os.environ.get("GROUP_WORLD_SIZE", "1") == "1"
        return identity_from(TORCHRUN_SINGLE_NODE_IDENTITY if one_node else TORCHRUN_MULTI_NODE_IDENTITY)
    return identity_from(LIGHTNING_IDENTITIES[name]) if name in LIGHTNING_IDENTITIES else None


def no_identity_shared_by_nodes(environment: ClusterEnvironment, num_nodes: int) -> str | None:
    """Why the nodes of this launch would derive different identities, or None if they derive the same one."""
    if num_nodes > 1 and lightning_environment_name(environment) == "LightningEnvironment":
        return (
            "Lightning's own launcher is started once per node, and each node's launching process makes its "
            "own launch token: nothing tells the nodes one shared name"
        )
    return None


def _lightning_launch_token(environment: ClusterEnvironment) -> str | None:
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
