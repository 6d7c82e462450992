"""What the README names exists where a user looks for it: package files in the installed package, the rest in the
checkout (or the unpacked sdist that .ci/compat runs these tests from)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lightning_dist_hooks
from helpers import REPO

pytestmark = pytest.mark.compat

PACKAGE_DIR = Path(lightning_dist_hooks.__file__).parent
README = REPO / "README.md"
NAMED_PATH = re.compile(r"(?<![\w/.-])((?:lightning_dist_hooks|examples|benchmarks|tests|\.ci)/(?:[\w./-]*[\w/])?)")


def named_paths(text: str) -> list[str]:
    """Repository paths a document names, e.g. ``examples/custom_setup_hook.py`` or ``benchmarks/results/``.

    >>> named_paths("see `examples/a.py`, tests/ and lightning_dist_hooks/x.py; not http://h/tests/y.py")
    ['examples/a.py', 'tests/', 'lightning_dist_hooks/x.py']
    """
    return NAMED_PATH.findall(text)


def test_every_path_the_readme_names_exists_in_the_installed_package_or_the_checkout():
    named = named_paths(README.read_text(encoding="utf-8"))
    assert any(path.startswith("examples/") for path in named) and any(path.startswith("lightning_dist_hooks/")
                                                                       for path in named)
    missing = [path for path in named if not (
        PACKAGE_DIR / path.removeprefix("lightning_dist_hooks/") if path.startswith("lightning_dist_hooks/")
        else REPO / path).exists()]
    assert missing == [], f"README.md names paths that do not exist: {missing} (package at {PACKAGE_DIR})"
