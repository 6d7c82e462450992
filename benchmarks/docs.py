"""The documentation's figures come from the committed results, and nowhere else.

A page holds measured figures only inside generated blocks, each rendered from one results file::

    <!-- generated from benchmarks/results/results.json: python -m benchmarks.docs -->
    ... (rewritten by this module) ...
    <!-- end of generated block -->

``python -m benchmarks.docs`` rewrites every block from the files under ``benchmarks/results/``;
``python -m benchmarks.docs --check`` (run by ``tests/test_docs.py``) fails when a block differs from what its file
gives now, or when the prose of a page that reports measurements states a figure of its own (a ratio such as
``1.3x``, a time in µs or ms, a bandwidth) outside those blocks.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import REPO

RESULTS = REPO / "benchmarks" / "results"
BLOCK = re.compile(
    r"<!-- generated from (?P<source>\S+): python -m benchmarks\.docs -->\n"
    r"(?P<body>.*?)<!-- end of generated block -->",
    re.DOTALL,
)
# Pages that report measurements: their prose may describe results, but every figure lives in a generated block.
MEASURING_PAGES = ("README.md", "docs/benchmarks.md", "docs/mpi.md")
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s?(?:µs|us|ms|GB/s|MB/s|MiB/s|GiB/s)|x)(?![\w/])")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _results_report(source: Path, page: Path) -> str:
    from benchmarks import report  # matplotlib: only for this block

    image_dir = Path("..") if page.parent != REPO else Path(".")
    relative = (image_dir / source.parent.relative_to(REPO)).as_posix() + "/"
    return report.markdown(json.loads(source.read_text()), image_dir=relative)


def _scale_report(source: Path, page: Path) -> str:
    from benchmarks import scale_report  # matplotlib: only for this block

    image_dir = Path("..") if page.parent != REPO else Path(".")
    relative = (image_dir / source.parent.relative_to(REPO)).as_posix() + "/"
    return scale_report.markdown(json.loads(source.read_text()), image_dir=relative)


def _scale_summary(source: Path, page: Path) -> str:
    from benchmarks import scale_report  # matplotlib: only for this block

    return scale_report.summary(json.loads(source.read_text()))


def _mpi_store_report(source: Path, page: Path) -> str:
    from benchmarks import mpi_store

    return mpi_store.markdown(json.loads(source.read_text()))


def _mpi_store_summary(source: Path, page: Path) -> str:
    from benchmarks import mpi_store

    return mpi_store.summary(json.loads(source.read_text()))


def _verbatim(source: Path, page: Path) -> str:
    return f"```\n{source.read_text().rstrip()}\n```\n"


RENDERERS: dict[str, Callable[[Path, Path], str]] = {".json": _results_report, ".txt": _verbatim}
# Results files with a layout of their own, by name (before the suffix decides); NAME#VIEW is another view of one.
NAMED_RENDERERS: dict[str, Callable[[Path, Path], str]] = {
    "rendezvous_scale.json": _scale_report,
    "rendezvous_scale.json#summary": _scale_summary,
    "mpi_store.json": _mpi_store_report,
    "mpi_store.json#summary": _mpi_store_summary,
}


def render(source: str, page: Path) -> str:
    """What the block naming ``source`` (a path from the repository root, with ``#VIEW`` for another view) holds on
    ``page``."""
    path = REPO / source.partition("#")[0]
    view = Path(source).name
    if view in NAMED_RENDERERS:
        return NAMED_RENDERERS[view](path, page)
    if "#" in source:
        raise ValueError(f"{page}: no view {view} (known: {', '.join(NAMED_RENDERERS)})")
    if path.suffix not in RENDERERS:
        raise ValueError(f"{page}: no renderer for {source} (known: {', '.join(RENDERERS)})")
    return RENDERERS[path.suffix](path, page)


def rewritten(page: Path) -> str:
    """The page with every generated block rendered afresh."""
    text = page.read_text(encoding="utf-8")
    return BLOCK.sub(
        lambda block: (
            f"<!-- generated from {block.group('source')}: python -m benchmarks.docs -->\n"
            f"{render(block.group('source'), page)}<!-- end of generated block -->"
        ),
        text,
    )


def figures_in_prose(text: str) -> list[str]:
    """Figures stated outside generated blocks and code.

    >>> figures_in_prose("ours is 1.31x gloo's speed, `2 ms` in code, 256 KiB and 15 s are not figures; 7.4 µs is")
    ['1.31x', '7.4 µs']
    """
    return FIGURE.findall(CODE.sub("", BLOCK.sub("", text)))


def problems() -> list[str]:
    """Stale generated blocks and figures in prose, one line each; empty when the pages agree with the results."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        name = page.relative_to(REPO).as_posix()
        if rewritten(page) != page.read_text(encoding="utf-8"):
            found.append(f"{name}: a generated block differs from its results file (run: python -m benchmarks.docs)")
        if name in MEASURING_PAGES:
            found += [
                f"{name}: the prose states {figure!r}; put it in a generated block"
                for figure in figures_in_prose(page.read_text(encoding="utf-8"))
            ]
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.docs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 listing what disagrees")
    if parser.parse_args(argv).check:
        found = problems()
        print("\n".join(found) or "every figure in the documentation comes from benchmarks/results/")
        raise SystemExit(1 if found else 0)
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        page.write_text(rewritten(page), encoding="utf-8")


if __name__ == "__main__":
    main()
