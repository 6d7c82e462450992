"""``python -m lightning_dist_hooks doctor``: one real rendezvous under the user's launcher, checked and explained.

Every rank runs the same steps:

1. before the Trainer: the launcher's layout against ``--devices``/``--num-nodes``, what each transport taking part
   checks (``Transport.doctor_checks_before``: the MPI transport's mpi4py), the rendezvous directory (private? file
   locks?);
2. ``Trainer(...)`` exactly as a training job builds it, then ``trainer.validate`` on one sample, whose
   ``setup_distributed_backend`` (the real ``create_process_group`` path, with its progress lines) does the rest:
   facts about this rank, rank 0's port and main address, a token in the rendezvous directory, the rendezvous,
   the listening sockets opened by it, an all-reduce, and a gather of every rank's facts;
3. rank 0 prints one table and the verdicts, once ``trainer.validate`` has returned, so that the report is the last
   thing it prints; the exit code is 1 when any verdict failed, on every rank.

When the rendezvous (or the Trainer) fails, each rank prints what it found on its own and exits 1. The Python
warnings raised meanwhile (Lightning's, torch's) are caught on every rank and listed in its report, before the
verdicts, instead of printed on stderr after them; a rank that prints no report (every rank but 0, when all went
well) drops its own, the same Lightning code having raised them on rank 0 too.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks._lightning_internals import PYTORCH_LIGHTNING
from lightning_dist_hooks._pytorch_lightning import LightningModule, Trainer
from lightning_dist_hooks.doctor import checks, report
from lightning_dist_hooks.doctor.checks import FAIL, Verdict
from lightning_dist_hooks.doctor.deadline import start_deadline
from lightning_dist_hooks.doctor.facts import host_addresses, launcher_layout, rank_facts
from lightning_dist_hooks.doctor.gathered import gathered_verdicts
from lightning_dist_hooks.doctor.measure import measure_allreduce
from lightning_dist_hooks.doctor.sockets import opened_by
from lightning_dist_hooks.doctor.tokens import Token
from lightning_dist_hooks.hooks import default_setup_distributed_backend, setup_arguments, taking_parameters_of
from lightning_dist_hooks.init_methods import (
    LIGHTNING_DEFAULT,
    InitMethod,
    RendezvousDiagnostics,
    diagnostics_of,
    init_method_handler,
)
from lightning_dist_hooks.listening_sockets import attributing_new_sockets, listening_sockets
from lightning_dist_hooks.process_group import progress, rendezvous_deadline
from lightning_dist_hooks.transports import registered_transports, transports_taking_part

# The live line: sooner and more often than a training job's reports, the doctor's timeout being short.
LIVE_LINE_SCHEDULE = progress.ReportSchedule(first=(5.0,), every=5.0)

# The doctor builds pytorch_lightning's Trainer (through the seam, as everything here).
DDPStrategy = PYTORCH_LIGHTNING.pytorch_name(".strategies", "DDPStrategy")


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_dist_hooks doctor",
        description="Start this exactly like your training job (srun, mpirun, torchrun, flux run, or alone with "
        "--devices N for Lightning's own launcher) with the same backend and init method: every rank "
        "meets the others, checks an all-reduce, and rank 0 says what is wrong and how to fix it.",
    )
    parser.add_argument("--backend", help="torch_dist_backend of the job (default: Lightning's choice)")
    parser.add_argument("--init-method", help="torch_dist_init_method of the job (default: env://)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for the rendezvous (default 60)")
    parser.add_argument(
        "--devices", type=int, help="devices per node of the job (default: what the launcher started, else 1)"
    )
    parser.add_argument("--num-nodes", type=int, help="num_nodes of the job (default: what the launcher says, else 1)")
    parser.add_argument("--accelerator", default="cpu", help="accelerator of the job (default cpu)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON (rank 0: one document; a failing rank: one line of its own) instead of the table",
    )
    return parser.parse_args(argv)


class Checkup:
    """What this rank has found so far; filled in by :func:`main` and :class:`DoctorModule`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.layout = launcher_layout()
        self.devices = args.devices or (self.layout.tasks_per_node[0] if self.layout else 1)
        self.num_nodes = args.num_nodes or (self.layout.nodes if self.layout else 1)
        self.verdicts: list[Verdict] = []
        self.facts: dict[str, Any] = {"rank": None}
        self.token: Token | None = None
        self.exit_code: int | None = None
        self.sockets_before: set[str] = set()
        # The warnings caught while the doctor runs (main's catch_warnings), and the gathered report that waits for
        # the Trainer to finish, so that it comes after every warning the Trainer raises.
        self.caught: list[warnings.WarningMessage] = []
        self.gathered: tuple[list[dict[str, Any]], list[Verdict]] | None = None

    @property
    def spans_nodes(self) -> bool:
        return self.num_nodes > 1

    def add(self, verdict: Verdict | None) -> None:
        if verdict is not None:
            verdict.ranks = verdict.ranks or ([self.facts["rank"]] if self.facts["rank"] is not None else [])
            self.verdicts.append(verdict)

    def remove_token(self) -> None:
        """Take this rank's token away, so that the next run in the same directory starts without it."""
        if self.token is not None:
            self.token.remove()

    # 1. Before the Trainer ----------------------------------------------------------------------------------------

    def check_before_trainer(self) -> None:
        if self.layout is not None:
            for verdict in checks.check_launcher_layout(self.layout, self.devices, self.num_nodes):
                self.add(verdict)
            # Go on with what the launcher really started, so that the rendezvous and the other checks still run.
            self.devices, self.num_nodes = self.layout.tasks_per_node[0], self.layout.nodes
        for transport in transports_taking_part(self.args.backend or ""):
            for verdict in transport.doctor_checks_before(self.args.backend):
                self.add(verdict)
        handler = _handler_of(self.args.init_method)
        rendezvous = None if handler is None else diagnostics_of(handler)
        directory = None if rendezvous is None else rendezvous.shared_directory(self.args.init_method)
        if handler is not None and rendezvous is not None and directory is not None and directory.is_dir():
            self.add(checks.check_directory_privacy(directory))
            self.add(checks.check_file_locking(directory, handler.scheme, rendezvous.needs_file_locks))

    # 2. Around the rendezvous -------------------------------------------------------------------------------------

    def check_before_rendezvous(self, trainer: Any, backend: str, init_method: str, rank: int, world_size: int) -> None:
        rendezvous = diagnostics_of(init_method_handler(init_method))
        file = rendezvous.meeting_path(init_method)
        self.facts = rank_facts(
            rank=rank,
            world_size=world_size,
            local_rank=trainer.local_rank,
            node_rank=trainer.node_rank,
            environment=trainer.strategy.cluster_environment,
            backend=backend,
            init_method=init_method,
            rendezvous_file=file,
        )
        for transport in transports_taking_part(backend):
            self.facts.update(transport.doctor_facts())
        # The verdicts before the Trainer were given before this rank knew its rank.
        for verdict in self.verdicts:
            verdict.ranks = verdict.ranks or [rank]
        self.add(checks.check_interfaces(backend, self.facts["interfaces"], self.facts["gloo_socket_ifname"]))
        if file is not None:
            self.add(checks.check_file_privacy(file))
            self.token = Token(file, rank)
        if rank == 0:
            self._check_main_address(rendezvous, init_method)
        self.sockets_before = {each.inode for each in listening_sockets()}

    def _check_main_address(self, rendezvous: RendezvousDiagnostics, init_method: str) -> None:
        """Rank 0's port and address, which every other rank is about to connect to."""
        main = rendezvous.main_address(init_method)
        if main is None:
            return
        address, port = main
        if rendezvous.rank_zero_listens(init_method):
            self.add(checks.check_main_port(port))
        local = set(self.facts["host_addresses"]) | set(self.facts["interfaces"].values())
        self.add(checks.check_main_address(address, host_addresses(address), local, self.spans_nodes))

    def check_after_rendezvous(self, device: torch.device) -> None:
        self.facts["listening"] = self._listening_after_rendezvous()
        self.facts["allreduce"] = measure_allreduce(device)
        if self.token is not None:
            self.facts["tokens_seen"] = self.token.seen(self.facts["world_size"])
        self.facts["verdicts"] = [verdict.as_dict() for verdict in self.verdicts]
        ranks: list[Any] = [None] * self.facts["world_size"]
        dist.all_gather_object(ranks, self.facts)
        verdicts = gathered_verdicts(
            ranks,
            backend=self.facts["backend"],
            devices=self.devices,
            num_nodes=self.num_nodes,
            launcher_layout_checked=self.layout is not None,
            token_directory=None if self.token is None else self.token.path.parent,
            transports=transports_taking_part(self.facts["backend"]),
        )
        self.exit_code = 1 if any(verdict.status == FAIL for verdict in verdicts) else 0
        if self.facts["rank"] == 0:
            self.gathered = (ranks, verdicts)  # printed by print_report, once the Trainer has finished

    def warnings_so_far(self) -> list[str]:
        """The warnings caught on this rank so far, shortened for the report."""
        return [
            report.warning_text(each.category.__name__, each.filename, each.lineno, str(each.message))
            for each in list(self.caught)
        ]

    def print_report(self) -> None:
        """Rank 0's table (or JSON document) of every rank, with the warnings caught until now; once."""
        if self.gathered is None:
            return
        (ranks, verdicts), self.gathered = self.gathered, None
        caught = self.warnings_so_far()
        print(
            report.document(ranks, verdicts, caught) if self.args.json else report.table(ranks, verdicts, caught),
            flush=True,
        )

    def _listening_after_rendezvous(self) -> list[dict[str, str]]:
        """This rank's listening sockets now, each with what opened it."""
        store = diagnostics_of(init_method_handler(self.facts["init_method"])).main_address(self.facts["init_method"])
        store_port = store[1] if store and self.facts["rank"] == 0 else None
        earlier = next(
            filter(None, (transport.opened_before_rendezvous() for transport in registered_transports())), None
        )
        return [
            {
                "socket": str(each),
                "opened_by": opened_by(each, self.sockets_before, store_port, opened_earlier_by=earlier),
            }
            for each in listening_sockets()
        ]

    def report_failure(self, error: BaseException, check: str = "rendezvous") -> None:
        """This rank's own findings, when the Trainer or the rendezvous failed: nothing to gather from the others."""
        fix = (
            "the error names the bad value and the fix"
            if check == "trainer"
            else "see the other verdicts; the error names the missing ranks where the rendezvous can tell"
        )
        self.add(Verdict(check, FAIL, f"{type(error).__name__}: {error}", fix))
        if self.token is not None:
            world_size = self.facts["world_size"]
            self.add(checks.check_tokens(self.token.path.parent, self.token.seen(world_size), world_size))
        verdicts = checks.merge(self.verdicts)
        self.print_report()  # what every rank found, when the failure came after the gather
        caught = self.warnings_so_far()
        print(
            report.document([self.facts], verdicts, caught)
            if self.args.json
            else report.local(self.facts, verdicts, caught),
            flush=True,
        )
        self.exit_code = 1

    def report_stuck(self, message: str) -> None:
        """Report this rank's findings, the reason first, when it is stuck (in the rendezvous inside torch, or in any
        wait past --timeout): the process ends right after this."""
        self.report_failure(TimeoutError(message))
        self.remove_token()


