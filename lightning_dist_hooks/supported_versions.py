"""The releases this package is tested with: setup.py's requirements and the first-use warning both read them here.

docs/compatibility.md says which combinations CI runs and which ends were run once by hand.
``setup.py`` runs this file on its own, before torch may be installed, so it imports only the standard library
at the top.

>>> SUPPORTED["pytorch-lightning"] == SUPPORTED["lightning"]
True
>>> from packaging.specifiers import SpecifierSet
>>> "2.13.0+cpu" in SpecifierSet(SUPPORTED["torch"])
True
"""

from __future__ import annotations

import warnings
from importlib.metadata import PackageNotFoundError, version

PYTHON = ">=3.10,<3.14"

# 2.14.1: the newest torch on the CI machine's disk; the next minor is allowed only once CI runs it.
_TORCH_BELOW = "<2.15"

SUPPORTED = {
    # The oldest torch whose fast subset passed (docs/compatibility.md): with 2.5 and 2.4 a Fabric job hangs.
    "torch": ">=2.6," + _TORCH_BELOW,
    # 2.4 added ModelParallelStrategy, which _lightning_internals.py names. Both packages release in lockstep.
    "pytorch-lightning": ">=2.4,<2.7",
    "lightning": ">=2.4,<2.7",
    # 4.0: the MPI transport wraps tensor memory with ``MPI.buffer`` (3.x called it ``MPI.memory``).
    "mpi4py": ">=4.0,<5",
}

# The MPI transport's own lower end: torch 2.13 is the first release whose Python process groups receive
# all_to_all_single, all_gather_single and reduce_scatter_single (older ones send them to a C++ default that has no
# CPU backend for such a group). lightning_dist_hooks.mpi.register() refuses an older torch, naming this range.
MPI_TRANSPORT_TORCH = ">=2.13," + _TORCH_BELOW

# The distributions already compared with SUPPORTED in this process: one warning each, at most.
_CHECKED: set[str] = set()


def installed_version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def warn_if_untested(distribution: str, installed: str | None = None) -> None:
    """Warn once per process, naming the tested range and the fix, when ``distribution`` is installed outside it.

    Called where the package first uses each dependency; ``installed`` defaults to the installed version.
    """
    if distribution in _CHECKED:
        return
    _CHECKED.add(distribution)
    installed = installed or installed_version(distribution)
    if installed is None:
        return
    from packaging.specifiers import SpecifierSet  # a dependency of Lightning and of setuptools

    tested = SUPPORTED[distribution]
    if not SpecifierSet(tested).contains(installed, prereleases=True):
        warnings.warn(
            f"lightning_dist_hooks was tested with {distribution}{tested}, but {installed} is installed. What it "
            f"relies on there may have changed: install pip install '{distribution}{tested}', or a "
            f"lightning-dist-hooks release tested with {distribution} {installed}.",
            stacklevel=3,
        )
