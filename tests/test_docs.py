"""The documentation is true of this checkout: what the README and docs/ name exists where a user looks for it (package
files in the installed package, the rest in the checkout or the unpacked sdist that .ci/compat runs these tests
from), every link lands, the README stays short, CI runs the README's commands, and every figure and every claim
about measurements agrees with the committed results in benchmarks/results/."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import statistics
from pathlib import Path

import pytest
from helpers import BOTH, REPO

import lightning_dist_hooks

pytestmark = [pytest.mark.compat, pytest.mark.unit]

PACKAGE_DIR = Path(lightning_dist_hooks.__file__).parent
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 300
NAMED_PATH = re.compile(
    r"(?<![\w/.-])((?:lightning_dist_hooks|examples|benchmarks|tests|docs|\.ci)/(?:[\w./-]*[\w/])?)"
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def named_paths(text: str) -> list[str]:
    """Repository paths a document names, e.g. ``examples/custom_setup_hook.py`` or ``benchmarks/results/``.

    >>> named_paths("see `examples/a.py`, tests/ and lightning_dist_hooks/x.py; not http://h/tests/y.py")
    ['examples/a.py', 'tests/', 'lightning_dist_hooks/x.py']
    """
    return NAMED_PATH.findall(text)


def heading_anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown viewers) give a heading.

    >>> heading_anchor("### `configure_sampler(dataloader, stage)`")
    'configure_samplerdataloader-stage'
    >>> heading_anchor("## MPI without sockets: `torch_dist_backend=\\"mpi\\"` on stock torch")
    'mpi-without-sockets-torch_dist_backendmpi-on-stock-torch'
    """
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {heading_anchor(line) for line in prose.splitlines() if line.startswith("#")}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


def test_every_path_the_docs_name_exists_in_the_installed_package_or_the_checkout():
    named = {page.relative_to(REPO).as_posix(): named_paths(page.read_text(encoding="utf-8")) for page in PAGES}
    assert any(path.startswith("examples/") for path in named["README.md"])
    missing = [
        f"{page}: {path}"
        for page, paths in named.items()
        for path in paths
        if not (
            PACKAGE_DIR / path.removeprefix("lightning_dist_hooks/")
            if path.startswith("lightning_dist_hooks/")
            else REPO / path
        ).exists()
    ]
    assert missing == [], f"the documentation names paths that do not exist: {missing} (package at {PACKAGE_DIR})"


def test_every_relative_link_lands_on_a_file_and_every_anchor_on_a_heading():
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            if not destination.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                broken.append(f"{page.relative_to(REPO)}: {target} (no heading #{anchor} in {destination.name})")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme_and_from_the_docs_index():
    pages = {page.name for page in PAGES if page.parent.name == "docs" and page.name != "README.md"}
    from_readme = {Path(target.partition("#")[0]).name for target in links(README) if target.startswith("docs/")}
    from_index = {target.partition("#")[0] for target in links(REPO / "docs" / "README.md")}
    assert pages - from_readme == set() and pages - from_index == set()


def test_the_readme_is_short_enough_to_read_in_ten_minutes():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference material to docs/"


def _quick_start_commands() -> list[str]:
    section = README.read_text(encoding="utf-8").split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "README.md's Quick start has no bash block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_quick_start_is_two_commands_and_ci_runs_its_test_command():
    install_and_train, test = _quick_start_commands()
    assert install_and_train.startswith("bash .ci/install && ") and "examples/" in install_and_train
    ci_run = (REPO / ".ci" / "run").read_text().replace("\\\n", " ")
    commands = []
    for line in ci_run.splitlines():
        if not line.startswith("#"):
            words = shlex.split(line.split("||")[0].strip().removesuffix("&"))
            # Variables set for the command alone (VAR=value command ...) are not part of it.
            commands.append(list(itertools.dropwhile(lambda word: re.fullmatch(r"[A-Z_]+=\S*", word), words)))
    assert shlex.split(test) in commands, f"CI (.ci/run) does not run the README's test command {test!r}"


def test_every_figure_in_the_docs_comes_from_the_committed_results():
    from benchmarks import docs

    assert docs.problems() == []


def _scale_seconds(label: str, size: str) -> list[float]:
    """Bootstrap seconds of ``label`` at ``size`` ranks, one per repetition (benchmarks.bootstrap's run)."""
    return _results("rendezvous_scale.json")["methods"][label][size]["seconds"]


def _scale_ratio(label: str, against: str, size: str) -> float:
    """Median bootstrap seconds of ``label`` over ``against``'s at ``size`` ranks."""
    return statistics.median(_scale_seconds(label, size)) / statistics.median(_scale_seconds(against, size))


def _results(name: str) -> dict:
    return json.loads((REPO / "benchmarks" / "results" / name).read_text())


def _mpi_run() -> dict:
    return _results("mpi_allreduce.json")


def _ratio_interval_includes_one(variant: dict) -> bool:
    low, high = variant["ratio_to_lightning"]["ci95"]
    return low <= 1 <= high


