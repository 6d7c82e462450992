"""The classes a user imports, made once for each Lightning package from the same package-neutral mixins."""

from __future__ import annotations

from types import SimpleNamespace

from lightning_dist_hooks._lightning_internals import Flavour
from lightning_dist_hooks.environments import register_with
from lightning_dist_hooks.fabric import DistributedHooksFabricMixin
from lightning_dist_hooks.hooks import DistributedHooksMixin
from lightning_dist_hooks.sampling import sampler_hook_data_connector
from lightning_dist_hooks.trainer import DistributedHooksTrainerMixin


def classes_for(flavour: Flavour, module: str) -> SimpleNamespace:
    """``Trainer``, ``LightningModule``, ``Fabric`` and ``SamplerHookDataConnector`` of ``flavour``, in ``module``.

    ``module`` must bind them under these names: pickling (``ddp_spawn``) finds classes by module and name.
    """
    register_with(flavour)
    package = flavour.pytorch

    # Each base is the flavour's class, chosen at run time: no type checker follows it (hence the ignores).
    class Trainer(DistributedHooksTrainerMixin, flavour.Trainer):  # type: ignore[name-defined]  # a base chosen at run time
        pass

    class LightningModule(DistributedHooksMixin, flavour.LightningModule):  # type: ignore[name-defined]  # a base chosen at run time
        pass

    class Fabric(DistributedHooksFabricMixin, flavour.Fabric):  # type: ignore[name-defined]  # a base chosen at run time
        pass

    Trainer.__doc__ = f"""``{package}.Trainer`` with ``torch_dist_backend``, ``torch_dist_init_method`` and the hooks.

    Example::

        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp",
                          torch_dist_backend="gloo", torch_dist_init_method="file:///shared/run42/rdzv")
        trainer.fit(model)
    """
    LightningModule.__doc__ = f"``{package}.LightningModule`` with the two distributed hooks and their defaults."
    Fabric.__doc__ = f"``{flavour.fabric}.Fabric`` with the Trainer's flags and a ``setup_distributed_backend``."
    made = SimpleNamespace(
        Trainer=Trainer,
        LightningModule=LightningModule,
        Fabric=Fabric,
        SamplerHookDataConnector=sampler_hook_data_connector(flavour, module),
    )
    for name, cls in vars(made).items():
        made_as = cls.__qualname__  # "classes_for.<locals>.Trainer"; its generated methods are named after it
        cls.__module__, cls.__qualname__ = module, name
        for attribute in vars(cls).values():
            if getattr(attribute, "__qualname__", "").startswith(f"{made_as}."):
                attribute.__module__ = module
                attribute.__qualname__ = name + attribute.__qualname__.removeprefix(made_as)
    return made
