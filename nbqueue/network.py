"""NETWORK_ERRORS: the network failures worth a retry, as the real clients raise them.

    @q.task(max_retries=5, retry_on=nbqueue.NETWORK_ERRORS)
    async def ask(prompt): ...

The builtin `(ConnectionError, TimeoutError)` matches almost nothing the clients raise:
openai's APIConnectionError, httpx's ConnectError and requests' ConnectionError derive
from none of them. NETWORK_ERRORS matches connection refused or reset, timeouts and
protocol errors (a connection dropped mid-answer) of openai, anthropic, httpx, requests,
aiohttp, urllib and the builtins, and an exception group (asyncio.TaskGroup) made only of
those. It imports none of those libraries: each check looks
only at the ones already imported (in `sys.modules`), so a plain install stays small and
`import nbqueue` fast, and a task defined before `import openai` still matches its errors.

It is a class with its own `isinstance`/`issubclass` checks, so it works wherever those are
asked: `retry_on=`, `give_up_on=`, `isinstance(exc, nbqueue.NETWORK_ERRORS)`. Python's
`except` clause compares classes without asking the class, so `except NETWORK_ERRORS:`
catches nothing: write `except Exception as exc: if isinstance(exc, NETWORK_ERRORS): ...`.
"""

from __future__ import annotations

import sys
from typing import Any

#: module -> the names of its network error classes (dotted for a class inside a module).
_CLASSES: dict[str, tuple[str, ...]] = {
    "builtins": ("ConnectionError", "TimeoutError"),  # refused, reset, aborted, broken pipe; timeouts
    "http.client": ("IncompleteRead", "BadStatusLine"),  # urllib: a connection cut mid-answer
    "openai": ("APIConnectionError",),  # APITimeoutError is one
    "anthropic": ("APIConnectionError",),
    "httpx": ("TimeoutException", "NetworkError", "RemoteProtocolError"),
    "httpx2": ("TimeoutException", "NetworkError", "RemoteProtocolError"),
    "requests": ("exceptions.ConnectionError", "exceptions.Timeout", "exceptions.ChunkedEncodingError"),
    "aiohttp": ("ClientConnectionError", "ClientPayloadError"),  # disconnects, timeouts, cut bodies
}


def _classes() -> list[type[BaseException]]:
    """The network error classes of the libraries imported so far."""
    found = []
    for module_name, names in _CLASSES.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name in names:
            value: Any = module
            for part in name.split("."):
                value = getattr(value, part, None)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.append(value)
    return found


def _wrapped(instance: object, network: type) -> bool:
    """The network failures urllib and aiohttp wrap in a broader error."""
    urllib_error = sys.modules.get("urllib.error")
    if urllib_error is not None and isinstance(instance, urllib_error.URLError):
        # URLError(reason) wraps a refused or reset connection; HTTPError is an answer.
        return not isinstance(instance, urllib_error.HTTPError) and isinstance(instance.reason, network)
    aiohttp, parser = sys.modules.get("aiohttp"), sys.modules.get("aiohttp.http_exceptions")
    if aiohttp is not None and parser is not None and isinstance(instance, aiohttp.ClientResponseError):
        # An answer that was not HTTP: aiohttp reports it as a "400" caused by its parser's error.
        return isinstance(instance.__cause__, parser.HttpProcessingError)
    return False


class _NetworkErrorsType(type):
    """The metaclass whose checks look at the libraries imported at the moment of asking."""

    def __instancecheck__(cls, instance: object) -> bool:
        if isinstance(instance, tuple(_classes())):
            return True
        if isinstance(instance, BaseExceptionGroup) and instance.exceptions:  # asyncio.TaskGroup's
            return all(isinstance(member, cls) for member in instance.exceptions)
        return _wrapped(instance, cls)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return subclass is cls or issubclass(subclass, tuple(_classes()))


class NETWORK_ERRORS(Exception, metaclass=_NetworkErrorsType):  # a class, used like a constant
    """Matches the network errors of openai, anthropic, httpx, requests, aiohttp, urllib and the
    builtins (connection refused or reset, timeouts, protocol errors), looking only at the
    libraries already imported. Use it in `retry_on=` / `give_up_on=` or with isinstance;
    not in `except` (Python compares those classes directly). Never raised itself."""