# Each sentence the benchmark page states in bold, and what it says of the committed results.
CLAIMS = {
    "Every paired ratio of our three variants to Lightning's Trainer has a 95 % interval that includes 1": lambda: all(
        _ratio_interval_includes_one(_results("results.json")["step_overhead"]["variants"][variant])
        for variant in ("ours_default", "ours_file", "ours_hooks")
    ),
    "`file://` was no slower than `env://` at any world size measured": lambda: all(
        stats["median"] <= _results("results.json")["bootstrap"]["latency_ms"]["env://"][size]["median"]
        for size, stats in _results("results.json")["bootstrap"]["latency_ms"]["file://"].items()
    ),
    "The mpi4py backend is faster than gloo at every all-reduce size measured": lambda: all(
        row["ours_speed_relative_to"]["gloo"] > 1
        for run in (_mpi_run(), _results("results.json")["mpi_allreduce"])
        for row in run["allreduce"]
    ),
    "Lightning's `sync_dist` pattern runs at more than ten times gloo's speed": lambda: (
        _mpi_run()["sync_dist_step"]["ours_speed_relative_to"]["gloo"] > 10
    ),
    "The DDP training step is faster on the mpi4py backend than on gloo": lambda: (
        _mpi_run()["ddp_step"]["ours_speed_relative_to"]["gloo"] > 1
        and _mpi_run()["ddp_backward_tail"]["median_seconds"]["mpi4py backend"]
        < _mpi_run()["ddp_backward_tail"]["median_seconds"]["gloo"]
    ),
    "DDP's completion route (the work's future) costs at most 1.25 times the blocking call at every size": lambda: all(
        row["time_relative_to_blocking"]["async_op, future (DDP's route)"] <= 1.25
        for row in _mpi_run()["completion_routes"]
    ),
    "With the eager set-up `dir://` was faster than raw `FileStore` at 512 ranks": lambda: (
        _scale_ratio("dir://", "FileStore", "512") < 1
    ),
    "with the eager set-up the median of `dir://` lay within the range of raw `FileStore`'s repetitions at 128 and "
    "256 ranks": lambda: all(
        min(_scale_seconds("FileStore", size))
        <= statistics.median(_scale_seconds("dir://", size))
        <= max(_scale_seconds("FileStore", size))
        for size in ("128", "256")
    ),
    "With gloo's lazy set-up `dir://` was faster than raw `FileStore` at 512 ranks": lambda: (
        _scale_ratio("dir:// lazy", "FileStore lazy", "512") < 1
    ),
    "`dir://`'s operations per rank grew linearly with the world size": lambda: (
        lambda ratios: max(ratios) < 1.5 * min(ratios)
    )(
        [
            statistics.median([each["median"] for each in samples["operations"]]) / int(size)
            for size, samples in _results("rendezvous_scale.json")["methods"]["dir://"].items()
            if int(size) >= 32
        ]
    ),
    "From 4 MiB on, ours is within 5 % of a raw `MPI_Allreduce` on the same memory": lambda: all(
        row["ours_speed_relative_to"]["raw, torch memory"] >= 0.95
        for row in _mpi_run()["allreduce"]
        if row["bytes"] >= 4 << 20
    ),
}


@pytest.mark.parametrize("claim", CLAIMS)
def test_what_the_benchmark_page_claims_holds_in_the_committed_results(claim):
    page = " ".join((REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    assert f"**{claim}" in page, f"docs/benchmarks.md no longer states: {claim}"
    assert CLAIMS[claim](), f"docs/benchmarks.md states {claim!r}, which benchmarks/results/ no longer shows"


def test_the_flags_docs_the_hook_and_both_trainers_list_every_registered_scheme_and_transport():
    """What ``--help``, LightningCLI and the docstrings say about the flags is written from the registries."""
    from lightning_dist_hooks import init_methods, mpi, transports
    from lightning_dist_hooks.flag_docs import FLAG_DOCS
    from lightning_dist_hooks.hooks import DistributedHooksMixin

    schemes = [f'"{scheme}://' for scheme in init_methods.registered_schemes()]
    assert {"env", "tcp", "file", "dir", "mpi"} <= {scheme[1:-3] for scheme in schemes}
    assert DistributedHooksMixin.setup_distributed_backend.__doc__
    hook_doc = " ".join(DistributedHooksMixin.setup_distributed_backend.__doc__.split())
    for package in BOTH:
        trainer_doc = " ".join(package.ours.Trainer.__init__.__doc__.split())
        fabric_doc = " ".join(package.ours.Fabric.__init__.__doc__.split())
        for document in (FLAG_DOCS["torch_dist_init_method"], trainer_doc, fabric_doc, hook_doc):
            missing = [scheme for scheme in schemes if scheme not in document]
            assert not missing, (missing, document[:400])
        for document in (FLAG_DOCS["torch_dist_backend"], trainer_doc, fabric_doc):
            assert f'"{mpi.BACKEND_NAME}"' in document and '"gloo"' in document
            missing = [
                transport.names[0]
                for transport in transports.registered_transports()
                if f'"{transport.names[0]}"' not in document
            ]
            assert not missing, (missing, document[:400])


FLAGS_TABLE = re.compile(
    r"<!-- generated by lightning_dist_hooks\.flag_docs\.flags_table\(\), checked by tests/test_docs\.py -->\n"
    r"(.*?)<!-- end of generated block -->",
    re.DOTALL,
)


@pytest.mark.parametrize("page", ["README.md", "docs/reference.md"])
def test_the_flags_table_is_the_one_written_from_the_registries(page):
    """The table a user reads first says what ``--help`` says: every registered scheme, the transport."""
    from lightning_dist_hooks.flag_docs import flags_table

    blocks = FLAGS_TABLE.findall((REPO / page).read_text(encoding="utf-8"))
    assert len(blocks) == 1, f"{page} must hold the flags' table once, between its markers"
    assert blocks[0] == flags_table(), f"{page}'s flags table is stale; put this between its markers:\n{flags_table()}"
    for form in ('`"dir:///PATH"`', '`"mpi://"`', '`"mpi4py"`'):
        assert form in blocks[0]
