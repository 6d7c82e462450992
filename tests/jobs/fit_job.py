"""One small training job, launched as real processes by the tests; each rank writes what it saw to --out.

Every choice the tests vary is a flag, so one script serves the Lightning launcher, ddp_spawn, torchrun,
mpirun and srun alike. Records are written from ``teardown``, which runs on every rank, spawned ones too.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from lightning_dist_hooks.environments import LAUNCHER_ENVIRONMENTS
from lightning_dist_hooks.process_group import exit_grace

if TYPE_CHECKING:
    # mypy checks tests/ as one tree, where this file is ``jobs.sockets`` (as helpers.py imports it); the job runs
    # with tests/jobs on sys.path, where it is ``sockets``.
    from jobs.sockets import connected_ipv4_sockets, listening_tcp_ports
else:
    from sockets import connected_ipv4_sockets, listening_tcp_ports

# --package picks the Lightning package the whole job uses (read before main(): the classes below subclass it).
PACKAGES = {
    "pytorch_lightning": ("pytorch_lightning", "lightning_dist_hooks"),
    "lightning": ("lightning.pytorch", "lightning_dist_hooks.lightning"),
}
_preparser = argparse.ArgumentParser(add_help=False)
_preparser.add_argument("--package", choices=sorted(PACKAGES), default="pytorch_lightning")
PACKAGE = _preparser.parse_known_args()[0].package
if TYPE_CHECKING:  # either package, typed as pytorch_lightning's (lightning.pytorch's classes are the same)
    import pytorch_lightning as pl

    import lightning_dist_hooks
else:
    pl = importlib.import_module(PACKAGES[PACKAGE][0])
    lightning_dist_hooks = importlib.import_module(PACKAGES[PACKAGE][1])
DDPStrategy, ModelParallelStrategy = pl.strategies.DDPStrategy, pl.strategies.ModelParallelStrategy

DATASET_SIZE = 24


def announce_failure() -> None:
    """Print when an injected failure happens, so that a test can time how long the job takes to end after it."""
    print(f"injecting a failure at {time.time()}", flush=True)


def _bound_device() -> str | None:
    """The device the default process group was bound to at creation (``init_process_group(device_id=...)``)."""
    if not dist.is_initialized():
        return None
    bound = dist.distributed_c10d._get_default_group().bound_device_id
    return None if bound is None else str(bound)


class IndexedDataset(Dataset):
    """Sample i is (i, x_i, y_i), so every rank can report exactly which samples it trained on."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(DATASET_SIZE, 4, generator=generator)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

    def __len__(self) -> int:
        return DATASET_SIZE

    def __getitem__(self, index: int):
        return index, self.x[index], self.y[index]


