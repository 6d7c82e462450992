"""Lightning's signatures and docstrings on the methods our mixins override, so that ``inspect.signature``,
``help()``, IDEs and ``LightningCLI`` see Lightning's parameters (plus ours) rather than ``*args, **kwargs``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


def set_signature(function: Callable[..., Any], signature: inspect.Signature) -> None:
    """Make ``signature`` the one ``inspect.signature(function)`` reports (it reads ``__signature__``)."""
    function.__signature__ = signature  # type: ignore[attr-defined]  # functions do not declare __signature__


def with_keyword_parameters(parent: Callable[..., Any], added: dict[str, inspect.Parameter]) -> inspect.Signature:
    """``parent``'s signature with ``added`` as keyword-only parameters, placed before its ``**kwargs`` if any."""
    signature = inspect.signature(parent, eval_str=True)
    parameters = list(signature.parameters.values())
    variadic = [p for p in parameters if p.kind == inspect.Parameter.VAR_KEYWORD]
    plain = [p for p in parameters if p.kind != inspect.Parameter.VAR_KEYWORD]
    return signature.replace(parameters=[*plain, *added.values(), *variadic])


def with_documented_arguments(parent_doc: str, docs: dict[str, str]) -> str:
    """``parent_doc`` with ``name: text`` lines for ``docs`` added at the end of its ``Args:`` section."""
    lines = inspect.cleandoc(parent_doc).splitlines()
    ours = [f"    {name}: {text}" for name, text in docs.items()]
    if "Args:" not in lines:
        return "\n".join([*lines, "", "Args:", *ours])
    end = lines.index("Args:") + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" ")):
        end += 1
    while not lines[end - 1].strip():
        end -= 1
    return "\n".join([*lines[:end], *ours, *lines[end:]])


def keyword_parameter(name: str, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


def presented_as(
    lightning_method: Callable[..., Any], implementation: Callable[..., Any], owner: type
) -> Callable[..., Any]:
    """A method of ``owner`` that runs ``implementation`` and shows ``lightning_method``'s signature and docstring.

    >>> class Parent:
    ...     def fit(self, model, datamodule=None):
    ...         "Fit the model."
    >>> class Child(Parent):
    ...     pass
    >>> Child.fit = presented_as(Parent.fit, lambda self, *args, **kwargs: "checked", Child)
    >>> inspect.signature(Child().fit), Child.fit.__doc__, Child().fit(1)
    (<Signature (model, datamodule=None)>, 'Fit the model.', 'checked')
    """

    @functools.wraps(lightning_method)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return implementation(self, *args, **kwargs)

    method.__module__ = owner.__module__
    method.__qualname__ = f"{owner.__qualname__}.{lightning_method.__name__}"
    return method
