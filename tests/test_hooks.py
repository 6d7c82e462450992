"""The hooks' signatures are checked in the launching process, before Lightning's launcher starts any rank; and
``configure_sampler``'s ``stage`` prints as ``"train"`` yet stands for Lightning's ``RunningStage``."""

from __future__ import annotations

import copy
import functools
import inspect
import pickle
import typing
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

import pytest
import torch
from helpers import PYTORCH_LIGHTNING, both_packages
from torch.utils.data import DataLoader, Dataset

from lightning_dist_hooks import Trainer
from lightning_dist_hooks.doctor.command import DoctorModule
from lightning_dist_hooks.hooks import (
    DistributedHooksMixin,
    Stage,
    as_running_stage,
    default_setup_distributed_backend,
    expected_parameters,
    hook_call_problem,
    setup_arguments,
    takes_device_id,
    taking_parameters_of,
)

pytestmark = pytest.mark.unit


class ReachedLightningsLauncherError(Exception):
    """Raised in place of Lightning's launcher: the call got past our checks, and no process was started."""


def trainer_stopping_at_the_launcher(package, strategy="ddp_spawn"):
    trainer = package.ours.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    launches = []

    def launch(function, *args, **kwargs):
        launches.append(function)
        raise ReachedLightningsLauncherError

    assert trainer.strategy.launcher is not None, "this strategy must start its processes itself"
    trainer.strategy.launcher.launch = launch
    return trainer, launches


def ones(rows: int) -> DataLoader:
    """A loader of ``rows`` samples ``[1.0]``: the tensor indexes as a map-style dataset, which torch's stubs leave out
    (their ``Dataset`` is a class, not a protocol)."""
    return DataLoader(cast(Dataset, torch.ones(rows, 1)))


def module_class(package, **hooks):
    # Typed Any: mypy takes a base class chosen at run time (either package's) only from a name typed Any.
    pl: Any = package.pl

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return ones(4)

    for name, hook in hooks.items():
        setattr(Model, name, hook)
    return Model


def bad_setup(self, backend, init_method, rank, world_size):
    pass


def bad_sampler(self, dataloader):
    pass


@both_packages
@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp"])
def test_a_setup_hook_with_the_wrong_signature_fails_fit_before_any_process_starts(package, strategy):
    trainer, launches = trainer_stopping_at_the_launcher(package, strategy)
    with pytest.raises(TypeError) as error:
        trainer.fit(module_class(package, setup_distributed_backend=bad_setup)())
    assert launches == []  # and the tier's own check: no process was started
    assert str(error.value) == (
        "Model.setup_distributed_backend is declared as setup_distributed_backend(self, backend, init_method, rank, "
        "world_size), which cannot take the arguments every rank passes it (too many positional arguments). Declare "
        "it as setup_distributed_backend(self, backend, init_method, rank, world_size, timeout, device_id=None) (the "
        "five-argument form without device_id, *args and **kwargs work too). Checked at Trainer.fit(), before any "
        "process starts."
    )


@both_packages
def test_a_sampler_hook_with_the_wrong_signature_fails_fit_before_any_process_starts(package):
    trainer, launches = trainer_stopping_at_the_launcher(package)
    with pytest.raises(
        TypeError,
        match=r"^Model\.configure_sampler is declared as configure_sampler\(self, "
        r"dataloader\), which cannot take the arguments every rank passes it \(too "
        r"many positional arguments\)\. Declare it as configure_sampler\(self, "
        r"dataloader, stage\) .* Checked at Trainer\.fit\(\), before any process",
    ):
        trainer.fit(module_class(package, configure_sampler=bad_sampler)())
    assert launches == []


def test_a_method_named_like_the_setup_hook_is_not_checked_where_no_process_group_is_made():
    # One device: no process group, so setup_distributed_backend is never called and a method of that name is the
    # module's own business (as with Lightning's Trainer); the fit runs, in this process.
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = module_class(PYTORCH_LIGHTNING, setup_distributed_backend=bad_setup)()
    trainer.fit(model)
    assert trainer.global_step == 1


def datamodule_class(package, hook):
    pl: Any = package.pl  # Any: a base class chosen at run time (module_class)

    class DataModule(pl.LightningDataModule):
        def train_dataloader(self):
            return ones(4)

    DataModule.configure_sampler = hook
    return DataModule


