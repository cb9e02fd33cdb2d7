"""What a job prints goes into its record, never into whichever notebook cell is running.

sys.stdout and sys.stderr are replaced once by routers: a write made while a
job runs (in its thread, or in its coroutine) goes to that job's buffer; every
other write passes through to the stream that was there before. The buffer is
found through a context variable, so jobs that share a thread or an event loop
never print into each other's records.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any, TextIO

MAX_OUTPUT = 64 * 1024  # keep the tail of what a job prints

_buffer: ContextVar[io.StringIO | None] = ContextVar("nbqueue_output", default=None)
_install_lock = threading.Lock()


class _Router(io.TextIOBase):
    """Stands in for sys.stdout/stderr: a job's writes go to its buffer, others pass."""

    def __init__(self, target: TextIO) -> None:
        self.target = target

    def write(self, text: str) -> int:
        buffer = _buffer.get()
        if buffer is not None:
            return buffer.write(text)
        try:
            return self.target.write(text)
        except ValueError:  # the stream was closed under us (interpreter exit): nowhere to go
            return len(text)

    def flush(self) -> None:
        if _buffer.get() is None:
            with suppress(ValueError):  # closed at interpreter exit
                self.target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


@contextmanager
def captured(buffer: io.StringIO) -> Iterator[io.StringIO]:
    """Route what this job prints into `buffer` for the duration."""
    with _install_lock:
        for name in ("stdout", "stderr"):
            current = getattr(sys, name)
            if not isinstance(current, _Router):
                setattr(sys, name, _Router(current))
    token = _buffer.set(buffer)
    try:
        yield buffer
    finally:
        _buffer.reset(token)


def tail(text: str) -> str | None:
    """The end of a job's output as stored: at most MAX_OUTPUT characters, None if nothing."""
    if not text:
        return None
    return text if len(text) <= MAX_OUTPUT else "...(earlier output cut)\n" + text[-MAX_OUTPUT:]
