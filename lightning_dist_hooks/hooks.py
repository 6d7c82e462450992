"""The two LightningModule hooks, their documented defaults, and how the Trainer finds a user's override.

Hooks are found by name, so any LightningModule (of either Lightning package) can define them; inheriting
:class:`DistributedHooksMixin` (or ``lightning_dist_hooks.LightningModule``) only adds the defaults and their type
hints. This module imports no Lightning package: the mixin serves both.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from datetime import timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

import torch
import torch.distributed
from torch.utils.data import DataLoader, Sampler
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks import _lightning_internals

if TYPE_CHECKING:
    from lightning_dist_hooks._lightning_internals import RunningStage, Trainer


def default_setup_distributed_backend(
    backend: str,
    init_method: str,
    rank: int,
    world_size: int,
    timeout: timedelta,
    device_id: torch.device | None = None,
) -> None:
    """What ``setup_distributed_backend`` does unless overridden: exactly one ``init_process_group`` call, with the
    arguments Lightning passes (``device_id`` binds an NCCL group to the rank's GPU; None on CPU).

    Its parameters are the hook's one definition: the mixin's method, the doctor's override, the checks and their
    messages take them from here (:func:`taking_parameters_of`, :func:`expected_parameters`)."""
    torch.distributed.init_process_group(
        backend=backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
    )


_Parameters = ParamSpec("_Parameters")


def taking_parameters_of(
    function: Callable[_Parameters, None],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, _Parameters], None]]:
    """Declare a method written ``(self, *args, **kwargs)`` as taking ``function``'s parameters after ``self``: what
    ``inspect.signature``, ``help()``, the hook checks and type checkers see. So an override of a hook need not write
    its signature again; :func:`setup_arguments` reads the arguments it received by name.

    >>> class Module:
    ...     @taking_parameters_of(default_setup_distributed_backend)
    ...     def setup_distributed_backend(self, *args, **kwargs):
    ...         pass
    >>> inspect.signature(Module.setup_distributed_backend)
    <Signature (self, backend: 'str', init_method: 'str', rank: 'int', world_size: 'int', timeout: 'timedelta', \
device_id: 'torch.device | None' = None) -> 'None'>
    """
    signature = inspect.signature(function)
    annotations = typing.get_type_hints(function)

    def declare(method: Callable[..., None]) -> Callable[Concatenate[Any, _Parameters], None]:
        self_parameter = next(iter(inspect.signature(method).parameters.values()))
        # inspect.signature() reads __signature__, an attribute functions do not declare (hence the ignore).
        method.__signature__ = signature.replace(  # type: ignore[attr-defined]  # see above
            parameters=[self_parameter, *signature.parameters.values()]
        )
        method.__annotations__ = annotations
        return method

    return declare


def setup_arguments(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The arguments of one ``setup_distributed_backend`` call by parameter name, defaults included.

    >>> setup_arguments("gloo", "env://", 0, 2, timedelta(seconds=5))["device_id"] is None
    True
    """
    bound = inspect.signature(default_setup_distributed_backend).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def takes_device_id(hook: Callable[..., Any]) -> bool:
    """Whether ``hook`` accepts ``device_id``: hooks written with the five-argument signature are called without it.

    >>> takes_device_id(default_setup_distributed_backend)
    True
    >>> takes_device_id(lambda backend, init_method, rank, world_size, timeout: None)
    False
    """
    parameters = inspect.signature(hook).parameters.values()
    return any(p.name == "device_id" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


SETUP_HOOK = "setup_distributed_backend"
SAMPLER_HOOK = "configure_sampler"
_ALSO_ACCEPTED = {
    SETUP_HOOK: "the five-argument form without device_id, *args and **kwargs work too",
    SAMPLER_HOOK: "*args and **kwargs work too",
}


class _Placeholder:
    """Stands for an argument of a hook call in :func:`hook_call_problem`: only its position and name matter."""

    def __init__(self, name: str) -> None:
        self.name = name

    @override
    def __repr__(self) -> str:
        return f"<{self.name}>"


def hook_call_problem(name: str, hook: object) -> str | None:
    """Why ``hook`` cannot be called the way each rank calls hook ``name``, or None where it can (or where its
    signature cannot be read, as for some builtins).

    The arguments are bound exactly as the rank passes them: ``setup_distributed_backend`` gets five positional
    arguments, plus ``device_id=`` where :func:`takes_device_id`; ``configure_sampler`` gets two positional ones.

    >>> hook_call_problem("setup_distributed_backend", lambda backend, init_method, rank, world_size, timeout: None)
    >>> hook_call_problem("setup_distributed_backend", lambda *args, **kwargs: None)
    >>> hook_call_problem("configure_sampler", lambda dataloader: None)
    'too many positional arguments'
    """
    if not callable(hook):
        return f"it is not callable but {type(hook).__name__}"
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):  # no signature to read: nothing to check before the call
        return None
    arguments = [_Placeholder(parameter.name) for parameter in hook_parameters(name)]
    keywords = {}
    if name == SETUP_HOOK:
        *arguments, device_id = arguments
        if takes_device_id(hook):
            keywords["device_id"] = device_id
    try:
        signature.bind(*arguments, **keywords)
    except TypeError as error:
        return str(error)
    return None


def _found_signature(owner: type | None, name: str, hook: object) -> str:
    """How the user wrote ``name``: the function as defined on its class (``self`` included), else the callable's."""
    defined = inspect.getattr_static(owner, name, None) if owner is not None else None
    target = defined.__func__ if isinstance(defined, (staticmethod, classmethod)) else defined
    shown = target if callable(target) else hook
    try:
        return f"{name}{inspect.signature(shown)}" if callable(shown) else f"{name}(...)"
    except (TypeError, ValueError):
        return f"{name}(...)"


def _class_name(cls: type) -> str:
    """``cls``'s qualified name, without the ``f.<locals>.`` of a class defined in a function."""
    return cls.__qualname__.rsplit("<locals>.", 1)[-1]


def check_hook(owner: object, name: str, where: str) -> None:
    """Raise ``TypeError`` when ``owner``'s override of hook ``name`` cannot take the arguments every rank will pass.

    Called in the launching process, before any process starts, so that a wrong signature is one message here
    rather than one traceback per rank once the job has left the queue.
    """
    hook = user_hook(owner, name)
    if hook is None:
        return
    problem = hook_call_problem(name, hook)
    if problem is None:
        return
    defining = next((cls for cls in type(owner).__mro__ if name in cls.__dict__), type(owner))
    inherited = "" if defining is type(owner) else f" (inherited by {_class_name(type(owner))})"
    raise TypeError(
        f"{_class_name(defining)}.{name}{inherited} is declared as {_found_signature(type(owner), name, hook)}, "
        f"which cannot take the arguments every rank passes it ({problem}). Declare it as "
        f"{name}(self, {expected_parameters(name)}) ({_ALSO_ACCEPTED[name]}). Checked at {where}, before any "
        "process starts."
    )


def check_hooks(module: object, datamodules: Iterable[object], where: str, creates_process_group: bool) -> None:
    """Check the hooks of the LightningModule ``module`` that will be called (``setup_distributed_backend`` only where
    the strategy ``creates_process_group``: elsewhere a method of that name is the module's own business) and
    ``configure_sampler`` of each datamodule (of any object given to ``fit``/``validate``/``test``/``predict``
    besides the module: only those defining the hook count). Raise ``TypeError`` on the first one that cannot be
    called as each rank will call it."""
    if creates_process_group:
        check_hook(module, SETUP_HOOK, where)
    check_hook(module, SAMPLER_HOOK, where)
    for datamodule in datamodules:
        if datamodule is not module:
            check_hook(datamodule, SAMPLER_HOOK, where)


def check_setup_callable(hook: Callable[..., Any] | None, where: str) -> None:
    """Raise ``TypeError`` when Fabric's ``setup_distributed_backend=`` callable cannot take the arguments every
    rank passes it (see :func:`hook_call_problem`)."""
    if hook is None:
        return
    problem = hook_call_problem(SETUP_HOOK, hook)
    if problem is None:
        return
    qualified_name = getattr(hook, "__qualname__", None)
    shown = qualified_name.rsplit("<locals>.", 1)[-1] if isinstance(qualified_name, str) else _class_name(type(hook))
    raise TypeError(
        f"setup_distributed_backend={shown} is declared as {_found_signature(None, SETUP_HOOK, hook)}, which "
        f"cannot take the arguments every rank passes it ({problem}). Declare it as "
        f"{SETUP_HOOK}({expected_parameters(SETUP_HOOK)}) ({_ALSO_ACCEPTED[SETUP_HOOK]}). Checked at {where}, before "
        "any process starts."
    )


class Stage(str):
    """What ``configure_sampler`` receives as ``stage``: ``"train"``, ``"validate"``, ``"test"`` or ``"predict"``.

    A ``str`` that prints as its value, and stands for Lightning's ``RunningStage`` wherever code compares or looks
    at one: it equals the member (and the plain value, case-insensitively, as the member does), hashes alike, and
    has the member's attributes (``value``, ``name``, ``evaluating``, ``dataloader_prefix``); ``running_stage``
    is the member itself. Only ``is`` and ``isinstance(stage, RunningStage)`` tell them apart.

    >>> from enum import Enum
    >>> class RunningStage(str, Enum):  # stands for Lightning's here
    ...     TRAINING = "train"
    >>> stage = Stage(RunningStage.TRAINING)
    >>> print(stage)
    train
    >>> f"{stage}", stage == RunningStage.TRAINING, RunningStage.TRAINING == stage, stage.value, stage.name
    ('train', True, True, 'train', 'TRAINING')
    """

    running_stage: Any

    def __new__(cls, running_stage: Enum) -> Stage:
        stage = super().__new__(cls, running_stage.value)
        stage.running_stage = running_stage
        return stage

    @override
    def __eq__(self, other: object) -> bool:
        return bool(self.running_stage == other)

    @override
    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__  # the value's hash, as RunningStage's (its values are lower-case)

    def __getattr__(self, name: str) -> Any:
        running_stage = self.__dict__.get("running_stage")
        if running_stage is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(running_stage, name)

    @override
    def __reduce__(self) -> tuple[type[Stage], tuple[Enum]]:
        return Stage, (self.running_stage,)


def as_running_stage(stage: Any) -> Any:
    """Lightning's ``RunningStage`` for a :class:`Stage`; anything else as it is."""
    return stage.running_stage if isinstance(stage, Stage) else stage


def lightning_default_sampler(trainer: Trainer, dataloader: DataLoader, stage: RunningStage) -> Sampler | None:
    """The sampler Lightning's Trainer would give ``dataloader`` today, or None where it keeps the loader.

    Honours ``use_distributed_sampler``, wraps custom samplers in ``DistributedSamplerWrapper`` and uses the
    predict-time wrapper, as Lightning does. Call it from a ``configure_sampler`` override (a datamodule's too)
    to fall back to Lightning's choice for some loaders; ``stage`` is the one the hook received.
    """
    return _lightning_internals.lightning_sampler_choice(trainer, dataloader, as_running_stage(stage))


class DistributedHooksMixin:
    """Adds the documented defaults of both hooks to a ``LightningModule`` subclass.

    Example::

        class Model(DistributedHooksMixin, pl.LightningModule):  # or L.LightningModule
            def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout, device_id=None):
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "ib0")
                super().setup_distributed_backend(backend, init_method, rank, world_size, timeout, device_id)

            def configure_sampler(self, dataloader, stage):
                if stage == "train":
                    return MyDistributedSampler(dataloader.dataset, self.trainer.world_size, self.global_rank)
                return super().configure_sampler(dataloader, stage)
    """

    trainer: Trainer

    @taking_parameters_of(default_setup_distributed_backend)
    def setup_distributed_backend(self, *args: Any, **kwargs: Any) -> None:
        """Create the default process group of this rank. Called once per rank, before any collective.

        Args:
            backend: the resolved backend, e.g. ``"gloo"``, ``"nccl"`` or ``"mpi4py"``.
            init_method: the resolved rendezvous URL, of any registered scheme: ``"env://"``
                (``MASTER_ADDR``/``MASTER_PORT`` already set), ``"tcp://HOST:PORT"``, ``"file:///PATH"``,
                ``"dir:///PATH"`` (torch knows the scheme by then) or ``"mpi://"``; pass it on to
                ``init_process_group`` as it is.
            rank: this process's global rank.
            world_size: the number of processes.
            timeout: the strategy's process-group timeout.
            device_id: this rank's device when it is an accelerator (``torch.device("cuda", local_rank)``), None on
                CPU: what Lightning passes to ``init_process_group(device_id=...)``, so that NCCL binds the group to
                the rank's GPU at once. It is already the current CUDA device. An override declared without this
                parameter (the five-argument form) is called without it.

        An override may build the group any way it likes; when it returns, the default group must exist with
        this ``rank`` and ``world_size``. On GPUs, pass ``device_id`` on as Lightning does::

            def setup_distributed_backend(self, backend, init_method, rank, world_size, timeout, device_id=None):
                torch.distributed.init_process_group(backend, init_method=init_method, rank=rank,
                                                     world_size=world_size, timeout=timeout, device_id=device_id)
        """
        default_setup_distributed_backend(*args, **kwargs)

    def configure_sampler(self, dataloader: DataLoader, stage: RunningStage) -> Sampler | None:
        """Choose the sampler of ``dataloader``; called for every DataLoader the Trainer prepares.

        Args:
            dataloader: the loader as the user's ``*_dataloader`` returned it.
            stage: ``"train"``, ``"validate"`` (also when prepared for the sanity check), ``"test"`` or
                ``"predict"``: a :class:`Stage`, which prints as that and equals Lightning's ``RunningStage``.

        Returns:
            A ``Sampler``: the loader is rebuilt with it (batch size, workers, collate kept).
            ``None``: the loader is used exactly as given (no distributed sampler is injected).

        The process group exists when this is called: ``self.global_rank`` and ``self.trainer.world_size`` are
        valid. The default returns what Lightning chooses today.
        """
        return lightning_default_sampler(self.trainer, dataloader, stage)


def hook_parameters(name: str) -> list[inspect.Parameter]:
    """The parameters each rank passes to hook ``name``, from the hook's one definition (``self`` left out):
    :func:`default_setup_distributed_backend`'s, and ``configure_sampler``'s as :class:`DistributedHooksMixin`
    declares it."""
    if name == SETUP_HOOK:
        return list(inspect.signature(default_setup_distributed_backend).parameters.values())
    return list(inspect.signature(DistributedHooksMixin.configure_sampler).parameters.values())[1:]


def expected_parameters(name: str) -> str:
    """Hook ``name``'s parameters as the messages show them (a method adds ``self``, Fabric's callable does not).

    >>> expected_parameters("setup_distributed_backend"), expected_parameters("configure_sampler")
    ('backend, init_method, rank, world_size, timeout, device_id=None', 'dataloader, stage')
    """
    return ", ".join(
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in hook_parameters(name)
    )


def user_hook(owner: object, name: str) -> Callable[..., Any] | None:
    """``owner``'s own implementation of hook ``name``, bound; None if it has none or only the default."""
    if owner is None:
        return None
    implementation = getattr(type(owner), name, None)
    if implementation is None or implementation is getattr(DistributedHooksMixin, name):
        return None
    return getattr(owner, name)


def sampler_hook(trainer: Trainer) -> Callable[[DataLoader, Stage], Sampler | None] | None:
    """The ``configure_sampler`` to call: the datamodule's wins over the LightningModule's."""
    datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning's data connector
    return user_hook(datamodule, "configure_sampler") or user_hook(trainer.lightning_module, "configure_sampler")