@both_packages
@pytest.mark.parametrize("as_keyword", [True, False], ids=["datamodule=", "positional"])
def test_a_datamodules_sampler_hook_is_checked_too(package, as_keyword):
    trainer, launches = trainer_stopping_at_the_launcher(package)
    datamodule = datamodule_class(package, lambda self, dataloader, stage, extra: None)()
    with pytest.raises(
        TypeError,
        match=r"^DataModule\.configure_sampler is declared as configure_sampler\(self, "
        r"dataloader, stage, extra\), which cannot take .* \(missing a required "
        r"argument: 'extra'\)",
    ):
        if as_keyword:
            trainer.fit(module_class(package)(), datamodule=datamodule)
        else:
            trainer.fit(module_class(package)(), datamodule)
    assert launches == []


@pytest.mark.parametrize("method", ["validate", "test", "predict"])
def test_validate_test_and_predict_check_the_hooks_too(method):
    trainer, launches = trainer_stopping_at_the_launcher(PYTORCH_LIGHTNING)
    with pytest.raises(TypeError, match=rf"Checked at Trainer\.{method}\(\), before any process starts\."):
        getattr(trainer, method)(module_class(PYTORCH_LIGHTNING, configure_sampler=bad_sampler)())
    assert launches == []


def test_an_inherited_hook_names_the_class_that_defines_it_and_a_staticmethod_its_own_signature():
    base = module_class(PYTORCH_LIGHTNING, setup_distributed_backend=staticmethod(lambda backend: None))
    child = type("Child", (base,), {})
    trainer, _ = trainer_stopping_at_the_launcher(PYTORCH_LIGHTNING)
    with pytest.raises(
        TypeError,
        match=r"^Model\.setup_distributed_backend \(inherited by Child\) is declared as "
        r"setup_distributed_backend\(backend\), which",
    ):
        trainer.fit(child())


def test_a_hook_that_is_not_callable_is_refused():
    trainer, _ = trainer_stopping_at_the_launcher(PYTORCH_LIGHTNING)
    with pytest.raises(
        TypeError,
        match=r"configure_sampler is declared as configure_sampler\(\.\.\.\), which cannot "
        r"take the arguments every rank passes it \(it is not callable but str\)",
    ):
        trainer.fit(module_class(PYTORCH_LIGHTNING, configure_sampler="random")())


GOOD_SETUP_HOOKS: dict[str, Callable[..., None]] = {
    "documented": lambda self, backend, init_method, rank, world_size, timeout, device_id=None: None,
    "five arguments": lambda self, backend, init_method, rank, world_size, timeout: None,
    "device_id keyword-only": lambda self, backend, init_method, rank, world_size, timeout, *, device_id: None,
    "*args": lambda self, *args: None,
    "**kwargs": lambda self, backend, init_method, rank, world_size, timeout, **kwargs: None,
    "*args, **kwargs": lambda self, *args, **kwargs: None,
    "other names": lambda self, b, url, r, n, t, device_id=None: None,
}
GOOD_SAMPLER_HOOKS: dict[str, Callable[..., None]] = {
    "documented": lambda self, dataloader, stage: None,
    "optional extra": lambda self, dataloader, stage, extra=None: None,
    "*args": lambda self, *args: None,
    "**kwargs": lambda self, dataloader, stage, **kwargs: None,
}


@both_packages
@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp"])
@pytest.mark.parametrize("setup", GOOD_SETUP_HOOKS.values(), ids=GOOD_SETUP_HOOKS)
def test_good_setup_hooks_pass_the_check_and_reach_lightnings_launcher(package, strategy, setup):
    trainer, launches = trainer_stopping_at_the_launcher(package, strategy)
    with pytest.raises(ReachedLightningsLauncherError):
        trainer.fit(module_class(package, setup_distributed_backend=setup)())
    assert len(launches) == 1


@pytest.mark.parametrize("sampler", GOOD_SAMPLER_HOOKS.values(), ids=GOOD_SAMPLER_HOOKS)
def test_good_sampler_hooks_pass_the_check_on_the_module_and_the_datamodule(sampler):
    trainer, launches = trainer_stopping_at_the_launcher(PYTORCH_LIGHTNING)
    with pytest.raises(ReachedLightningsLauncherError):
        trainer.fit(
            module_class(PYTORCH_LIGHTNING, configure_sampler=sampler)(),
            datamodule=datamodule_class(PYTORCH_LIGHTNING, sampler)(),
        )
    assert len(launches) == 1


