"""lightning_dist_hooks for the unified ``lightning`` package (``import lightning as L``): change one import::

    from lightning_dist_hooks.lightning import Trainer  # instead of: from lightning import Trainer

``Trainer``, ``LightningModule`` and ``Fabric`` here subclass ``lightning.pytorch.Trainer``,
``lightning.pytorch.LightningModule`` and ``lightning.fabric.Fabric``, and accept that package's modules,
strategies, callbacks and plugins. Importing this module imports ``lightning`` and never ``pytorch_lightning``
or ``lightning_fabric``. Everything else (environments, hooks, errors) is the same object as in
``lightning_dist_hooks`` and is re-exported here for one-import convenience.
"""

import lightning_dist_hooks as _package
from lightning_dist_hooks._flavoured import classes_for
from lightning_dist_hooks._lightning_internals import LIGHTNING

_classes = classes_for(LIGHTNING, __name__)
Trainer = _classes.Trainer
LightningModule = _classes.LightningModule
Fabric = _classes.Fabric
SamplerHookDataConnector = _classes.SamplerHookDataConnector

# The rest is taken from the package's own exports, so this module never lags behind them.
_SHARED = [name for name in _package.__all__ if name not in _package.PER_PACKAGE_CLASSES]
globals().update({name: getattr(_package, name) for name in _SHARED})

__all__ = ["Fabric", "LightningModule", "Trainer"]  # this module's own, as in PER_PACKAGE_CLASSES
__all__ += _SHARED  # noqa: PLE0605 (built from the package's __all__ above)
