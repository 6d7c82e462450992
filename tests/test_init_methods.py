"""The init-method handler as an extension point (issue 13), and per-job files that agree across nodes (issue 10)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from helpers import job_environment
from lightning_fabric.plugins.environments import LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment

from lightning_dist_hooks import Trainer
from lightning_dist_hooks.bootstrap_plan import Flags
from lightning_dist_hooks.environments import FluxEnvironment, OpenMPIEnvironment, PALSEnvironment
from lightning_dist_hooks.init_methods import (
    AddresslessInitMethod,
    FileInitMethod,
    InitMethod,
    Rendezvous,
    _base,
    init_method_handler,
    register_init_method,
)


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test."""
    monkeypatch.setattr(_base, "_REGISTRY", dict(_base._REGISTRY))
    return _base._REGISTRY


class _Named(InitMethod):
    scheme = "named"


@pytest.mark.unit
def test_a_scheme_is_replaced_only_when_asked(registry):
    register_init_method(_Named())
    with pytest.raises(ValueError, match=r"scheme 'named' already has a handler \(_Named\). Pass replace=True"):
        register_init_method(_Named())
    replacement = _Named()
    register_init_method(replacement, replace=True)
    assert init_method_handler("named://x") is replacement
    with pytest.raises(ValueError, match=r"scheme 'file' already has a handler \(FileInitMethod\)"):
        register_init_method(type("MyFile", (FileInitMethod,), {})())


@pytest.mark.unit
def test_a_handler_without_a_scheme_is_refused(registry):
    with pytest.raises(ValueError, match=r"InitMethod sets no scheme"):
        register_init_method(InitMethod())


@pytest.mark.unit
def test_every_step_has_a_default(registry):
    register_init_method(_Named())
    flags = Flags.checked("gloo", "named://anything")
    assert flags.init_method is not None
    init_method = flags.init_method.resolved_for(LightningEnvironment(), num_nodes=1)
    assert init_method.resolved == "named://anything"
    handler = init_method_handler(init_method.resolved)
    rendezvous = handler.prepare(init_method.resolved, LightningEnvironment())
    assert rendezvous == Rendezvous("named://anything")
    missing = handler.missing_ranks(rendezvous, 2, TimeoutError())
    assert missing == "which ranks are missing cannot be known from this rank"
    handler.finish(rendezvous)


@pytest.mark.unit
def test_a_registered_scheme_decides_its_backends_and_is_a_backends_default(registry):
    class Solo(AddresslessInitMethod):
        scheme = "solo"
        address_source = "there is one rank."

        def check_backend(self, url, backend):
            if backend != "gloo":
                raise ValueError(f"{url} needs gloo, not {backend!r}")

        def default_for_backend(self, backend):
            return "solo://" if backend == "gloo" else None

    register_init_method(Solo())
    init_method = Flags.checked("gloo", None).init_method
    assert init_method is not None and init_method.given == "solo://"
    with pytest.raises(ValueError, match=r"solo:// needs gloo, not None"):
        Flags.checked(None, "solo://")
    with pytest.raises(ValueError, match=r"solo:// takes no address; there is one rank."):
        Flags.checked("gloo", "solo://host")


# A scheme written only against the public API that does everything file:// does: names one file per launch in
# Trainer(...), creates it on each rank, says which ranks are missing, removes it at exit.
_CUSTOM_SCHEME_JOB = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from urllib.parse import urlsplit
    import pytorch_lightning as pl, torch
    from lightning_dist_hooks import (InitMethod, LightningModule, Rendezvous, Trainer, launch_identity,
                                      register_init_method)

    class ScratchInitMethod(InitMethod):
        scheme = "scratch"

        def validate(self, url, parts):
            if not Path(parts.path).is_dir():
                raise ValueError(f"torch_dist_init_method={url!r}: no directory {parts.path}")
            return url

        def resolve(self, url, cluster_environment, num_nodes):
            return url.rstrip("/") + "/" + launch_identity(cluster_environment).replace("=", "-")

        def prepare(self, url, cluster_environment):
            path = Path(urlsplit(url).path)
            os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
            (path.parent / f"prepared{cluster_environment.global_rank()}").touch()
            return Rendezvous(f"file://{path}")

        def finish(self, rendezvous):
            path = Path(rendezvous.init_method[len("file://"):])
            path.unlink(missing_ok=True)
            (path.parent / f"finished{os.getpid()}").touch()

    register_init_method(ScratchInitMethod())

    class Module(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout):
            super().setup_distributed_backend(backend, init_method, rank, world_size, timeout)
            self.init_method = init_method

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_fit_end(self):
            Path(sys.argv[1], f"rank{self.global_rank}.json").write_text(json.dumps(
                {"init_method": self.init_method, "weight": self.layer.weight.tolist()}))

    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      torch_dist_backend="gloo", torch_dist_init_method=f"scratch://{sys.argv[1]}/")
    trainer.fit(Module())
