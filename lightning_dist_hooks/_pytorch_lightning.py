"""This package's classes for ``pytorch_lightning`` + ``lightning_fabric`` (pip ``pytorch-lightning``).

Imported on first use of ``lightning_dist_hooks.Trainer``, ``.LightningModule`` or ``.Fabric``; users import
those names from ``lightning_dist_hooks``.
"""

from lightning_dist_hooks._flavoured import classes_for
from lightning_dist_hooks._lightning_internals import PYTORCH_LIGHTNING

_classes = classes_for(PYTORCH_LIGHTNING, __name__)
Trainer = _classes.Trainer
LightningModule = _classes.LightningModule
Fabric = _classes.Fabric
SamplerHookDataConnector = _classes.SamplerHookDataConnector
