"""The keys one rank keeps for the ``mpi://`` store, and the waits held on them: plain Python, no MPI.

:class:`~lightning_dist_hooks.mpi._store.MpiStore` spreads the keys over the ranks (each key is kept by one rank,
its *home*). On each rank a :class:`KeyTable` holds that rank's share and answers the operations sent to it.
An operation that must wait (``get`` of a key not set yet, ``wait``) is held as a :class:`HeldWait` and answered
when a later change completes it, or with an error naming the keys and the ranks that never reached them when its
deadline passes. Queues (``queue_push``, ``queue_pop``, ``queue_len``) live beside the keys, as in torch's
``HashStore``: ``check`` and ``wait`` see a queue that holds an item, ``get``, ``num_keys``, ``list_keys`` and
``delete_key`` see only keys, and a blocking ``queue_pop`` of an empty queue is held until an item is pushed. The
table only computes answers; who sends them, and how, is the store's business.

    table = KeyTable(rank=0, world_size=2)
    table.handle(Request(source=1, request_id=7, op="add", keys=("counter",), args=(5,), timeout_s=30.0), now=0.0)
    # -> [Answer(destination=1, request_id=7, ok=True, result=5)]
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# What torch's stores read as the integer a key holds (C++ std::stoll): optional leading spaces and sign, digits, and
# nothing more read past them ("12abc" holds 12).
_LEADING_INTEGER = re.compile(rb"\s*([+-]?\d+)")
_INT64 = 1 << 64


class Request(NamedTuple):
    """One store operation, sent to the rank that keeps its keys; ``args`` depend on ``op``."""

    source: int  # the rank that asks, and waits for the answer
    request_id: int  # the asking rank's number for it, sent back with the answer
    op: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    timeout_s: float  # how long a get or a wait may be held before it is answered with a timeout


class Answer(NamedTuple):
    """The answer to one request: its result, or (``ok`` False) the text of the error to raise on the asking rank,
    ``error_type`` naming its class as torch's own stores raise it (``ValueError`` for a bad ``add``)."""

    destination: int
    request_id: int
    ok: bool
    result: Any
    error_type: str = "DistStoreError"


# Requests answered once their keys are there, held until then: "get" and "queue_pop" take what they find.
_HELD_OPS = ("get", "wait", "queue_pop")
_NEVER_DONE = {"get": "which no rank set", "wait": "which no rank set", "queue_pop": "to which no rank pushed an item"}


@dataclass
class HeldWait:
    """A ``get`` or ``wait`` whose keys are not all set yet."""

    request: Request
    deadline: float  # time.monotonic() on the keeping rank
    missing: set[str] = field(default_factory=set)


