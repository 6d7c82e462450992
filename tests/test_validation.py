"""Bad input fails in ``Trainer(...)``, before any process starts, with the value, the reason and the fix."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import PYTORCH_LIGHTNING, both_packages

from lightning_dist_hooks import mpi
from lightning_dist_hooks.backends import check_backend_fits_devices

# Part of the fast subset .ci/compat runs at the ends of the supported version ranges.
pytestmark = [pytest.mark.compat, pytest.mark.unit]


def make_trainer(package=PYTORCH_LIGHTNING, **kwargs):
    options = {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "logger": False, "enable_checkpointing": False}
    options.update(kwargs)
    return package.ours.Trainer(**options)


def test_unknown_backend_lists_the_backends_this_build_offers():
    with pytest.raises(ValueError, match=r"torch_dist_backend='glooo' is not a torch.distributed backend") as error:
        make_trainer(torch_dist_backend="glooo")
    assert re.search(r"offered here: .*gloo", str(error.value))
    assert "register_backend" in str(error.value)


TRANSPORT_OFFERED = mpi.is_available() and mpi.torch_fits_the_transport()


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("mpii", "mpi"),
        ("glo", "gloo"),
        ("ncll", "nccl"),
        pytest.param(
            "mpi4pi", "mpi4py", marks=pytest.mark.skipif(not TRANSPORT_OFFERED, reason="needs the MPI transport")
        ),
    ],
)
def test_a_near_miss_gets_a_did_you_mean(typo, meant):
    with pytest.raises(ValueError, match=rf"'{typo}' is not a torch.distributed backend. Did you mean '{meant}'\?"):
        make_trainer(torch_dist_backend=typo)


@pytest.mark.skipif(not TRANSPORT_OFFERED, reason="needs mpi4py and a torch the MPI transport supports")
def test_the_offered_backends_include_the_mpi_transport_leave_out_torchs_test_backend_and_stay_the_same():
    def offered() -> list[str]:
        with pytest.raises(ValueError) as error:
            make_trainer(torch_dist_backend="nonsense")
        offered_here = re.search(r"offered here: ([\w, ]+);", str(error.value))
        assert offered_here, error.value
        return offered_here.group(1).split(", ")

    before = offered()
    mpi.register()
    assert offered() == before
    assert {"gloo", "mpi", "mpi4py"} <= set(before) and "fake" not in before and "undefined" not in before


def test_torchs_test_backend_is_refused_saying_why():
    with pytest.raises(ValueError, match=r"'fake' is torch's test backend: its collectives move no data"):
        make_trainer(torch_dist_backend="fake")


def test_backend_name_is_case_insensitive():
    assert make_trainer(torch_dist_backend="GLOO").torch_dist_backend == "gloo"


@pytest.mark.parametrize("backend", [name for name in ("ucc", "nccl", "xccl") if not dist.is_backend_available(name)])
def test_native_backend_missing_from_this_build_says_so_and_what_to_do(backend):
    with pytest.raises(ValueError, match=rf"this torch build \(.*\) has no '{backend}' backend. To use it, "):
        make_trainer(torch_dist_backend=backend)


@pytest.mark.skipif(dist.is_nccl_available(), reason="this torch build has NCCL; the error below is for CPU builds")
def test_nccl_on_a_cpu_build_suggests_gloo():
    with pytest.raises(ValueError, match=r"for CPU training use torch_dist_backend='gloo'"):
        make_trainer(torch_dist_backend="nccl")


def test_nccl_without_cuda_devices_suggests_gloo():
    # Checked directly: on a CPU-only torch build the missing-NCCL error above comes first.
    with pytest.raises(ValueError, match=r"'nccl' needs CUDA devices.*Use torch_dist_backend='gloo'"):
        check_backend_fits_devices("nccl", uses_cuda=False)
    check_backend_fits_devices("nccl", uses_cuda=True)


def test_the_mpi4py_transport_on_cuda_devices_suggests_nccl():
    with pytest.raises(
        ValueError,
        match=r"'mpi4py' moves CPU tensors only, but this Trainer runs on CUDA. "
        r"Use torch_dist_backend='nccl'",
    ):
        check_backend_fits_devices("mpi4py", uses_cuda=True)


def test_the_mpi4py_transport_on_cuda_devices_is_named_as_the_user_wrote_it():
    # Issue 30: torch_dist_backend="mpi" became the transport; the user never wrote 'mpi4py'.
    with pytest.raises(ValueError, match=r"^torch_dist_backend='mpi' \(the mpi4py transport\) moves CPU tensors only"):
        check_backend_fits_devices("mpi4py", uses_cuda=True, given="mpi")
    with pytest.raises(ValueError, match=r"^torch_dist_backend='NCCL' needs CUDA devices"):
        check_backend_fits_devices("nccl", uses_cuda=False, given="NCCL")


# Without mpi4py, "mpi4py" and "mpi" are refused first for the missing mpi4py (test_mpi_trainer.py), before the range.
_NEEDS_MPI4PY = pytest.mark.skipif(not mpi.is_available(), reason="needs mpi4py: without it, mpi4py is what is named")


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param({"torch_dist_backend": "mpi4py"}, marks=_NEEDS_MPI4PY),
        {"torch_dist_backend": "cpu:mpi4py"},
        pytest.param(
            {"torch_dist_backend": "mpi"},
            marks=[
                _NEEDS_MPI4PY,
                pytest.mark.skipif(
                    dist.is_mpi_available(), reason="this torch has native MPI, which 'mpi' names before the transport"
                ),
            ],
        ),
    ],
)
def test_the_mpi_transport_on_a_torch_older_than_it_needs_fails_at_construction_naming_the_range(monkeypatch, flags):
    monkeypatch.setattr(torch, "__version__", "2.12.0+cu130")
    with pytest.raises(
        RuntimeError,
        match=r"The MPI transport .* needs torch>=2\.13,<2\.15, but this is torch "
        r"2\.12\.0\+cu130.*Upgrade torch \(pip install 'torch>=2\.13,<2\.15'\)",
    ):
        make_trainer(**flags)


def test_a_registered_third_party_backend_is_accepted():
    name = "ldh_test_backend"
    if name not in dist.Backend.backend_list:
        dist.Backend.register_backend(name, lambda *args: None, devices=["cpu"])
    assert make_trainer(torch_dist_backend=name.upper()).torch_dist_backend == name


@both_packages
def test_backend_conflicting_with_the_strategy_is_an_error(package):
    DDPStrategy = package.pl.strategies.DDPStrategy
    with pytest.raises(
        ValueError, match=r"torch_dist_backend='gloo' conflicts with DDPStrategy\(process_group_backend='nccl'\)"
    ):
        make_trainer(package, strategy=DDPStrategy(process_group_backend="nccl"), torch_dist_backend="gloo")


@both_packages
def test_the_same_backend_in_both_places_is_fine(package):
    DDPStrategy = package.pl.strategies.DDPStrategy
    trainer = make_trainer(package, strategy=DDPStrategy(process_group_backend="gloo"), torch_dist_backend="Gloo")
    assert trainer.strategy.process_group_backend == "gloo"


def test_backend_must_be_a_string():
    with pytest.raises(TypeError, match=r"torch_dist_backend must be a string or None, got 3"):
        make_trainer(torch_dist_backend=3)


@pytest.mark.parametrize(
    ("init_method", "message"),
    [
        ("udp://127.0.0.1:1234", r"unknown scheme 'udp'. Use one of: dir://, env://, file://, mpi://, tcp://"),
        ("127.0.0.1:1234", r"has no scheme. Use one of: dir://, env://, file://, mpi://, tcp://"),
        ("tcp://127.0.0.1", r"needs a port between 1 and 65535"),
        ("tcp://127.0.0.1:0", r"needs a port between 1 and 65535"),
        ("tcp://127.0.0.1:99999", r"needs a port between 1 and 65535"),
        ("tcp://127.0.0.1:http", r"needs a port between 1 and 65535"),
        ("tcp://bad_host!:29500", r"'bad_host!' is not a host name or IP address"),
        ("tcp://:29500", r"'' is not a host name or IP address"),
        # .invalid never resolves (RFC 2606): the error comes at construction, not after the store's timeout.
        (
            "tcp://nohost.invalid:29500",
            r"the host 'nohost.invalid' does not resolve on .* \(.+\)\. Give rank 0's IP address",
        ),
        ("env://127.0.0.1:29500", r"env:// takes no address"),
        ("file://relative/rendezvous", r"must be an absolute path, but 'relative/rendezvous' is relative"),
        ("file:rendezvous", r"must be an absolute path, but 'rendezvous' is relative"),
        ("file:///no/such/directory/rendezvous", r"the directory '/no/such/directory' does not exist"),
    ],
)
def test_bad_init_method_names_the_value_and_the_fix(init_method, message):
    with pytest.raises(ValueError, match=re.escape(f"torch_dist_init_method={init_method!r}")) as error:
        make_trainer(torch_dist_init_method=init_method)
    assert re.search(message, str(error.value)), str(error.value)


@pytest.mark.parametrize(
    "init_method", ["env://", "tcp://127.0.0.1:29500", "tcp://[::1]:29500", "tcp://localhost:29500"]
)
def test_good_init_methods_are_kept(init_method):
    assert make_trainer(torch_dist_init_method=init_method).torch_dist_init_method == init_method


@contextmanager
def as_unprivileged_user():
    """Run the body with the effective uid/gid of ``nobody`` when running as root (as CI does), in this process.

    Permissions do not bind root. The real uid stays 0, so ``os.access``, which checks the real uid, still says
    "writable": only a probe that really tries to create a file, as the check must, sees the refusal.
    """
    if os.geteuid() != 0:
        yield
        return
    nobody = pwd.getpwnam("nobody")
    os.setegid(nobody.pw_gid)
    os.seteuid(nobody.pw_uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_file_init_method_in_an_unwritable_directory():
    # Readable and searchable by everyone, writable by its owner only; under /tmp so that nobody can reach it.
    directory = Path(tempfile.mkdtemp(prefix="ldh-unwritable-"))
    try:
        directory.chmod(0o555)
        with as_unprivileged_user():
            assert os.geteuid() != 0 and os.access(directory, os.R_OK | os.X_OK)
            with pytest.raises(ValueError, match=rf"the directory '{directory}' is not writable by this user"):
                make_trainer(torch_dist_init_method=f"file://{directory}/rendezvous")
        assert not list(directory.iterdir()), "the writability probe must not leave files behind"
    finally:
        directory.chmod(0o700)
        shutil.rmtree(directory)


def test_file_init_method_naming_a_directory_gets_a_file_for_this_launch(tmp_path: Path):
    trainer = make_trainer(torch_dist_init_method=f"file://{tmp_path}/")
    assert re.fullmatch(
        rf"file://{tmp_path}/ldh-uid-{os.geteuid()}/ldh-rendezvous-LIGHTNING_DIST_HOOKS_LAUNCH_TOKEN-"
        rf"[0-9a-f]{{32}}-[0-9a-f]{{8}}",
        trainer.torch_dist_init_method,
    )


def test_only_a_trailing_slash_means_one_file_per_launch(tmp_path: Path):
    # Issue 9: a directory someone created at the path of the file must not switch to per-launch files inside it.
    with pytest.raises(
        ValueError,
        match=rf"names '{tmp_path}' \(a directory owned by .*\), not a file. For one file "
        rf"per launch inside it, end the URL with a slash \('file://{tmp_path}/'\)",
    ):
        make_trainer(torch_dist_init_method=f"file://{tmp_path}")


@both_packages
def test_flags_on_a_run_without_a_process_group_warn_that_they_are_ignored_at_the_users_line(package):
    with pytest.warns(
        UserWarning,
        match=r"torch_dist_backend='gloo' .* are ignored: SingleDeviceStrategy creates no "
        r"process group",
    ) as caught:
        package.ours.Trainer(accelerator="cpu", devices=1, strategy="auto", torch_dist_backend="gloo", logger=False)
        line = sys._getframe().f_lineno - 1
    (warning,) = [each for each in caught if "are ignored" in str(each.message)]
    assert (warning.filename, warning.lineno) == (__file__, line), "the warning names the line that made the Trainer"


@pytest.mark.skipif(not TRANSPORT_OFFERED, reason="needs mpi4py and a torch the MPI transport supports")
@pytest.mark.skipif(dist.is_mpi_available(), reason="this torch has native MPI, which 'mpi' names before the transport")
def test_the_ignored_flags_warning_names_the_backend_as_the_user_wrote_it():
    with pytest.warns(
        UserWarning,
        match=r"^torch_dist_backend='mpi' \(the mpi4py transport\) and "
        r"torch_dist_init_method='mpi://' are ignored: SingleDeviceStrategy",
    ):
        make_trainer(devices=1, strategy="auto", torch_dist_backend="mpi")


def test_no_warning_without_flags_on_one_device():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(devices=1, strategy="auto")
    assert not [w for w in caught if "ignored" in str(w.message)]
