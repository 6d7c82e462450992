"""The bootstrap plan (issue 31): one frozen value from the flags to each rank, the two contracts of a scheme handler,
torch's rendezvous registry touched once per scheme, and failures announced to the registered transports rather than
imported."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch.distributed as dist
from lightning_fabric.plugins.environments import LightningEnvironment

from lightning_dist_hooks import strategy, torch_rendezvous, transports
from lightning_dist_hooks.bootstrap_plan import BootstrapPlan, Flags, InitMethodURL
from lightning_dist_hooks.init_methods import (
    InitMethod,
    Rendezvous,
    RendezvousDiagnostics,
    _base,
    diagnostics_of,
    init_method_handler,
    prepare_rendezvous,
    register_init_method,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(_base, "_REGISTRY", dict(_base._REGISTRY))
    return _base._REGISTRY


def test_the_flags_are_checked_once_before_lightning_builds_anything(tmp_path):
    flags = Flags.checked("GLOO", f"file://{tmp_path}/")
    assert (flags.backend, flags.backend_as_given, flags.init_method) == (
        "gloo",
        "GLOO",
        InitMethodURL(given=f"file://{tmp_path}/", resolved=f"file://{tmp_path}/"),
    )
    assert flags.backend_flag == "torch_dist_backend='GLOO'"
    assert Flags.checked(None, None).is_default
    with pytest.raises(ValueError, match=r"torch_dist_init_method='nope://x' has an unknown scheme 'nope'"):
        Flags.checked("gloo", "nope://x")


def test_the_init_method_is_resolved_for_the_launch_and_says_where_the_ranks_meet(tmp_path):
    given = InitMethodURL.validated(f"file://{tmp_path}/")
    resolved = given.resolved_for(LightningEnvironment(), num_nodes=1)
    assert resolved.given == f"file://{tmp_path}/" and resolved.resolved.startswith(f"file://{tmp_path}/ldh-")
    assert resolved.location.startswith(f"file://{tmp_path}/ldh-uid-")
    assert resolved.handler is init_method_handler("file://")


def test_a_pickled_plan_uses_the_handler_registered_in_the_process_it_lands_in(registry):
    class Named(InitMethod):
        scheme = "named"

    plan = BootstrapPlan(Flags.checked("gloo", None), creates_process_group=True)
    register_init_method(Named())
    named = BootstrapPlan(Flags(backend="gloo", init_method=InitMethodURL.validated("named://x")), True)
    copy = pickle.loads(pickle.dumps(named))
    assert copy == named and copy.init_method.handler is registry["named"]
    replacement = Named()
    register_init_method(replacement, replace=True)
    assert copy.init_method.handler is replacement, "looked up, not carried"
    assert plan.init_method.given == "env://" and plan.location is None, "Lightning's default, reported as None"


def test_takes_over_only_with_a_flag_or_a_hook():
    default = BootstrapPlan(Flags(), creates_process_group=True)
    assert not default.takes_over(None)
    assert default.takes_over(lambda *args: None)
    assert BootstrapPlan(Flags(), True, setup_distributed_backend=lambda *args: None).takes_over(None)
    assert BootstrapPlan(Flags(backend="gloo"), True).takes_over(None)


def test_the_doctor_asks_a_handler_the_questions_it_answers_and_assumes_the_defaults_for_the_rest():
    class OnlyAnAddress(InitMethod):
        scheme = "address"

        def main_address(self, url):
            return "10.0.0.1", 29500

    answers = diagnostics_of(OnlyAnAddress())
    assert answers.main_address("address://") == ("10.0.0.1", 29500)
    assert answers.rank_zero_listens("address://"), "the default asks main_address: the handler's"
    assert (answers.meeting_path("address://"), answers.shared_directory("address://")) == (None, None)
    assert not answers.needs_file_locks

    class Diagnosed(InitMethod, RendezvousDiagnostics):
        scheme = "diagnosed"
        needs_file_locks = True

    handler = Diagnosed()
    assert diagnostics_of(handler) is handler
    assert diagnostics_of(init_method_handler("file://")).meeting_path("file:///shared/run42") == Path("/shared/run42")


def test_a_schemes_torch_handler_is_registered_once_before_its_first_rendezvous(registry, monkeypatch):
    registered = []
    monkeypatch.setattr(dist, "register_rendezvous_handler", lambda scheme, handler: registered.append(scheme))
    monkeypatch.setattr(torch_rendezvous, "_registered", set())

    def hand_out(url, **kwargs):
        yield from ()

    class Own(InitMethod):
        scheme = "own"

        def torch_rendezvous_handler(self):
            return hand_out

    handler = Own()
    register_init_method(handler)
    assert registered == [], "registering a scheme with us changes nothing in torch yet"
    assert prepare_rendezvous(handler, "own://x", LightningEnvironment()) == Rendezvous("own://x")
    prepare_rendezvous(handler, "own://y", LightningEnvironment())
    assert registered == ["own"]


def test_a_scheme_another_package_holds_in_torch_is_refused_naming_it(monkeypatch):
    def taken(scheme, handler):
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")

    monkeypatch.setattr(dist, "register_rendezvous_handler", taken)
    monkeypatch.setattr(torch_rendezvous, "_registered", set())
    with pytest.raises(RuntimeError, match=r"another package registered .* for dir://, .* Use file:// instead"):
        torch_rendezvous.register_once("dir", lambda url, **kwargs: iter(()), "Use file:// instead.")


def test_the_mpi_transport_hears_of_failures_without_the_strategy_importing_it():
    from lightning_dist_hooks.mpi import _abort

    transports.announce_failure(RuntimeError("boom"))
    try:
        assert _abort.failure_recorded()
    finally:
        transports.announce_run_started()
    assert not _abort.failure_recorded()
    strategy_source = Path(strategy.__file__).read_text()
    assert "mpi" not in strategy_source.lower()