def test_the_hooks_mixins_defaults_pass_the_check():
    hooks_module: Any = PYTORCH_LIGHTNING.ours.LightningModule  # Any: bases chosen at run time (module_class)
    model_class: Any = module_class(PYTORCH_LIGHTNING)

    class Model(hooks_module, model_class):
        pass

    trainer, launches = trainer_stopping_at_the_launcher(PYTORCH_LIGHTNING)
    with pytest.raises(ReachedLightningsLauncherError):
        trainer.fit(Model())
    assert len(launches) == 1


def fabric_setup_with_four_arguments(backend, init_method, rank, world_size):
    pass


@both_packages
def test_fabrics_setup_callable_is_checked_at_construction(package):
    with pytest.raises(TypeError) as error:
        package.ours.Fabric(
            accelerator="cpu",
            devices=2,
            strategy="ddp_spawn",
            setup_distributed_backend=fabric_setup_with_four_arguments,
        )
    assert str(error.value) == (
        "setup_distributed_backend=fabric_setup_with_four_arguments is declared as setup_distributed_backend(backend, "
        "init_method, rank, world_size), which cannot take the arguments every rank passes it (too many positional "
        "arguments). Declare it as setup_distributed_backend(backend, init_method, rank, world_size, timeout, "
        "device_id=None) (the five-argument form without device_id, *args and **kwargs work too). Checked at "
        "Fabric(...), before any process starts."
    )


@pytest.mark.parametrize(
    "setup",
    [
        lambda backend, init_method, rank, world_size, timeout, device_id=None: None,
        lambda backend, init_method, rank, world_size, timeout: None,
        lambda *args, **kwargs: None,
    ],
    ids=["documented", "five arguments", "*args, **kwargs"],
)
def test_fabrics_good_setup_callables_pass(setup):
    fabric = PYTORCH_LIGHTNING.ours.Fabric(
        accelerator="cpu", devices=2, strategy="ddp", setup_distributed_backend=setup
    )
    assert fabric.world_size == 2


def test_a_callable_without_a_readable_signature_is_left_to_the_call():
    assert hook_call_problem("setup_distributed_backend", print) is None  # a builtin: *args, **kwargs


# --- stage ------------------------------------------------------------------------------------------------------


@both_packages
@pytest.mark.parametrize(
    ("member", "value"),
    [("TRAINING", "train"), ("VALIDATING", "validate"), ("TESTING", "test"), ("PREDICTING", "predict")],
)
def test_stage_prints_as_its_value_and_stands_for_lightnings_running_stage(package, member, value, capsys):
    stages = package.pl.trainer.states.RunningStage
    running_stage = stages[member]
    stage = Stage(running_stage)
    print(stage, f"{stage}", "%s" % stage)  # noqa: UP031 - every way a user prints it
    assert capsys.readouterr().out == f"{value} {value} {value}\n"
    assert stage == running_stage and running_stage == stage and stage == value and value == stage
    assert stage == value.upper()  # case-insensitive, as RunningStage compares
    assert not (stage != running_stage)  # noqa: SIM202 - __ne__ is checked here, not __eq__
    assert stage != stages.SANITY_CHECKING and stage in (running_stage,) and stage in {running_stage}
    assert {running_stage: "mine"}[stage] == "mine" and hash(stage) == hash(running_stage)
    assert (stage.value, stage.name, stage.evaluating, stage.dataloader_prefix) == (
        running_stage.value,
        running_stage.name,
        running_stage.evaluating,
        running_stage.dataloader_prefix,
    )
    assert isinstance(stage, str) and as_running_stage(stage) is running_stage and as_running_stage(value) == value
    for again in (pickle.loads(pickle.dumps(stage)), copy.deepcopy(stage)):
        assert type(again) is Stage and again.running_stage is running_stage and str(again) == value


_Model: Any = module_class(PYTORCH_LIGHTNING)  # Any: a base class chosen at run time (module_class)


class SamplerRecorder(_Model):
    def __init__(self):
        super().__init__()
        self.printed, self.stages = [], []

    def validation_step(self, batch, batch_idx):
        return None

    def predict_step(self, batch, batch_idx):
        return self.layer(batch)

    def val_dataloader(self):
        return ones(2)

    def predict_dataloader(self):
        return ones(2)

    def configure_sampler(self, dataloader, stage):
        self.printed.append(str(stage))
        self.stages.append(stage)
        return PYTORCH_LIGHTNING.ours.LightningModule.configure_sampler(self, dataloader, stage)  # the default