class KeyTable:
    """The keys kept by rank ``rank`` of ``world_size``, with torch's store semantics (as ``HashStore``'s)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.values: dict[str, bytes] = {}
        self.queues: dict[str, deque[bytes]] = {}
        self.held: list[HeldWait] = []
        # Which ranks have asked anything of each key: the ranks missing from it are named when a wait times out.
        self._reached_by: dict[str, set[int]] = {}

    def handle(self, request: Request, now: float) -> list[Answer]:
        """Apply ``request``; return the answers it completes (its own, unless held, and the held waits it ends)."""
        for key in request.keys:
            self._reached_by.setdefault(key, set()).add(request.source)
        op = request.op
        if op == "queue_pop" and not request.args[0] and not self.queues.get(request.keys[0]):
            return [Answer(request.source, request.request_id, False, "queue is empty", "QueueEmptyError")]
        if op in _HELD_OPS:
            missing = self._missing(request)
            if missing:
                self.held.append(HeldWait(request, now + request.timeout_s, missing))
                return []
            return [self._answer(request, True, self._held_result(request))]
        handler = getattr(self, f"_op_{op}", None)
        if handler is None:
            return [self._answer(request, False, f"the mpi:// store has no operation {op!r}")]
        try:
            result = handler(*request.keys, *request.args)
        except ValueError as error:
            return [Answer(request.source, request.request_id, False, str(error), "ValueError")]
        return [self._answer(request, True, result), *self._completed_by(request.keys)]

    def expire(self, now: float) -> list[Answer]:
        """Answer, with a timeout error, every held wait whose deadline has passed."""
        expired = [held for held in self.held if held.deadline <= now]
        if not expired:
            return []
        answers = [self._answer(held.request, False, self._timeout_message(held)) for held in expired]
        self.held = [held for held in self.held if held.deadline > now]
        return answers

    def next_deadline(self) -> float | None:
        return min((held.deadline for held in self.held), default=None)

    def not_reached(self, key: str) -> list[int]:
        """The ranks that have never asked anything of ``key`` here (nor set it)."""
        reached = self._reached_by.get(key, set())
        return [rank for rank in range(self.world_size) if rank not in reached]

    # --- operations that change nothing or one key (the keys first, then the request's args) ---

    def _op_set(self, *keys_and_values: Any) -> None:
        # set is one key and one value; multi_set is n keys then n values: both arrive as keys then values.
        half = len(keys_and_values) // 2
        for key, value in zip(keys_and_values[:half], keys_and_values[half:], strict=True):
            self.values[key] = value

    def _op_add(self, key: str, amount: int) -> int:
        value = self.values.get(key, b"0")
        number = _LEADING_INTEGER.match(value)
        if number is None or not -(1 << 63) <= int(number.group(1)) < 1 << 63:
            raise ValueError(f"add({key!r}): the key holds {value[:40]!r}, not an integer")
        # As torch's int64 arithmetic: wraps around rather than growing past what torch's C++ side can take back.
        total = (int(number.group(1)) + amount + (1 << 63)) % _INT64 - (1 << 63)
        self.values[key] = b"%d" % total
        return total

    def _op_append(self, key: str, value: bytes) -> None:
        self.values[key] = self.values.get(key, b"") + value

    def _op_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.values.get(key)
        if current is None:
            if expected:  # as torch's stores: a missing key is only set when nothing was expected
                return expected
            self.values[key] = desired
            return desired
        if current == expected:
            self.values[key] = desired
            return desired
        return current

    def _op_delete_key(self, key: str) -> bool:
        return self.values.pop(key, None) is not None

    def _op_check(self, *keys: str) -> bool:
        return all(self._present(key) for key in keys)

    def _op_num_keys(self) -> int:
        return len(self.values)

    def _op_list_keys(self) -> list[str]:
        return list(self.values)

    def _op_queue_push(self, key: str, value: bytes) -> None:
        self.queues.setdefault(key, deque()).append(value)

    def _op_queue_len(self, key: str) -> int:
        return len(self.queues.get(key, ()))

    def _present(self, key: str) -> bool:
        """Whether ``check`` and ``wait`` see ``key``: a key, or a queue holding an item (as ``HashStore``)."""
        return key in self.values or bool(self.queues.get(key))

    def _missing(self, request: Request) -> set[str]:
        """The keys a held request still waits for: ``get`` waits for keys, ``queue_pop`` for an item, ``wait``
        for either."""
        if request.op == "get":
            return {key for key in request.keys if key not in self.values}
        if request.op == "queue_pop":
            return set() if self.queues.get(request.keys[0]) else {request.keys[0]}
        return {key for key in request.keys if not self._present(key)}

    # --- answers ---

    def _answer(self, request: Request, ok: bool, result: Any) -> Answer:
        return Answer(request.source, request.request_id, ok, result)

    def _held_result(self, request: Request) -> list[bytes] | bytes | None:
        """What a held request answers once nothing is missing; a ``queue_pop`` takes its item now."""
        if request.op == "get":
            return [self.values[key] for key in request.keys]
        if request.op == "queue_pop":
            return self.queues[request.keys[0]].popleft()
        return None

    def _completed_by(self, changed: tuple[str, ...]) -> list[Answer]:
        if not self.held:
            return []
        answers = []
        still_held = []
        for held in self.held:  # in the order they came: a pushed item goes to the first pop held for it
            if any(key in held.request.keys for key in changed):
                # Every key again, not only those missing before: one may have been deleted (or popped) since.
                held.missing = self._missing(held.request)
            if held.missing:
                still_held.append(held)
            else:
                answers.append(self._answer(held.request, True, self._held_result(held.request)))
        self.held = still_held
        return answers

    def _timeout_message(self, held: HeldWait) -> str:
        missing = sorted(held.missing)
        not_reached = sorted({rank for key in missing for rank in self.not_reached(key)})
        asked = sorted({rank for key in missing for rank in self._reached_by.get(key, ())})
        return (
            f"Wait timeout: rank {held.request.source} waited {held.request.timeout_s:g} s for the keys {missing} of "
            f"the mpi:// store (kept by rank {self.rank}), {_NEVER_DONE[held.request.op]}. Ranks that asked for them: "
            f"{asked}; ranks that never reached them: {not_reached}."
        )