class EveryThirdSampler(Sampler):
    """A custom distributed split: rank r takes indices r, r + 3, r + 6, ... (a pattern no default produces)."""

    def __init__(self, rank: int) -> None:
        self.indices = list(range(rank, DATASET_SIZE, 3))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class JobModule(pl.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(4, 1)
        self.seen: dict[str, list[int]] = {}
        self.sampler_calls: list[str] = []
        self.setup_calls: list[dict] = []
        self.connections_while_training: list[tuple[str, str]] | None = None

    def _record_batch(self, stage: str, batch) -> torch.Tensor:
        indices, x, y = batch
        self.seen.setdefault(stage, []).extend(indices.tolist())
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def training_step(self, batch, batch_idx):
        if self.global_step == self.args.raise_at_step and self.global_rank == self.args.die_rank:
            announce_failure()
            raise ZeroDivisionError(f"injected failure in training_step on rank {self.global_rank}")
        return self._record_batch("train", batch)

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if self.global_step == self.args.die_at_step and self.global_rank == self.args.die_rank:
            os._exit(1)  # an abrupt death: no exception, no finalizers, no teardown (as a crash or the OOM killer)
        if self.args.training_marker and self.global_step == 0:
            Path(f"{self.args.training_marker}.rank{self.global_rank}").touch()
        # What this rank is connected to, taken once, while every peer is sure to be alive (each must join this
        # step's all-reduce) and after step 0's all-reduce connected every pair gloo connects. At teardown a peer
        # that finished first may be gone, and gloo closes its own end of a socket once the peer's end closes.
        if self.global_step == 1 and self.connections_while_training is None:
            self.connections_while_training = connected_ipv4_sockets(os.getpid())
        time.sleep(self.args.step_seconds)

    def validation_step(self, batch, batch_idx):
        loss = self._record_batch("validate", batch)
        self.log("val_loss", loss, sync_dist=True)

    def test_step(self, batch, batch_idx):
        self._record_batch("test", batch)

    def predict_step(self, batch, batch_idx):
        self._record_batch("predict", batch)
        return batch[0]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def _loader(self, shuffle: bool = False) -> DataLoader:
        return DataLoader(IndexedDataset(), batch_size=4, shuffle=shuffle)

    def train_dataloader(self):
        return self._loader(shuffle=True)

    def val_dataloader(self):
        return self._loader()

    def test_dataloader(self):
        return self._loader()

    def predict_dataloader(self):
        return self._loader()

    def teardown(self, stage: str) -> None:
        record: dict[str, Any] = {
            "rank": self.global_rank,
            "world_size": self.trainer.world_size,
            "seen": self.seen,
            "sampler_calls": self.sampler_calls,
            "setup_calls": self.setup_calls,
            "weights": [p.detach().flatten().tolist() for p in self.parameters()],
            "weights_sha256": hashlib.sha256(
                b"".join(p.detach().cpu().numpy().tobytes() for p in self.parameters())
            ).hexdigest(),
            "strategy": type(self.trainer.strategy).__name__,
            "trainer_mro": [f"{cls.__module__}.{cls.__qualname__}" for cls in type(self.trainer).__mro__],
            "strategy_kwargs": getattr(self.trainer.strategy, "_ddp_kwargs", {}),
            "process_group_backend": dist.get_backend() if dist.is_initialized() else None,
            "bound_device": _bound_device(),
            "store": _default_store_chain(),
            "environment": type(getattr(self.trainer.strategy, "cluster_environment", None)).__name__,
            "local_rank": self.local_rank,
            "node_rank": self.trainer.node_rank,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "master_addr": os.environ.get("MASTER_ADDR"),
            "tcp_connections": self.connections_while_training
            if self.connections_while_training is not None
            else connected_ipv4_sockets(os.getpid()),
            "listening_tcp_ports": sorted(listening_tcp_ports(os.getpid())),
            "exit_grace": exit_grace.registered_in_this_process(),
        }
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"rank{self.global_rank}.json"
        if path.exists():
            earlier = json.loads(path.read_text())
            if earlier["pid"] != record["pid"]:  # ddp_spawn starts fresh processes per stage: keep the earlier ones
                record["seen"] = {**earlier["seen"], **record["seen"]}
                record["sampler_calls"] = earlier["sampler_calls"] + record["sampler_calls"]
                record["setup_calls"] = earlier["setup_calls"] + record["setup_calls"]
        path.write_text(json.dumps(record))


def _default_store_chain() -> list[str]:
    """Type names from the default group's store down to the store that really holds the keys."""
    if not dist.is_initialized():
        return []
    store = dist.distributed_c10d._get_default_store()
    chain = [type(store).__name__]
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
        chain.append(type(store).__name__)
    return chain


# The hooks below are mixed into JobModule (_module_class); each declares what it uses of it.
class RecordingSetupHook:
    setup_calls: list[dict]

    def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout, device_id=None):
        self.setup_calls.append(
            {
                "backend": backend,
                "init_method": init_method,
                "rank": rank,
                "world_size": world_size,
                "timeout_s": timeout.total_seconds(),
                "initialized_before": dist.is_initialized(),
                "device_id": None if device_id is None else str(device_id),
            }
        )
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device_id,
        )
        if init_method.startswith("file://"):
            self.setup_calls[-1]["rendezvous_file_mode"] = oct(os.stat(init_method[len("file://") :]).st_mode & 0o777)


class HandBuiltStoreSetupHook(RecordingSetupHook):
    """Ignores the init method: builds a FileStore by hand, as a site with its own bootstrap would."""

    args: argparse.Namespace

    # Without device_id on purpose: the signature's older form, which the hook's check accepts.
    def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout):  # type: ignore[override]
        self.setup_calls.append(
            {
                "backend": backend,
                "init_method": init_method,
                "rank": rank,
                "world_size": world_size,
                "timeout_s": timeout.total_seconds(),
                "initialized_before": dist.is_initialized(),
            }
        )
        store = dist.FileStore(self.args.hand_store, world_size)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


class NoGroupSetupHook:
    def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout):
        pass


class WrongWorldSetupHook:
    def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout):
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)


class RaisingSetupHook:
    def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout):
        if rank == world_size - 1:
            announce_failure()
            raise OSError("site bootstrap service unreachable")
        dist.init_process_group(
            backend=backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
        )


class RaisingSamplerHook:
    global_rank: int

    def configure_sampler(self, dataloader, stage):
        if self.global_rank == 1:
            announce_failure()
            raise KeyError("no weights for this dataset")
        return None


class CustomSamplerHook:
    sampler_calls: list[str]
    global_rank: int

    def configure_sampler(self, dataloader, stage):
        self.sampler_calls.append(str(stage.value))
        return EveryThirdSampler(self.global_rank)


class KeepLoaderSamplerHook:
    sampler_calls: list[str]

    def configure_sampler(self, dataloader, stage):
        self.sampler_calls.append(str(stage.value))
        return None


class SuperSamplerHook:
    sampler_calls: list[str]

    def configure_sampler(self, dataloader, stage):
        self.sampler_calls.append(str(stage.value))
        # Mixed in before DistributedHooksMixin (_module_class): its default is what super() reaches.
        return super().configure_sampler(dataloader, stage)  # type: ignore[misc]