""")


@pytest.mark.slow
def test_a_registered_scheme_can_do_everything_file_does(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_CUSTOM_SCHEME_JOB)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        cwd=tmp_path,
        env=job_environment(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert records[0] == records[1], "both ranks met through the same file and trained the same weights"
    assert records[0]["init_method"].startswith(f"file://{tmp_path}/LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN-")
    names = sorted(path.name for path in tmp_path.iterdir())
    assert [name for name in names if name.startswith("prepared")] == ["prepared0", "prepared1"]
    assert len([name for name in names if name.startswith("finished")]) == 2
    assert not [name for name in names if name.startswith("LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN")], "finish removed it"


# Issue 10: the variables each node of one launch sees (2 nodes, 2 ranks each; rank 2 is node 1's first).
_PER_NODE = {
    SLURMEnvironment: [
        {
            "SLURM_NTASKS": "4",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_PROCID": str(2 * node),
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(node),
            "SLURM_JOB_ID": "42",
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_NAME": "train",
            "SLURMD_NODENAME": f"node{node}",
            "SLURM_NODELIST": "node[0-1]",
        }
        for node in (0, 1)
    ],
    # torchrun --nnodes 2 --rdzv-id job7: the workers of node 1 were restarted once, node 0's were not.
    TorchElasticEnvironment: [
        {
            "TORCHELASTIC_RUN_ID": "job7",
            "TORCHELASTIC_RESTART_COUNT": str(node),
            "GROUP_RANK": str(node),
            "GROUP_WORLD_SIZE": "2",
            "RANK": str(2 * node),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        }
        for node in (0, 1)
    ],
    OpenMPIEnvironment: [
        {
            "OMPI_COMM_WORLD_RANK": str(2 * node),
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "PMIX_NAMESPACE": "prterun-node0-4242@1",
            "PMIX_RANK": str(2 * node),
        }
        for node in (0, 1)
    ],
    FluxEnvironment: [
        {
            "FLUX_TASK_RANK": str(2 * node),
            "FLUX_TASK_LOCAL_ID": "0",
            "FLUX_JOB_SIZE": "4",
            "FLUX_JOB_NNODES": "2",
            "FLUX_JOB_ID": "ƒ2Bt7T6Cw",
            "PMI_RANK": str(2 * node),
            "PMI_SIZE": "4",
        }
        for node in (0, 1)
    ],
    PALSEnvironment: [
        {
            "PALS_RANKID": str(2 * node),
            "PALS_LOCAL_RANKID": "0",
            "PALS_NODEID": str(node),
            "PALS_APID": "7f1c-aa",
            "PALS_LOCAL_SIZE": "2",
            "PMI_RANK": str(2 * node),
            "PMI_SIZE": "4",
            "PBS_JOBID": "1234.pbs01",
        }
        for node in (0, 1)
    ],
}


@pytest.mark.unit
@pytest.mark.parametrize("environment", list(_PER_NODE), ids=lambda environment: environment.__name__)
def test_every_node_of_a_launch_resolves_the_same_per_job_file(launcher_env, tmp_path, environment):
    urls = []
    for variables in _PER_NODE[environment]:
        launcher_env(variables)
        urls.append(FileInitMethod().resolve(f"file://{tmp_path}/", environment(), num_nodes=2))
    assert urls[0] == urls[1] and urls[0].startswith(f"file://{tmp_path}/ldh-rendezvous-")


@pytest.mark.unit
def test_torchrun_on_one_node_still_gets_a_new_file_after_a_restart(launcher_env, tmp_path):
    urls = []
    for restart in ("0", "1"):
        launcher_env(
            {
                "TORCHELASTIC_RUN_ID": "none",
                "TORCHELASTIC_RESTART_COUNT": restart,
                "GROUP_WORLD_SIZE": "1",
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "1",
            }
        )
        urls.append(FileInitMethod().resolve(f"file://{tmp_path}/", TorchElasticEnvironment(), num_nodes=1))
    assert urls[0] != urls[1] and "TORCHELASTIC_RESTART_COUNT-1" in urls[1]


@pytest.mark.unit
@pytest.mark.parametrize("node_rank", ["0", "1"])
def test_lightnings_launcher_once_per_node_cannot_share_a_per_job_file(launcher_env, tmp_path, node_rank):
    # What Lightning documents for a general cluster: the same script started on each node.
    launcher_env({"NODE_RANK": node_rank, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    with pytest.raises(
        ValueError,
        match=(
            rf"torch_dist_init_method='file://{tmp_path}/' with num_nodes=2: Lightning's own launcher is started once "
            rf"per node, and each node's launching process makes its own launch token.*Name a file unique to this run "
            rf"instead, e.g. 'file://{tmp_path}/run42' \(the same on every node\)"
        ),
    ):
        Trainer(
            accelerator="cpu",
            devices=2,
            num_nodes=2,
            strategy="ddp",
            logger=False,
            torch_dist_init_method=f"file://{tmp_path}/",
        )
    explicit = Trainer(
        accelerator="cpu",
        devices=2,
        num_nodes=2,
        strategy="ddp",
        logger=False,
        torch_dist_init_method=f"file://{tmp_path}/run42",
    )
    assert explicit.torch_dist_init_method == f"file://{tmp_path}/ldh-uid-{os.geteuid()}/run42"


@pytest.mark.unit
def test_lightnings_launcher_on_one_node_keeps_its_per_job_file(launcher_env, tmp_path):
    launcher_env({})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(
            accelerator="cpu",
            devices=2,
            num_nodes=1,
            strategy="ddp",
            logger=False,
            torch_dist_init_method=f"file://{tmp_path}/",
        )
    assert trainer.torch_dist_init_method.startswith(
        f"file://{tmp_path}/ldh-uid-{os.geteuid()}/ldh-rendezvous-LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN-"
    )


@pytest.mark.unit
def test_two_schemes_offering_a_backend_default_are_an_error_whatever_the_registration_order(monkeypatch):
    from lightning_dist_hooks.init_methods import _base

    class RivalInitMethod(InitMethod):
        scheme = "rival"

        def default_for_backend(self, backend):
            return "rival://" if backend == "mpi4py" else None

    registered = list(_base._REGISTRY.items())
    for order in (1, -1):
        monkeypatch.setattr(_base, "_REGISTRY", dict(registered[::order]))
        register_init_method(RivalInitMethod())
        with pytest.raises(
            ValueError,
            match=r"torch_dist_backend='mpi4py': several init methods offer to be its "
            r"default \((mpi://|rival://) .*, (mpi://|rival://) .*\)\. Pass "
            r"torch_dist_init_method=\.\.\. to choose",
        ):
            _base.default_init_method_for("mpi4py")
        assert _base.default_init_method_for("gloo") is None


@pytest.mark.unit
@pytest.mark.parametrize("scheme", ["file", "dir"])
def test_the_location_of_a_shared_filesystem_url_is_the_file_really_used(scheme):
    # What create_process_group names in its progress, timeout and deadline messages (issue 30).
    handler = init_method_handler(f"{scheme}:///shared/rdzv/run42")
    assert handler.location(f"{scheme}:///shared/rdzv/run42") == f"{scheme}:///shared/rdzv/ldh-uid-{os.geteuid()}/run42"
    assert handler.location(f"{scheme}:///shared/rdzv/") == f"{scheme}:///shared/rdzv/"  # not yet named: as it is


@pytest.mark.unit
def test_a_filesystem_refusing_flock_is_answered_with_dir_of_the_same_form():
    from lightning_dist_hooks.init_methods._shared_filesystem.file_scheme import (
        file_locks_refused,
        rendezvous_file_for_job,
    )

    error = OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    private = Path("/shared/rdzv/ldh-uid-7")
    explicit = file_locks_refused("file:///shared/rdzv/run42", private, error)
    assert explicit.startswith(
        "torch_dist_init_method='file:///shared/rdzv/run42': the filesystem of "
        "/shared/rdzv/ldh-uid-7 refuses file locks (flock: No locks available)"
    )
    assert "Use torch_dist_init_method='dir:///shared/rdzv/run42' instead" in explicit
    # A per-launch file: the fix is the per-launch URL, which names every launch's file anew.
    per_launch = file_locks_refused(rendezvous_file_for_job("file:///shared/rdzv/", "SLURM_JOB_ID=42"), private, error)
    assert "Use torch_dist_init_method='dir:///shared/rdzv/' instead" in per_launch
