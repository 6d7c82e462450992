"""The doctor's name for :mod:`lightning_dist_hooks.verdict`: each check module imports the verdict from here, and
the checks package re-exports it, without an import cycle."""

from lightning_dist_hooks.verdict import FAIL, OK, WARN, Verdict, merge

__all__ = ["FAIL", "OK", "WARN", "Verdict", "merge"]
