"""Both Lightning packages: each Trainer takes its own package's objects, names the other package's clearly, and
importing one never imports the other."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import LIGHTNING, PYTORCH_LIGHTNING, REPO, both_packages, job_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist_hooks import (
    DistributedHooksTrainerMixin,
    MixedLightningPackagesError,
    OpenMPIEnvironment,
    _lightning_internals,
    supported_versions,
)

# Part of the fast subset .ci/compat runs at the ends of the supported version ranges.
pytestmark = pytest.mark.compat

OPENMPI_RANK_1_OF_2 = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "PMIX_NAMESPACE": "prterun-test-1@1",
}


def model_of(package):
    # Typed Any: mypy takes a base class chosen at run time (either package's) only from a name typed Any.
    pl: Any = package.pl

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

    return Model()


def imported_lightning_packages(statement: str) -> list[str]:
    code = (
        f"import sys; {statement}; print(sorted({{m.split('.')[0] for m in sys.modules}} & "
        "{'pytorch_lightning', 'lightning_fabric', 'lightning'}))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=job_environment(), capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return eval(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("import lightning_dist_hooks", []),
        (
            "from lightning_dist_hooks import Trainer, LightningModule, Fabric",
            ["lightning_fabric", "pytorch_lightning"],
        ),
        ("from lightning_dist_hooks.lightning import Trainer, LightningModule, Fabric", ["lightning"]),
    ],
)
def test_importing_one_package_never_imports_the_other(statement, expected):
    assert imported_lightning_packages(statement) == expected


@pytest.mark.unit
@both_packages
def test_a_fit_with_the_packages_own_module_strategy_and_checkpoint_callback(package, tmp_path):
    checkpoint = package.pl.callbacks.ModelCheckpoint(dirpath=tmp_path)
    trainer = package.ours.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        callbacks=[checkpoint],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model_of(package))
    assert trainer.state.finished and trainer.global_step == 2
    assert [path.name for path in tmp_path.iterdir()] == ["epoch=0-step=2.ckpt"]
    strategy = package.pl.strategies.DDPStrategy(process_group_backend="gloo")
    assert package.ours.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False).strategy is strategy


@pytest.mark.unit
@both_packages
def test_the_mixin_in_front_of_a_users_own_trainer_subclass(package, monkeypatch):
    pl: Any = package.pl  # Any: a base class chosen at run time (model_of)

    class UsersTrainer(pl.Trainer):
        def __init__(self, *, greeting: str = "hello", **kwargs) -> None:
            super().__init__(**kwargs)
            self.greeting = greeting

    class MyTrainer(DistributedHooksTrainerMixin, UsersTrainer):
        pass

    class Direct(DistributedHooksTrainerMixin, pl.Trainer):
        pass

    trainer = MyTrainer(
        accelerator="cpu", devices=2, strategy="ddp", greeting="hi", torch_dist_backend="gloo", logger=False
    )
    assert (trainer.greeting, trainer.torch_dist_backend) == ("hi", "gloo") and isinstance(trainer, package.pl.Trainer)
    # The user's __init__ calls Lightning's PL_<CLASS>_* wrapper itself: the class keeps its parent's signature, and
    # a PL_MYTRAINER_TORCH_DIST_BACKEND never reaches Lightning's __init__.
    assert list(inspect.signature(MyTrainer).parameters) == ["greeting", "kwargs"]
    monkeypatch.setenv("PL_MYTRAINER_TORCH_DIST_BACKEND", "mpi")
    assert MyTrainer(accelerator="cpu", devices=2, strategy="ddp", logger=False).torch_dist_backend is None
    monkeypatch.setenv("PL_DIRECT_MAX_EPOCHS", "4")
    monkeypatch.setenv("PL_DIRECT_TORCH_DIST_INIT_METHOD", "env://")
    direct = Direct(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert (direct.max_epochs, direct.torch_dist_init_method) == (4, "env://")


@pytest.mark.unit
@both_packages
def test_our_environments_are_plugins_of_both_packages(package, monkeypatch):
    for name, value in OPENMPI_RANK_1_OF_2.items():
        monkeypatch.setenv(name, value)
    environment = OpenMPIEnvironment()
    assert isinstance(environment, package.fabric.plugins.environments.ClusterEnvironment)
    trainer = package.ours.Trainer(accelerator="cpu", devices=2, strategy="ddp", plugins=[environment], logger=False)
    assert trainer.strategy.cluster_environment is environment and trainer.global_rank == 1
    detected = package.ours.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert type(detected.strategy.cluster_environment) is OpenMPIEnvironment
    assert (
        package.pl.Trainer(
            accelerator="cpu", devices=2, strategy="ddp", plugins=[OpenMPIEnvironment()], logger=False
        ).global_rank
        == 1
    )  # Lightning's own Trainer takes them as well


@pytest.mark.unit
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(PYTORCH_LIGHTNING, LIGHTNING), (LIGHTNING, PYTORCH_LIGHTNING)],
    ids=["pytorch_lightning-given-lightning", "lightning-given-pytorch_lightning"],
)
def test_mixing_the_packages_is_one_clear_error_naming_both(ours, theirs):
    both_named = (
        rf"comes from {theirs.pytorch_module}/{theirs.fabric_module} .* this Trainer is "
        rf"{ours.pytorch_module}/{ours.fabric_module}'s"
    )
    trainer = ours.ours.Trainer(accelerator="cpu", devices=1, logger=False)
    with pytest.raises(MixedLightningPackagesError, match=rf"model=.*Model {both_named}"):
        trainer.fit(model_of(theirs))
    with pytest.raises(MixedLightningPackagesError, match=rf"strategy=DDPStrategy {both_named}"):
        ours.ours.Trainer(accelerator="cpu", devices=2, strategy=theirs.pl.strategies.DDPStrategy(), logger=False)
    with pytest.raises(MixedLightningPackagesError, match=r"callbacks=ModelCheckpoint comes from"):
        ours.ours.Trainer(accelerator="cpu", callbacks=[theirs.pl.callbacks.ModelCheckpoint()], logger=False)
    with pytest.raises(MixedLightningPackagesError, match=r"strategy=DDPStrategy .* this Fabric is"):
        ours.ours.Fabric(accelerator="cpu", devices=2, strategy=theirs.fabric.strategies.DDPStrategy())


@pytest.mark.unit
@pytest.mark.parametrize("distribution", ["lightning", "torch"])
def test_an_untested_release_warns_once_on_first_use_naming_the_range_and_the_fix(monkeypatch, distribution):
    installed = {"lightning": "2.6.6", "torch": "2.13.0+cpu", distribution: "2.99.1"}
    monkeypatch.setattr(supported_versions, "installed_version", installed.get)
    monkeypatch.setattr(supported_versions, "_CHECKED", set())
    flavour = _lightning_internals.Flavour(
        **{
            field: getattr(_lightning_internals.LIGHTNING, field)
            for field in ("distribution", "pytorch", "fabric", "public_module", "import_hint")
        }
    )
    tested = re.escape(supported_versions.SUPPORTED[distribution])
    with pytest.warns(
        UserWarning,
        match=rf"tested with {distribution}{tested}, but 2.99.1 is installed.*"
        rf"install pip install '{distribution}{tested}'",
    ) as warned:
        assert flavour.Trainer.__name__ == "Trainer"
        assert flavour.Fabric.__name__ == "Fabric"
    assert len([w for w in warned if "was tested with" in str(w.message)]) == 1


@pytest.mark.unit
def test_an_mpi4py_outside_the_range_warns_naming_it(monkeypatch):
    # init_mpi() checks the installed mpi4py this way when MPI starts.
    monkeypatch.setattr(supported_versions, "_CHECKED", set())
    with pytest.warns(UserWarning, match=r"tested with mpi4py>=4\.0,<5, but 3\.1\.6 is installed"):
        supported_versions.warn_if_untested("mpi4py", "3.1.6")


@pytest.mark.unit
def test_the_installed_metadata_declares_the_supported_ranges_and_the_installed_torch_is_inside():
    requirements = metadata.requires("lightning-dist-hooks")
    assert requirements is not None
    declared = {requirement.name: requirement.specifier for requirement in map(Requirement, requirements)}
    for distribution, specifier in supported_versions.SUPPORTED.items():
        assert declared[distribution] == SpecifierSet(specifier), distribution
    assert metadata.metadata("lightning-dist-hooks")["Requires-Python"] == supported_versions.PYTHON
    assert SpecifierSet(supported_versions.SUPPORTED["torch"]).contains(torch.__version__)


@pytest.mark.unit
def test_the_lightning_module_exports_what_the_package_exports_with_its_own_three_classes():
    import lightning_dist_hooks
    import lightning_dist_hooks.lightning as unified

    assert sorted(unified.__all__) == sorted(lightning_dist_hooks.__all__)
    per_package = set(lightning_dist_hooks.PER_PACKAGE_CLASSES)
    assert all(
        getattr(unified, name) is getattr(lightning_dist_hooks, name)
        for name in unified.__all__
        if name not in per_package
    )
    import lightning

    assert issubclass(unified.Trainer, lightning.pytorch.Trainer)
    assert issubclass(unified.Fabric, lightning.fabric.Fabric)


def _resolve_private_name(dotted: str, package) -> bool:
    """Whether ``dotted`` (spelled for pytorch_lightning/lightning_fabric) exists in ``package``'s copy: as a module
    attribute, a class attribute, or an attribute the class's ``__init__`` sets."""
    import importlib

    spelled = dotted.replace("pytorch_lightning", package.pytorch).replace("lightning_fabric", package.fabric)
    parts = spelled.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:split]))  # a module, then any attribute of it
        except ImportError:
            continue
        for name in parts[split:-1]:
            owner = getattr(owner, name)
        if hasattr(owner, parts[-1]):
            return True
        # An instance attribute: set in __init__ (building a Trainer would run Lightning's environment detection).
        assigned = rf"self\.{parts[-1]}\b[^=]*="
        return inspect.isclass(owner) and bool(re.search(assigned, inspect.getsource(owner.__init__)))
    return False


@pytest.mark.unit
@pytest.mark.parametrize("flavour", _lightning_internals.FLAVOURS, ids=lambda flavour: flavour.distribution)
def test_every_private_lightning_name_we_use_exists_and_only_the_seam_names_one(flavour):
    import lightning_dist_hooks

    names = _lightning_internals.PRIVATE_NAMES
    missing = [name for name in names if not _resolve_private_name(name, flavour)]
    assert missing == [], f"{flavour.distribution} lacks private names the seam uses: {missing}"

    attributes = {name.rsplit(".", 1)[1] for name in names}
    modules = Path(lightning_dist_hooks.__file__).parent.rglob("*.py")
    leaks = [
        f"{path.name}: {name}"
        for path in modules
        if path.name != "_lightning_internals.py"
        for name in attributes
        if re.search(rf"(?<!self)\.{name}\b|[\"']{name}[\"']", path.read_text())
    ]
    assert leaks == [], f"private Lightning names outside _lightning_internals.py: {leaks}"
