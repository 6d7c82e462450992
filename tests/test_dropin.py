"""With no flag and no hook, our Trainer is Lightning's Trainer, bit for bit, in both Lightning packages."""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
from typing import Any

import pytest
from helpers import both_packages

from lightning_dist_hooks import DistributedHooksTrainerMixin, _lightning_internals
from lightning_dist_hooks.bootstrap_plan import BootstrapPlan, Flags
from lightning_dist_hooks.strategy import hook_strategy

# Part of the fast subset .ci/compat runs at the ends of the supported version ranges.
pytestmark = pytest.mark.compat


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "devices", "stages", "package"),
    # ddp_spawn starts new processes for every stage, so it runs fewer of them to keep the suite fast; the
    # lightning package runs the ddp case, which has every stage. One device creates no process group (nothing of
    # torch's differs between the Trainers), and the lightning package's ddp differs from pytorch_lightning's only on
    # Lightning's side: both are lightning_only.
    [
        pytest.param("auto", 1, "fit,validate,test,predict", "pytorch_lightning", marks=pytest.mark.lightning_only),
        ("ddp", 2, "fit,validate,test,predict", "pytorch_lightning"),
        ("ddp_spawn", 2, "fit,test", "pytorch_lightning"),
        pytest.param("ddp", 2, "fit,validate,test,predict", "lightning", marks=pytest.mark.lightning_only),
    ],
    ids=["1-device", "ddp", "ddp_spawn", "ddp-lightning"],
)
def test_defaults_give_bitwise_equal_weights_and_identical_sample_order(run_job, strategy, devices, stages, package):
    flags = ("--package", package, "--strategy", strategy, "--devices", str(devices), "--stages", stages)
    theirs = run_job("--trainer", "pl", *flags).assert_ok()
    ours = run_job("--trainer", "ldh", *flags).assert_ok()
    assert sorted(ours.ranks) == sorted(theirs.ranks) == list(range(devices))
    for rank in range(devices):
        assert ours.ranks[rank]["weights_sha256"] == theirs.ranks[rank]["weights_sha256"]
        assert ours.ranks[rank]["seen"] == theirs.ranks[rank]["seen"]
        assert ours.ranks[rank]["store"] == theirs.ranks[rank]["store"]
    assert ours.same_on_all_ranks("weights_sha256")
    # Lightning's Trainer leaves a rank that ends on a collective exposed to torch's abort at exit; ours does not.
    assert [ours.ranks[rank]["exit_grace"] for rank in range(devices)] == [devices > 1] * devices
    assert not any(theirs.ranks[rank]["exit_grace"] for rank in range(devices))
    if devices == 2:  # Lightning's distributed sampler really split the data
        assert set(ours.ranks[0]["seen"]["test"]).isdisjoint(ours.ranks[1]["seen"]["test"])


@pytest.mark.slow
def test_explicit_backend_and_file_rendezvous_train_the_same_weights(run_job, tmp_path):
    theirs = run_job("--trainer", "pl").assert_ok()
    ours = run_job("--backend", "gloo", "--init-method", f"file://{tmp_path}/rendezvous").assert_ok()
    assert ours.same_on_all_ranks("weights_sha256") == theirs.same_on_all_ranks("weights_sha256")
    # What the user sees stays Lightning's: its bootstrap lines, through its own logger, on both ranks.
    for line in (
        "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2",
        "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2",
        "All distributed processes registered. Starting with 2 processes",
    ):
        assert line in theirs.output and line in ours.output


@pytest.mark.unit
@both_packages
def test_trainer_is_a_lightning_trainer_built_from_a_public_mixin(package):
    pl: Any = package.pl  # Any: mypy takes a base class chosen at run time only from a name typed Any
    Trainer = package.ours.Trainer
    assert issubclass(Trainer, pl.Trainer) and issubclass(Trainer, DistributedHooksTrainerMixin)

    class ExistingTrainer(pl.Trainer):
        def greeting(self):
            return "kept"

    class UpgradedTrainer(DistributedHooksTrainerMixin, ExistingTrainer):
        pass

    trainer = UpgradedTrainer(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="gloo", logger=False)
    assert trainer.greeting() == "kept" and trainer.torch_dist_backend == "gloo"


@pytest.mark.unit
@both_packages
def test_signature_is_lightnings_plus_ours_and_env_defaults_reach_both(package, monkeypatch):
    lightning_parameters = inspect.signature(package.pl.Trainer).parameters
    ours = inspect.signature(package.ours.Trainer).parameters
    assert list(ours) == [*lightning_parameters, "torch_dist_backend", "torch_dist_init_method"]
    assert all(ours[name] == parameter for name, parameter in lightning_parameters.items())
    monkeypatch.setenv("PL_TRAINER_MAX_EPOCHS", "7")
    monkeypatch.setenv("PL_TRAINER_TORCH_DIST_BACKEND", "GLOO")
    trainer = package.ours.Trainer(accelerator="cpu", logger=False)
    assert (trainer.max_epochs, trainer.torch_dist_backend) == (7, "gloo")
    assert package.ours.Trainer(accelerator="cpu", logger=False, max_epochs=3).max_epochs == 3  # an argument wins


