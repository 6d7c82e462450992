"""``python -m lightning_dist_hooks doctor`` (or ``lightning-dist-hooks-doctor``): why is my job stuck?

Start it exactly like the training job, with the same flags::

    srun -N 2 --ntasks-per-node=4 python -m lightning_dist_hooks doctor --devices 4 --num-nodes 2 \\
        --init-method file:///shared/rdzv/
    python -m lightning_dist_hooks doctor --devices 2          # Lightning's own launcher

Every rank meets the others through the real rendezvous, checks an all-reduce, and rank 0 prints one table and a
verdict with its fix for each known problem. The exit code is 1 when a check failed. See ``doctor.command``.
"""

from lightning_dist_hooks.doctor.command import main

__all__ = ["main"]
