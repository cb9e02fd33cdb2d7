"""A checkpoint serializer that builds no class it was not told it may build.

LangGraph's JsonPlusSerializer encodes objects as msgpack extensions that name a module and
a class, and by default imports and calls whatever a stored row names (it only warns). A row
planted in the database would then run code on load. `SafeSerializer` refuses such a row
with `UnsafeCheckpoint` before anything is built: only LangGraph's own list of safe types
(datetimes, UUIDs, LangChain messages, LangGraph's Send, Command, Interrupt ...) and the
types a saver was given are built: `allowed=`, the types a graph run by `graph_task` names in
its schemas, and what LangGraph asks for through `with_allowlist` (in its strict mode only,
LANGGRAPH_STRICT_MSGPACK=true). Pickle is never read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import _msgpack as lg_msgpack
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ...errors import NbqueueError

# LangGraph's msgpack extension codes that name a class: constructors (0, 1, 2), a method
# call (3: module, class, argument, method), pydantic models (4, 5).
NAMES_A_CLASS = frozenset({0, 1, 2, 3, 4, 5})
METHOD_CALL = 3
READABLE = frozenset({"null", "bytes", "bytearray", "msgpack", "empty"})


class UnsafeCheckpoint(NbqueueError):
    """A stored checkpoint names a class this saver may not build; it was not loaded."""


class SafeSerializer(JsonPlusSerializer):
    """JsonPlusSerializer in strict mode that refuses (never silently skips) unknown classes.

    `allowed`: more classes to build, as types or (module, name) pairs.
    """

    def __init__(self, allowed: Iterable[type | tuple[str, ...]] = ()) -> None:
        super().__init__(allowed_msgpack_modules=tuple(allowed) or None, pickle_fallback=False)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        kind, payload = data
        if kind == "empty":
            return None
        if kind not in READABLE:
            raise UnsafeCheckpoint(f"a stored checkpoint value is encoded as {kind!r}, which is never read")
        if kind == "msgpack":
            return self._unpack(payload)
        return super().loads_typed(data)

    def _unpack(self, payload: bytes) -> Any:
        """msgpack with LangGraph's extension hook, after checking what each extension (and
        every one inside it) names. (ormsgpack turns a hook's error into a bare ValueError: the
        refusal is kept aside and raised as itself.)"""
        refused: list[UnsafeCheckpoint] = []

        def guarded(code: int, data: bytes) -> Any:
            if code in NAMES_A_CLASS:
                named = ormsgpack.unpackb(data, ext_hook=guarded, option=ormsgpack.OPT_NON_STR_KEYS)
                try:
                    self._check(named, code)
                except UnsafeCheckpoint as exc:
                    refused.append(exc)
                    raise
            return self._unpack_ext_hook(code, data)

        try:
            return ormsgpack.unpackb(payload, ext_hook=guarded, option=ormsgpack.OPT_NON_STR_KEYS)
        except ValueError:
            if refused:
                raise refused[0] from None
            raise

    def _check(self, named: Any, code: int) -> None:
        if not isinstance(named, list | tuple) or len(named) < 2:
            raise UnsafeCheckpoint(f"a stored checkpoint holds a damaged extension ({code})")
        module, name = str(named[0]), str(named[1])
        allowed = self._allowed_msgpack_modules
        known = (module, name) in lg_msgpack.SAFE_MSGPACK_TYPES
        if not known and not (isinstance(allowed, set) and (module, name) in allowed):
            raise UnsafeCheckpoint(
                f"a stored checkpoint names {module}.{name}, which this saver may not build: if it "
                f"is your state's own type, pass QueueSaver(queue, allowed=[{name}])"
            )
        if code == METHOD_CALL and len(named) > 3:
            method = (module, name, str(named[3]))
            if method not in lg_msgpack.SAFE_MSGPACK_METHODS:
                raise UnsafeCheckpoint(f"a stored checkpoint calls {'.'.join(method)}, which is never called")