ENVIRONMENTS = {environment.__name__: environment for environment in LAUNCHER_ENVIRONMENTS}
SETUP_HOOKS = {
    "none": None,
    "record": RecordingSetupHook,
    "hand-store": HandBuiltStoreSetupHook,
    "no-group": NoGroupSetupHook,
    "wrong-world": WrongWorldSetupHook,
    "raise": RaisingSetupHook,
}
SAMPLER_HOOKS = {
    "none": None,
    "custom": CustomSamplerHook,
    "keep": KeepLoaderSamplerHook,
    "super": SuperSamplerHook,
    "raise": RaisingSamplerHook,
}


class JobDataModule(pl.LightningDataModule):
    """Defines ``configure_sampler`` (returning None) to show that a datamodule's hook wins over the module's."""

    def __init__(self) -> None:
        super().__init__()
        self.sampler_calls: list[str] = []

    def train_dataloader(self):
        return DataLoader(IndexedDataset(), batch_size=4)

    def configure_sampler(self, dataloader, stage):
        self.sampler_calls.append(str(stage.value))
        return None


def _module_class(setup_hook: str, sampler_hook: str, model_parallel: bool) -> type:
    bases: list[type] = [hook for hook in (SETUP_HOOKS[setup_hook], SAMPLER_HOOKS[sampler_hook]) if hook]
    if sampler_hook == "super":
        bases.append(lightning_dist_hooks.DistributedHooksMixin)
    if model_parallel:
        bases.append(ConfigureModelHook)
    name = f"JobModule_{setup_hook}_{sampler_hook}_{'mp' if model_parallel else 'dp'}".replace("-", "_")
    return type(name, (*bases, JobModule), {"__module__": __name__})


class ConfigureModelHook:
    """ModelParallelStrategy insists on a ``configure_model``; plain data parallelism needs nothing in it."""

    def configure_model(self):
        pass


# Every combination exists at import time under its own name, so ddp_spawn can pickle the module by reference.
for _setup in SETUP_HOOKS:
    for _sampler in SAMPLER_HOOKS:
        for _model_parallel in (False, True):
            _class = _module_class(_setup, _sampler, _model_parallel)
            globals()[_class.__name__] = _class


def build_module(args: argparse.Namespace) -> JobModule:
    name = f"JobModule_{args.setup_hook}_{args.sampler_hook}_{'mp' if args.strategy == 'model_parallel' else 'dp'}"
    return globals()[name.replace("-", "_")](args)


def build_strategy(args: argparse.Namespace):
    if args.strategy == "ddp-instance":
        return DDPStrategy(find_unused_parameters=True, timeout=timedelta(seconds=args.timeout))
    if args.strategy == "model_parallel":
        return ModelParallelStrategy()
    return args.strategy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", choices=sorted(PACKAGES), default="pytorch_lightning")
    parser.add_argument("--trainer", choices=["pl", "ldh"], default="ldh")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--backend")
    parser.add_argument("--init-method")
    parser.add_argument("--setup-hook", choices=sorted(SETUP_HOOKS), default="none")
    parser.add_argument("--sampler-hook", choices=sorted(SAMPLER_HOOKS), default="none")
    parser.add_argument("--datamodule", action="store_true")
    parser.add_argument("--stages", default="fit")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--hand-store")
    parser.add_argument("--die-at-step", type=int, help="--die-rank exits abruptly when this training step starts")
    parser.add_argument("--raise-at-step", type=int, help="--die-rank raises in training_step at this step")
    parser.add_argument("--die-rank", type=int, default=1)
    parser.add_argument(
        "--swallow-errors",
        action="store_true",
        help="catch an exception from the trainer and exit normally, as a script that logs it might",
    )
    parser.add_argument(
        "--training-marker", help="each rank touches MARKER.rank<R> when its first training step starts"
    )
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long in every training step")
    parser.add_argument(
        "--cluster-environment",
        choices=sorted(ENVIRONMENTS),
        help="pass this environment in plugins=[...] instead of letting the Trainer detect one",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    pl.seed_everything(7)
    plugins = [ENVIRONMENTS[args.cluster_environment]()] if args.cluster_environment else None
    common = {
        "plugins": plugins,
        "accelerator": args.accelerator,
        "devices": args.devices,
        "num_nodes": args.num_nodes,
        "strategy": build_strategy(args),
        "max_epochs": args.epochs,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 1,
    }
    if args.trainer == "pl":
        trainer = pl.Trainer(**common)
    else:
        trainer = lightning_dist_hooks.Trainer(
            torch_dist_backend=args.backend, torch_dist_init_method=args.init_method, **common
        )
    module = build_module(args)
    datamodule = JobDataModule() if args.datamodule else None
    try:
        for stage in args.stages.split(","):
            if stage == "fit":
                trainer.fit(module, datamodule=datamodule)
            else:
                getattr(trainer, stage)(module)
    except Exception as error:
        if not args.swallow_errors:
            raise
        print(f"rank {trainer.global_rank} swallowed {error!r} and exits normally", flush=True)
        return
    if datamodule is not None:
        Path(args.out, f"datamodule-rank{trainer.global_rank}.json").write_text(json.dumps(datamodule.sampler_calls))


if __name__ == "__main__":
    main()
