"""LightningCLI with our Trainer as ``trainer_class``: every standard ``--trainer.*`` option and ours, from the command
line, ``trainer_defaults`` and a YAML file, in both Lightning packages; a real 2-rank fit started each way."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

import pytest
import torch
import yaml
from helpers import BOTH, REPO, both_packages, job_environment, run_command

# Part of the fast subset .ci/compat runs at the ends of the supported version ranges. What it checks (the CLI's
# parsing, help and config reaching our Trainer) is Lightning's and jsonargparse's: lightning_only.
pytestmark = [pytest.mark.compat, pytest.mark.lightning_only]

CLI_JOB = REPO / "tests" / "jobs" / "cli_job.py"


def cli(package, args, **kwargs):
    LightningCLI = importlib.import_module(f"{package.pytorch_module}.cli").LightningCLI

    pl: Any = package.pl  # Any: mypy takes a base class chosen at run time only from a name typed Any

    class Model(pl.LightningModule):
        def __init__(self, width: int = 4) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(width, 1)

    return LightningCLI(Model, trainer_class=package.ours.Trainer, args=args, run=False, **kwargs)


@pytest.mark.unit
@both_packages
def test_print_config_shows_every_lightning_option_and_ours_with_defaults(package, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli(package, ["--print_config"])
    assert exit_.value.code == 0
    trainer_section = yaml.safe_load(capsys.readouterr().out)["trainer"]
    lightning_parameters = [name for name in inspect.signature(package.pl.Trainer).parameters if name != "callbacks"]
    assert set(lightning_parameters) <= set(trainer_section)
    assert trainer_section["torch_dist_backend"] is None and trainer_section["torch_dist_init_method"] is None
    assert trainer_section["accelerator"] == "auto" and trainer_section["max_steps"] == -1


@pytest.mark.unit
@both_packages
def test_help_documents_our_options_next_to_lightnings(package, capsys):
    with pytest.raises(SystemExit):
        cli(package, ["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--trainer.accelerator ACCELERATOR" in help_text and "--trainer.max_epochs MAX_EPOCHS" in help_text
    assert "--trainer.torch_dist_backend TORCH_DIST_BACKEND the ``torch.distributed`` backend" in help_text
    assert "--trainer.torch_dist_init_method TORCH_DIST_INIT_METHOD how ranks meet" in help_text
    # every registered scheme and the MPI transport, as their registries list them (lightning_dist_hooks.flag_docs)
    for listed in ('"env://"', '"tcp://HOST:PORT"', '"file:///PATH"', '"dir:///PATH"', '"mpi://"', '"mpi4py"'):
        assert listed in help_text, listed


@pytest.mark.unit
@both_packages
def test_command_line_trainer_defaults_and_yaml_all_reach_the_trainer(package, tmp_path):
    defaults = {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "torch_dist_backend": "GLOO", "logger": False}
    trainer = cli(package, [], trainer_defaults=defaults).trainer
    assert (trainer.torch_dist_backend, trainer.num_devices) == ("gloo", 2)
    assert isinstance(trainer.strategy, package.pl.strategies.DDPStrategy)

    command_line = ["--trainer.max_epochs=3", "--trainer.torch_dist_init_method=tcp://127.0.0.1:29400"]
    trainer = cli(package, command_line, trainer_defaults=defaults).trainer
    assert (trainer.max_epochs, trainer.torch_dist_init_method) == (3, "tcp://127.0.0.1:29400")

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainer": {**defaults, "max_epochs": 5, "torch_dist_init_method": "env://"}}))
    trainer = cli(package, ["--config", str(config)]).trainer
    assert (trainer.max_epochs, trainer.torch_dist_backend, trainer.torch_dist_init_method) == (5, "gloo", "env://")


@pytest.mark.unit
@both_packages
def test_a_bad_flag_from_the_command_line_fails_with_the_trainers_message(package):
    with pytest.raises(ValueError, match="torch_dist_init_method='ftp://x'"):
        cli(package, ["--trainer.accelerator=cpu", "--trainer.torch_dist_init_method=ftp://x"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("package", "source"),
    [(BOTH[0], "command-line"), (BOTH[1], "yaml")],
    ids=["pytorch_lightning-command-line", "lightning-yaml"],
)
def test_two_rank_fit_started_by_the_cli_uses_our_flags(package, source, tmp_path):
    rendezvous_dir = tmp_path / "rendezvous"
    rendezvous_dir.mkdir()
    out = tmp_path / "out"
    trainer = {
        "accelerator": "cpu",
        "devices": 2,
        "strategy": "ddp",
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "torch_dist_backend": "gloo",
        "torch_dist_init_method": f"file://{rendezvous_dir}/",
    }
    if source == "yaml":
        config = tmp_path / "fit.yaml"  # not config.yaml: Lightning saves the resolved config under that name
        config.write_text(yaml.safe_dump({"trainer": trainer, "model": {"out": str(out)}}))
        options = ["--config", str(config)]
    else:
        options = [f"--trainer.{name}={value}" for name, value in trainer.items()] + [f"--model.out={out}"]
    command = ["timeout", "200", sys.executable, str(CLI_JOB), "--package", package.name, "fit", *options]
    result = run_command(command, cwd=tmp_path, out_dir=out, timeout=230, env=job_environment()).assert_ok()

    assert sorted(result.ranks) == [0, 1], result.output[-4000:]
    for rank, record in result.ranks.items():
        assert record["trainer"] == f"{package.ours.Trainer.__module__}.Trainer"
        (call,) = record["setup_calls"]
        assert (call["backend"], call["rank"], call["world_size"]) == ("gloo", rank, 2)
        assert call["init_method"].startswith(f"file://{rendezvous_dir}/ldh-uid-{os.geteuid()}/ldh-rendezvous-")
        assert record["process_group_backend"] == "gloo"
    assert len({record["setup_calls"][0]["init_method"] for record in result.ranks.values()}) == 1
    result.same_on_all_ranks("weights_sha256")
    assert list(rendezvous_dir.iterdir()) == []
    # Lightning's own bootstrap line, through Lightning's logger, as a user without our flags would see it.
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2" in result.output
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.output
