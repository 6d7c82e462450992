"""Creating the default process group through ``setup_distributed_backend``, and finishing it at exit."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta
from multiprocessing.util import Finalize
from typing import Any

import torch
import torch.distributed
from torch.distributed.constants import default_pg_timeout

from lightning_dist_hooks import _lightning_internals
from lightning_dist_hooks.bootstrap_plan import BootstrapPlan
from lightning_dist_hooks.hooks import takes_device_id
from lightning_dist_hooks.init_methods import InitMethod, Rendezvous, diagnostics_of, prepare_rendezvous
from lightning_dist_hooks.listening_sockets import attributing_new_sockets
from lightning_dist_hooks.process_group.progress import missing_ranks_query, rendezvous_progress
from lightning_dist_hooks.process_group.rendezvous_deadline import rendezvous_deadline, timed_out
from lightning_dist_hooks.transports import CreatedGroup, transports_taking_part

# Runs before multiprocessing's own exit handlers of lower priority; the value only orders finalizers.
_FINISH_PRIORITY = 100


class DistributedSetupError(RuntimeError):
    """``setup_distributed_backend`` failed, or returned without the process group the Trainer needs."""


def create_process_group(strategy: Any, plan: BootstrapPlan, hook: Callable[..., None]) -> None:
    """Create this rank's default process group as ``plan`` says, through ``hook`` (``setup_distributed_backend``).

    Called on every rank after the strategy knows its ranks and before any collective: the rendezvous is prepared,
    the hook creates the group, the group is checked, and each transport taking part in the job is told it exists
    (:meth:`Transport.after_group_created`). The group and the rendezvous file (if any) are finished when
    the process exits, as Lightning keeps a group for the process's lifetime.
    """
    rank, world_size = strategy.global_rank, strategy.world_size
    device_id = lightning_device_id(strategy)
    backend = plan.process_group_backend
    assert backend is not None, "a plan for a strategy that creates a process group names its backend"
    taking_part = transports_taking_part(backend)
    timeout = _lightning_internals.process_group_timeout(strategy) or default_pg_timeout
    assert strategy.cluster_environment is not None
    handler = plan.init_method.handler
    # Where the ranks really meet (file:// and dir:// move the file into this user's private directory): what every
    # line below names, so that a user checking the shared directory looks where the files are.
    location = plan.init_method.location
    rendezvous = prepare_rendezvous(handler, plan.init_method.resolved, strategy.cluster_environment)
    # Registered before the hook runs, so that a failing hook still leaves no rendezvous file behind.
    Finalize(None, _finish_process_group, args=(handler, rendezvous), exitpriority=_FINISH_PRIORITY)

    flavour = _lightning_internals.flavour_of(strategy)
    assert flavour is not None
    # Lightning's own words, through Lightning's own logger: what a user sees does not change with the flags.
    flavour.distributed_log.info(f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/{world_size}")
    started = time.monotonic()
    missing = missing_ranks_query(handler, rendezvous, world_size)
    try:
        with (
            rendezvous_progress(rank, world_size, location, timeout, missing),
            rendezvous_deadline(rank, world_size, location, timeout, missing),
            # What listens from now on and is not named inside (a transport's library) nor the TCP store's (known by
            # its port); /proc is read only where a transport taking part reads who listens.
            attributing_new_sockets(lambda: f"the {backend} backend, for connections between ranks")
            if any(transport.reads_listeners for transport in taking_part)
            else nullcontext(),
        ):
            hook(
                backend,
                rendezvous.init_method,
                rank,
                world_size,
                timeout,
                **({"device_id": device_id} if takes_device_id(hook) else {}),
            )
    except Exception as error:
        if _is_rendezvous_timeout(error, time.monotonic() - started, timeout):
            who = handler.missing_ranks(rendezvous, world_size, error)
            raise DistributedSetupError(
                f"{timed_out(rank, world_size, location, timeout, who)}. Check that every rank was started and "
                "reaches the same init_method (torch says: "
                f"{type(error).__name__}: {error})"
            ) from error
        raise DistributedSetupError(
            f"setup_distributed_backend raised {type(error).__name__} on rank {rank} of {world_size} "
            f"(backend={backend!r}, init_method={rendezvous.init_method!r}): {error}"
        ) from error
    check_default_group(rank, world_size)
    main_address = diagnostics_of(handler).main_address(rendezvous.init_method)
    tcp_store_port = main_address[1] if main_address is not None and rank == 0 else None
    for transport in taking_part:
        transport.after_group_created(CreatedGroup(backend, tcp_store_port, flavour.rank_zero_warn))
    flavour.rank_zero_info(
        f"{'-' * 100}\ndistributed_backend={backend}, init_method={rendezvous.init_method}\n"
        f"All distributed processes registered. Starting with {world_size} processes\n{'-' * 100}\n"
    )


def lightning_device_id(strategy: Any) -> torch.device | None:
    """The ``device_id`` Lightning's strategies pass to ``init_process_group``: the rank's device unless it is the
    CPU, or None where the installed Lightning binds no group to a device (before 2.5.5). A CUDA device is made the
    current one first either way: Lightning's ``setup_environment`` does that (the accelerator's ``setup_device``)
    before it creates the group, and ours runs before it."""
    device = strategy.root_device
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device if _lightning_internals.binds_groups_to_devices(strategy) else None


def check_default_group(rank: int, world_size: int) -> None:
    """Raise ``DistributedSetupError`` unless the default group exists with this rank and world size."""
    if not torch.distributed.is_initialized():
        raise DistributedSetupError(
            f"setup_distributed_backend returned on rank {rank} without creating the default process group. "
            "Call torch.distributed.init_process_group(...) in it (or super().setup_distributed_backend(...))."
        )
    actual = (torch.distributed.get_rank(), torch.distributed.get_world_size())
    if actual != (rank, world_size):
        raise DistributedSetupError(
            f"setup_distributed_backend created a process group with rank {actual[0]} and world size {actual[1]}, "
            f"but this Trainer expects rank {rank} and world size {world_size}. Pass the rank and world_size the "
            "hook receives to init_process_group."
        )


def _is_rendezvous_timeout(error: Exception, elapsed_s: float, timeout: timedelta) -> bool:
    # torch words it "Wait timeout" (FileStore, gloo) or "Timed out after N seconds waiting for clients" (TCPStore);
    # the elapsed time keeps an unrelated early "timeout" in a user's own hook from being called a rendezvous one.
    says_timeout = re.search(r"time(d)? ?out", str(error), re.IGNORECASE) is not None
    return says_timeout and elapsed_s >= 0.9 * timeout.total_seconds()


def _finish_process_group(handler: InitMethod, rendezvous: Rendezvous) -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    handler.finish(rendezvous)
