"""One rank of 2 that joins a gloo group, all-reduces once and exits at once: the pattern that can abort a rank that
finished, in the interpreter's teardown (see ``lightning_dist_hooks.process_group.exit_grace``).

    python last_collective_job.py RANK INIT_METHOD [--grace]
"""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist

from lightning_dist_hooks.process_group.exit_grace import hand_the_gil_to_backend_threads_at_exit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rank", type=int)
    parser.add_argument("init_method")
    parser.add_argument("--grace", action="store_true", help="what every rank of our Trainer and Fabric does")
    args = parser.parse_args()
    if args.grace:
        hand_the_gil_to_backend_threads_at_exit()
    dist.init_process_group(
        "gloo", init_method=args.init_method, rank=args.rank, world_size=2, timeout=timedelta(seconds=60)
    )
    dist.all_reduce(torch.tensor([1, 2]))


if __name__ == "__main__":
    main()
