"""Which event loop an async client belongs to, and the error that says so.

An async client (httpx, aiohttp, OpenAI, Anthropic) belongs to the event loop it
was first used on: its connections are that loop's. Used on another loop it sends
the request, then fails on the reply (the server has answered, and billed), and
the loop it came from is left with a broken client. So before a coroutine runs,
the clients it names (the globals its code reads, its arguments and closure) are
checked: one bound to another loop raises `ForeignLoopError` before anything is
sent. A client reached some other way (an attribute of an object) cannot be seen
in advance; its error ("attached to a different loop", "Event loop is closed") is
explained afterwards, naming the loop the client came from when it can be found.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import itertools
import threading
import types
import weakref
from collections.abc import Coroutine, Iterator
from typing import Any

from .errors import Unretryable

# What nbqueue's own loops are, for messages: a worker's loop, a thread's run_sync loop.
_names: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, str] = weakref.WeakKeyDictionary()

# Instances of these libraries are async clients: checked before a job's coroutine runs.
_CLIENTS = frozenset({"httpx", "aiohttp", "openai", "anthropic"})
# The libraries under those clients, where the loop a client belongs to is kept.
_INSIDE = _CLIENTS | {"httpcore", "anyio", "asyncio", "h11", "h2", "multidict"}
_MOST_OBJECTS = 2000  # objects looked at per client: a bound on the walk, however big the pool
_DEEPEST = 12  # an httpx client's loop is 9 attributes down (pool, connection, stream, transport)

# What errors say when an object bound to one event loop is used on another.
_FOREIGN = ("attached to a different loop", "bound to a different event loop", "different event loop")
_CLOSED = "Event loop is closed"
# aiohttp's words for a session of another loop; also said for other misuse, so explained only
# when the traceback shows a loop other than the job's.
_MAYBE = ("Timeout context manager should be used inside a task",)
_ADVICE = (
    "An async client works only on the event loop it was first used on: make it inside the job, "
    "or share one per loop with nbqueue.per_loop(make_client)."
)


class ForeignLoopError(Unretryable):
    """An async client (or other async object) of another event loop was used in a job.

    The job is dead at once: a retry would use the same client again (and, if the
    request went out, pay for it again).
    """


def name_loop(loop: asyncio.AbstractEventLoop, what: str) -> None:
    """Say what `loop` is in messages ("the event loop of worker w1")."""
    _names[loop] = what


def describe(loop: asyncio.AbstractEventLoop) -> str:
    """The loop in words: a worker's (running or stopped), the notebook's, or another one."""
    name = _names.get(loop)
    if name is not None:
        return name if loop.is_running() else f"{name}, which has stopped"
    thread_id = getattr(loop, "_thread_id", None)  # set while it runs (asyncio's own bookkeeping)
    if loop.is_running() and thread_id == threading.main_thread().ident:
        return "the notebook's event loop (the main thread's, where cells and asyncio.run run)"
    if loop.is_closed():
        return "an event loop that has closed (an asyncio.run() that returned, or a stopped worker's)"
    if loop.is_running():
        return f"another event loop (running in thread {thread_id})"
    return "another event loop (not running)"


def loops_of(root: object) -> list[asyncio.AbstractEventLoop]:
    """The event loops an async object holds on to (its own, its connections'), nearest first."""
    found: list[asyncio.AbstractEventLoop] = []
    seen: set[int] = set()
    todo: collections.deque[tuple[object, int]] = collections.deque([(root, 0)])
    while todo and len(seen) < _MOST_OBJECTS:
        obj, depth = todo.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, asyncio.AbstractEventLoop):
            if obj not in found:
                found.append(obj)
        elif depth < _DEEPEST:
            todo.extend((child, depth + 1) for child in _parts(obj))
    return found