def test_configure_sampler_receives_a_stage_that_prints_plainly_and_the_default_takes_it():
    stages = PYTORCH_LIGHTNING.pl.trainer.states.RunningStage
    model = SamplerRecorder()
    trainer = PYTORCH_LIGHTNING.ours.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    trainer.predict(model)
    assert model.printed == ["validate", "train", "predict"]
    assert model.stages == [stages.VALIDATING, stages.TRAINING, stages.PREDICTING]
    assert all(type(stage) is Stage for stage in model.stages)


def test_the_default_sampler_takes_a_stage_as_lightning_takes_its_running_stage():
    from lightning_dist_hooks import lightning_default_sampler

    stages = PYTORCH_LIGHTNING.pl.trainer.states.RunningStage
    trainer = PYTORCH_LIGHTNING.ours.Trainer(accelerator="cpu", devices=1, logger=False)
    loader = ones(4)
    for member in stages.TRAINING, stages.PREDICTING:
        # The hook's Stage, which the function takes (as_running_stage) though its annotation says RunningStage.
        ours, lightnings = (
            lightning_default_sampler(trainer, loader, stage)  # type: ignore[arg-type]
            for stage in (Stage(member), member)
        )
        assert type(ours) is type(lightnings)


def returning_a_sampler(returned):
    """A one-device fit's module whose ``configure_sampler`` returns ``returned`` (called on the loader if callable)."""

    def configure_sampler(self, dataloader, stage):
        return returned(dataloader) if callable(returned) else returned

    return module_class(PYTORCH_LIGHTNING, configure_sampler=configure_sampler)()


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        ("random", "'random' (str)"),
        (5, "5 (int)"),
        (lambda loader: loader, "<torch.utils.data.dataloader.DataLoader object at 0x"),
    ],
)
def test_a_configure_sampler_result_that_is_no_sampler_fails_naming_the_hook_the_stage_and_what_it_must_return(
    returned, shown
):
    trainer = PYTORCH_LIGHTNING.ours.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(TypeError) as raised:
        trainer.fit(returning_a_sampler(returned))
    message = str(raised.value)
    assert message.startswith(f"configure_sampler of Model returned {shown}"), message
    assert message.endswith(
        "for the train dataloader; it must return a torch.utils.data.Sampler, an iterable of "
        "indices, or None (the dataloader as given)"
    ), message


def test_an_iterable_of_indices_is_a_sampler_the_hook_may_return():
    model = returning_a_sampler([3, 2, 1, 0])
    trainer = PYTORCH_LIGHTNING.ours.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    assert list(trainer.train_dataloader.sampler) == [3, 2, 1, 0]


def test_the_setup_hooks_signature_is_written_once_and_the_mixin_the_doctor_and_the_messages_show_it():
    the_one = list(inspect.signature(default_setup_distributed_backend).parameters.values())
    for method in (DistributedHooksMixin.setup_distributed_backend, DoctorModule.setup_distributed_backend):
        self_parameter, *parameters = inspect.signature(method).parameters.values()
        assert self_parameter.name == "self" and parameters == the_one
        assert typing.get_type_hints(method) == typing.get_type_hints(default_setup_distributed_backend)
        assert takes_device_id(method)
        assert hook_call_problem("setup_distributed_backend", functools.partial(method, None)) is None
    assert expected_parameters("setup_distributed_backend") == (
        "backend, init_method, rank, world_size, timeout, device_id=None"
    )
    assert expected_parameters("configure_sampler") == "dataloader, stage"


def test_an_override_declared_with_the_hooks_parameters_reads_them_by_name_however_it_is_called():
    class Module:
        @taking_parameters_of(default_setup_distributed_backend)
        def setup_distributed_backend(self, *args, **kwargs):
            return setup_arguments(*args, **kwargs)

    timeout = timedelta(seconds=5)
    module: Any = Module()  # the decorator declares the hook's result (None); this override returns what it read
    positional = module.setup_distributed_backend("gloo", "env://", 1, 2, timeout)
    by_name = module.setup_distributed_backend(
        "gloo", "env://", rank=1, world_size=2, timeout=timeout, device_id=torch.device("cpu")
    )
    assert positional == {
        "backend": "gloo",
        "init_method": "env://",
        "rank": 1,
        "world_size": 2,
        "timeout": timeout,
        "device_id": None,
    }
    assert by_name == {**positional, "device_id": torch.device("cpu")}
    with pytest.raises(TypeError, match="missing a required argument: 'timeout'"):
        module.setup_distributed_backend("gloo", "env://", 1, 2)
