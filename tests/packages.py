"""The two Lightning packages, for tests that run once with each (those that touch Lightning's objects)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import pytest


@dataclass(frozen=True)
class Package:
    """One Lightning package and this project's module for it."""

    name: str  # the --package value of tests/jobs/*.py
    pytorch_module: str
    fabric_module: str
    ours_module: str

    @property
    def pl(self) -> ModuleType:
        """``pytorch_lightning`` or ``lightning.pytorch``."""
        return importlib.import_module(self.pytorch_module)

    @property
    def fabric(self) -> ModuleType:
        return importlib.import_module(self.fabric_module)

    @property
    def ours(self) -> ModuleType:
        """``lightning_dist_hooks`` or ``lightning_dist_hooks.lightning``."""
        return importlib.import_module(self.ours_module)


PYTORCH_LIGHTNING = Package("pytorch_lightning", "pytorch_lightning", "lightning_fabric", "lightning_dist_hooks")
LIGHTNING = Package("lightning", "lightning.pytorch", "lightning.fabric", "lightning_dist_hooks.lightning")
BOTH = (PYTORCH_LIGHTNING, LIGHTNING)

both_packages = pytest.mark.parametrize("package", BOTH, ids=[package.name for package in BOTH])
