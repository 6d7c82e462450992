"""Prints, as JSON, how long ``import pytorch_lightning`` and then ``import lightning_dist_hooks`` take here."""

import json
import time

started = time.perf_counter()
import pytorch_lightning  # noqa: E402,F401  (imported first: the time we report is what ours adds on top)

lightning_done = time.perf_counter()
import lightning_dist_hooks  # noqa: E402,F401

print(
    json.dumps(
        {
            "pytorch_lightning_s": lightning_done - started,
            "lightning_dist_hooks_s": time.perf_counter() - lightning_done,
        }
    )
)