class DoctorModule(LightningModule):
    """Its ``setup_distributed_backend`` is where the doctor examines, meets and measures; nothing is trained."""

    def __init__(self, checkup: Checkup) -> None:
        super().__init__()
        self.checkup = checkup

    @override
    @taking_parameters_of(default_setup_distributed_backend)
    def setup_distributed_backend(self, *args: Any, **kwargs: Any) -> None:
        called = setup_arguments(*args, **kwargs)
        backend = called["backend"]
        self.checkup.check_before_rendezvous(
            self.trainer, backend, called["init_method"], called["rank"], called["world_size"]
        )
        # Said here as well as around the hook: the doctor reads the sockets before the hook returns.
        with attributing_new_sockets(lambda: f"the {backend} backend, for connections between ranks"):
            super().setup_distributed_backend(*args, **kwargs)
        self.checkup.check_after_rendezvous(self.device)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    """Run the doctor on this rank; return its exit code (0: every check passed)."""
    args = parse_arguments(argv)
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # the table, not Lightning's banners
    progress.schedule = LIVE_LINE_SCHEDULE
    # Lightning's and torch's warnings go into the report, before the verdicts, not after them on stderr. From the
    # start: reading the launcher's layout runs Lightning's SLURM detection, which warns when srun is not used.
    with warnings.catch_warnings(record=True) as caught:
        checkup = Checkup(args)
        checkup.caught = caught
        rendezvous_deadline.report_stuck = checkup.report_stuck
        _run(args, checkup)
    return checkup.exit_code if checkup.exit_code is not None else 1