# Slow: Lightning's own Trainer initialises MPI where mpi4py is installed (Open MPI's singleton starts an orted).
@pytest.mark.slow
@both_packages
def test_fit_validate_test_and_predict_show_lightnings_signatures_and_docstrings(package):
    trainer = package.ours.Trainer(accelerator="cpu", logger=False)
    lightnings = package.pl.Trainer(accelerator="cpu", logger=False)
    for name in ("fit", "validate", "test", "predict"):
        assert inspect.signature(getattr(trainer, name)) == inspect.signature(getattr(lightnings, name))
        assert getattr(type(trainer), name).__doc__ == getattr(package.pl.Trainer, name).__doc__
        assert getattr(type(trainer), name).__qualname__ == f"Trainer.{name}"
    # Lightning's own tests_pytorch/test_cli.py::test_lightning_cli_subcommands: what LightningCLI exposes per
    # subcommand must be parameters of that Trainer method.
    cli = importlib.import_module(f"{package.pytorch_module}.cli")
    for subcommand, parameters in cli.LightningCLI.subcommands().items():
        assert set(parameters) <= set(inspect.signature(getattr(trainer, subcommand)).parameters), subcommand


@pytest.mark.unit
@both_packages
def test_fabric_signature_and_docstring_are_lightnings_plus_ours(package):
    lightnings = inspect.signature(package.fabric.Fabric).parameters
    ours = inspect.signature(package.ours.Fabric).parameters
    assert list(ours) == [*lightnings, "torch_dist_backend", "torch_dist_init_method", "setup_distributed_backend"]
    assert all(ours[name] == parameter for name, parameter in lightnings.items())
    documentation = package.ours.Fabric.__init__.__doc__  # Lightning documents Fabric's arguments on the class
    assert documentation.startswith(inspect.cleandoc(package.fabric.Fabric.__doc__).splitlines()[0])
    assert "    precision: " in documentation
    assert "    setup_distributed_backend: called on every rank" in documentation


@pytest.mark.unit
@both_packages
@pytest.mark.parametrize(
    "strategy", ["ddp_spawn", "ddp", "ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_true"]
)
def test_trainer_and_strategy_stay_picklable(package, strategy, tmp_path):
    DDPStrategy = package.pl.strategies.DDPStrategy
    trainer = package.ours.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        logger=False,
        torch_dist_backend="gloo",
        torch_dist_init_method=f"file://{tmp_path}/rendezvous",
    )
    copy = pickle.loads(pickle.dumps(trainer))
    assert type(copy.strategy).__name__ == type(trainer.strategy).__name__
    assert isinstance(copy.strategy, DDPStrategy)
    assert _lightning_internals.ours(copy.strategy) == _lightning_internals.ours(trainer.strategy)
    assert copy.strategy._ddp_kwargs == trainer.strategy._ddp_kwargs
    assert (copy.torch_dist_backend, copy.torch_dist_init_method) == (
        "gloo",
        f"file://{tmp_path}/ldh-uid-{os.geteuid()}/rendezvous",
    )


@pytest.mark.unit
@both_packages
def test_module_with_the_hooks_mixin_is_picklable(package):
    module = pickle.loads(pickle.dumps(package.ours.LightningModule()))
    assert isinstance(module, package.pl.LightningModule)
    assert callable(module.setup_distributed_backend) and callable(module.configure_sampler)


@pytest.mark.unit
@both_packages
def test_a_user_strategy_instance_keeps_its_identity_and_settings(package):
    from datetime import timedelta

    strategy = package.pl.strategies.DDPStrategy(find_unused_parameters=True, timeout=timedelta(seconds=42))
    trainer = package.ours.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, torch_dist_backend="gloo", logger=False
    )
    assert trainer.strategy is strategy
    assert strategy._ddp_kwargs == {"find_unused_parameters": True}
    assert strategy._timeout == timedelta(seconds=42)
    assert strategy.process_group_backend == "gloo"


@pytest.mark.unit
@both_packages
def test_fsdp_strategy_takes_the_hooks(package):
    # Lightning 2.6 runs FSDP on CUDA only; the hooks attach to the instance the same way as for DDP.
    FSDPStrategy = package.pl.strategies.FSDPStrategy
    strategy = FSDPStrategy()
    hook_strategy(strategy, BootstrapPlan(Flags(backend="gloo"), creates_process_group=True))
    copy = pickle.loads(pickle.dumps(strategy))
    assert isinstance(copy, FSDPStrategy) and type(copy).setup_environment is not FSDPStrategy.setup_environment
    assert copy.process_group_backend == "gloo"
