"""With no flag and no hook, ``lightning_dist_hooks.Trainer`` is ``pytorch_lightning.Trainer``, bit for bit."""

from __future__ import annotations

import inspect
import pickle

import pytest
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy

import lightning_dist_hooks
from lightning_dist_hooks import DistributedHooksTrainerMixin, Trainer
from lightning_dist_hooks.config import ProcessGroupConfig
from lightning_dist_hooks.strategy import attach_process_group_config


@pytest.mark.parametrize(
    ("strategy", "devices", "stages"),
    # ddp_spawn starts new processes for every stage, so it runs fewer of them to keep the suite fast.
    [("auto", 1, "fit,validate,test,predict"), ("ddp", 2, "fit,validate,test,predict"), ("ddp_spawn", 2, "fit,test")],
    ids=["1-device", "ddp", "ddp_spawn"],
)
def test_defaults_give_bitwise_equal_weights_and_identical_sample_order(run_job, strategy, devices, stages):
    flags = ("--strategy", strategy, "--devices", str(devices), "--stages", stages)
    theirs = run_job("--trainer", "pl", *flags).assert_ok()
    ours = run_job("--trainer", "ldh", *flags).assert_ok()
    assert sorted(ours.ranks) == sorted(theirs.ranks) == list(range(devices))
    for rank in range(devices):
        assert ours.ranks[rank]["weights_sha256"] == theirs.ranks[rank]["weights_sha256"]
        assert ours.ranks[rank]["seen"] == theirs.ranks[rank]["seen"]
        assert ours.ranks[rank]["store"] == theirs.ranks[rank]["store"]
    assert ours.same_on_all_ranks("weights_sha256")
    if devices == 2:  # Lightning's distributed sampler really split the data
        assert set(ours.ranks[0]["seen"]["test"]).isdisjoint(ours.ranks[1]["seen"]["test"])


def test_explicit_backend_and_file_rendezvous_train_the_same_weights(run_job, tmp_path):
    theirs = run_job("--trainer", "pl").assert_ok()
    ours = run_job("--backend", "gloo", "--init-method", f"file://{tmp_path}/rendezvous").assert_ok()
    assert ours.same_on_all_ranks("weights_sha256") == theirs.same_on_all_ranks("weights_sha256")


def test_trainer_is_a_lightning_trainer_built_from_a_public_mixin():
    assert issubclass(Trainer, pl.Trainer) and issubclass(Trainer, DistributedHooksTrainerMixin)

    class ExistingTrainer(pl.Trainer):
        def greeting(self):
            return "kept"

    class UpgradedTrainer(DistributedHooksTrainerMixin, ExistingTrainer):
        pass

    trainer = UpgradedTrainer(accelerator="cpu", devices=2, strategy="ddp", torch_dist_backend="gloo", logger=False)
    assert trainer.greeting() == "kept" and trainer.torch_dist_backend == "gloo"


def test_signature_keeps_lightnings_parameters_and_env_defaults(monkeypatch):
    lightning_parameters = list(inspect.signature(pl.Trainer).parameters)
    assert list(inspect.signature(Trainer).parameters) == lightning_parameters
    monkeypatch.setenv("PL_TRAINER_MAX_EPOCHS", "7")
    assert Trainer(accelerator="cpu", logger=False).max_epochs == 7


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp", "ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_true"])
def test_trainer_and_strategy_stay_picklable(strategy, tmp_path):
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False, torch_dist_backend="gloo",
                      torch_dist_init_method=f"file://{tmp_path}/rendezvous")
    copy = pickle.loads(pickle.dumps(trainer))
    assert type(copy.strategy).__name__ == type(trainer.strategy).__name__
    assert isinstance(copy.strategy, DDPStrategy)
    assert copy.strategy._process_group_config == trainer.strategy._process_group_config
    assert copy.strategy._ddp_kwargs == trainer.strategy._ddp_kwargs
    assert (copy.torch_dist_backend, copy.torch_dist_init_method) == ("gloo", f"file://{tmp_path}/rendezvous")


def test_module_with_the_hooks_mixin_is_picklable():
    module = pickle.loads(pickle.dumps(lightning_dist_hooks.LightningModule()))
    assert isinstance(module, pl.LightningModule)
    assert callable(module.setup_distributed_backend) and callable(module.configure_sampler)


def test_a_user_strategy_instance_keeps_its_identity_and_settings():
    from datetime import timedelta

    strategy = DDPStrategy(find_unused_parameters=True, timeout=timedelta(seconds=42))
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy, torch_dist_backend="gloo", logger=False)
    assert trainer.strategy is strategy
    assert strategy._ddp_kwargs == {"find_unused_parameters": True}
    assert strategy._timeout == timedelta(seconds=42)
    assert strategy.process_group_backend == "gloo"


def test_fsdp_strategy_takes_the_hooks():
    # Lightning 2.6 runs FSDP on CUDA only; the hooks attach to the instance the same way as for DDP.
    strategy = FSDPStrategy()
    attach_process_group_config(strategy, ProcessGroupConfig(backend="gloo"), uses_cuda=False)
    copy = pickle.loads(pickle.dumps(strategy))
    assert isinstance(copy, FSDPStrategy) and type(copy).setup_environment is not FSDPStrategy.setup_environment
    assert copy.process_group_backend == "gloo"