def _run(args: argparse.Namespace, checkup: Checkup) -> None:
    checkup.check_before_trainer()
    deadline = start_deadline(args.timeout, checkup.report_stuck)
    try:
        try:
            trainer = Trainer(
                accelerator=args.accelerator,
                devices=checkup.devices,
                num_nodes=checkup.num_nodes,
                strategy=DDPStrategy(timeout=timedelta(seconds=args.timeout)),
                torch_dist_backend=args.backend,
                torch_dist_init_method=args.init_method,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
            )
        except Exception as error:
            checkup.report_failure(error, check="trainer")
        else:
            # A list is a map-style dataset, which DataLoader's type hint (a Dataset) does not say.
            module = DoctorModule(checkup)
            one_batch: DataLoader[torch.Tensor] = DataLoader([torch.zeros(1)])  # type: ignore[arg-type]  # a list: see above
            trainer.validate(module, dataloaders=one_batch, verbose=False)
            checkup.print_report()
    except Exception as error:
        checkup.report_failure(error)
    finally:
        deadline.cancel()
        checkup.remove_token()


def _handler_of(url: str | None) -> InitMethod | None:
    """The handler of ``url``'s scheme (``env://``'s for none), or None for a scheme nobody registered (the
    Trainer then names the mistake)."""
    try:
        return init_method_handler(url or LIGHTNING_DEFAULT)
    except KeyError:
        return None
