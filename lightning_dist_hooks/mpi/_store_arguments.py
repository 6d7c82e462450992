"""The arguments ``MpiStore`` takes, checked as torch's own stores check theirs: a ``TypeError`` for a wrong type.

torch's C++ stores get their arguments through pybind11, which refuses what does not convert (``set("k", 5)``,
``add("k", 1.5)``, ``check("abc")``); a Python store gets whatever the caller passes, and would store five NUL bytes
for ``set("k", 5)``, or allocate 100 MB for ``set("k", 10**8)``. Each function returns the argument in the form the
store sends (``str`` keys, ``bytes`` values) or raises ``TypeError`` naming the method, the argument and what it
must be.

>>> value_of("set", "v"), key_of("get", b"k"), keys_of("check", ("a", "b"))
(b'v', 'k', ['a', 'b'])
>>> value_of("set", 5)
Traceback (most recent call last):
TypeError: MpiStore.set(): the value must be str or bytes, as torch's stores take it; got int 5
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

_INT64 = range(-(1 << 63), 1 << 63)


def key_of(method: str, key: Any) -> str:
    """A key: ``str``, or ``bytes`` (taken as UTF-8, as pybind11 passes bytes to torch's ``std::string``)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.decode("utf-8", "surrogateescape")
    raise _wrong(method, "the key", "str or bytes", key)


def keys_of(method: str, keys: Any) -> list[str]:
    """A list of keys: any sequence of keys except a string itself (``check("abc")`` is not three keys)."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise _wrong(method, "the keys", "a list of str", keys)
    return [key_of(method, key) for key in keys]


def value_of(method: str, value: Any) -> bytes:
    """A value: ``bytes`` (or ``bytearray``), or ``str`` stored as its UTF-8."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise _wrong(method, "the value", "str or bytes", value)


def values_of(method: str, values: Any) -> list[bytes]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise _wrong(method, "the values", "a list of str or bytes", values)
    return [value_of(method, value) for value in values]


def amount_of(method: str, amount: Any) -> int:
    """An ``add`` amount: an integer that fits torch's ``int64_t`` (``bool`` is one, as pybind11 takes it)."""
    if isinstance(amount, int) and amount in _INT64:
        return int(amount)
    raise _wrong(method, "the amount", "an int between -2**63 and 2**63 - 1", amount)


def timeout_of(method: str, timeout: Any) -> float:
    """A ``wait`` timeout in seconds; 0.0 for None (the store's own timeout)."""
    if timeout is None:
        return 0.0
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    raise _wrong(method, "the timeout", "a datetime.timedelta", timeout)


def _wrong(method: str, what: str, must_be: str, got: Any) -> TypeError:
    shown = repr(got)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return TypeError(
        f"MpiStore.{method}(): {what} must be {must_be}, as torch's stores take it; got {type(got).__name__} {shown}"
    )
