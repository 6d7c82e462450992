"""The all-reduce every rank ran after the rendezvous summed correctly: the backend and network carry data intact.

A rendezvous that forms proves the ranks can meet, not that a collective returns the right numbers; a wrong sum
points at the backend or the network corrupting data, which nothing else the doctor checks would show.
"""

from __future__ import annotations

from typing import Any

from lightning_dist_hooks.doctor.checks.verdict import FAIL, OK, Verdict


def check_allreduce(ranks: list[dict[str, Any]]) -> Verdict:
    wrong = [rank["rank"] for rank in ranks if not rank["allreduce"]["correct"]]
    if wrong:
        return Verdict(
            "all-reduce",
            FAIL,
            f"the all-reduce gave a wrong sum on ranks {wrong}",
            "report this with the doctor's --json output: the backend or the network corrupts data",
        )
    return Verdict("all-reduce", OK, "the all-reduce sums correctly on every rank")