def _parts(obj: object) -> list[object]:
    """What an object of the async libraries (or a container) holds, as far as can be read safely."""
    try:
        if isinstance(obj, list | tuple | set | frozenset | collections.deque):
            return list(itertools.islice(obj, _MOST_OBJECTS))
        if isinstance(obj, dict):
            return list(itertools.islice(obj.values(), _MOST_OBJECTS))
    except RuntimeError:  # changed by another thread while read: what was read is all there is
        return []
    if isinstance(obj, type | types.ModuleType | types.FunctionType | types.MethodType):
        return []
    if type(obj).__module__.partition(".")[0] not in _INSIDE:
        return []
    parts = list(getattr(obj, "__dict__", {}).values())
    for klass in type(obj).__mro__:
        slots = getattr(klass, "__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            try:
                parts.append(getattr(obj, slot))
            except Exception:  # an empty slot, or a property that raises
                continue
    return parts


def _is_client(value: object) -> bool:
    kind = type(value)
    return kind.__module__.partition(".")[0] in _CLIENTS and not isinstance(
        value, type | types.ModuleType | types.FunctionType | types.MethodType
    )


def _named(coroutine: Coroutine[Any, Any, Any]) -> Iterator[tuple[str, object]]:
    """The objects a coroutine names before it runs: its arguments and closure, the globals its
    code (and the functions it calls by global name, one level down) reads."""
    frame = getattr(coroutine, "cr_frame", None)
    code = getattr(coroutine, "cr_code", None)
    if frame is None or code is None:
        return
    try:
        own = list(frame.f_locals.items())  # its arguments (and, on 3.11, its closure)
    except Exception:  # a frame that cannot show its locals: the rest is still read
        own = []
    yield from own
    # Its closure from its function, which the coroutine holds (whether an unstarted frame
    # shows its closure in f_locals differs between Python versions).
    for function in gc.get_referents(coroutine):
        if isinstance(function, types.FunctionType) and function.__code__ is code:
            for name, cell in zip(code.co_freevars, function.__closure__ or (), strict=False):
                with contextlib.suppress(ValueError):  # a cell not yet filled
                    yield name, cell.cell_contents
    yield from _globals_read(code, frame.f_globals, levels=2)


def _globals_read(
    code: types.CodeType, globals_: dict[str, Any], levels: int
) -> Iterator[tuple[str, object]]:
    for name in _names_in(code):
        if name in globals_:
            value = globals_[name]
            yield name, value
            if levels > 1 and isinstance(value, types.FunctionType) and value.__code__ is not code:
                yield from _globals_read(value.__code__, value.__globals__, levels - 1)


@functools.lru_cache(maxsize=1024)
def _names_in(code: types.CodeType) -> frozenset[str]:
    """Every name a code object (and the functions and comprehensions inside it) looks up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return frozenset(names)


def check_clients(coroutine: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> None:
    """Raise ForeignLoopError if a client the coroutine names belongs to a loop other than `loop`.

    Runs before the coroutine's first step, so nothing has been sent. Clients reached
    only through other objects are not seen here (their error is explained afterwards).
    """
    checked: set[int] = set()
    for name, value in _named(coroutine):
        if id(value) in checked or not _is_client(value):
            continue
        checked.add(id(value))
        for other in loops_of(value):
            if other is not loop:
                raise ForeignLoopError(
                    f"the {type(value).__name__} {name!r} belongs to {describe(other)}, and this job runs "
                    f"on {describe(loop)}; it was not used (nothing was sent). {_ADVICE}"
                )


def _loop_in_traceback(
    error: BaseException, running: asyncio.AbstractEventLoop | None
) -> asyncio.AbstractEventLoop | None:
    """The loop, other than `running`, that the objects in the error's traceback belong to."""
    tb = error.__traceback__
    while tb is not None:
        for value in list(tb.tb_frame.f_locals.values()):
            if isinstance(value, asyncio.AbstractEventLoop):
                candidates = [value]
            elif type(value).__module__.partition(".")[0] in _INSIDE:
                candidates = loops_of(value)
            else:
                continue
            for loop in candidates:
                if loop is not running:
                    return loop
        tb = tb.tb_next
    return None


def foreign_loop(
    error: BaseException, running: asyncio.AbstractEventLoop | None = None
) -> ForeignLoopError | None:
    """The error explained, if it says an object of another (or a closed) event loop was used.

    `running` is the loop the job ran on; the message names the loop the object came from
    when the traceback shows it.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if isinstance(current, RuntimeError) and (
            any(words in text for words in _FOREIGN + _MAYBE) or text == _CLOSED
        ):
            origin = _loop_in_traceback(current, running)
            if origin is not None:
                where = f"an async object of {describe(origin)} was used"
            elif any(words in text for words in _MAYBE):
                current = current.__cause__ or current.__context__
                continue
            elif text == _CLOSED:
                where = (
                    "an async object of an event loop that has closed (an asyncio.run() in a notebook "
                    "cell that returned, or a stopped worker's loop: a client kept in a global outlives "
                    "its loop) was used"
                )
            else:
                where = "an async object of another event loop (a notebook cell's, say) was used"
            here = f" in a job on {describe(running)}" if running is not None else " here"
            explained = ForeignLoopError(f"{where}{here}. {_ADVICE} ({type(current).__name__}: {text})")
            explained.__cause__ = error
            return explained
        current = current.__cause__ or current.__context__
    return None
