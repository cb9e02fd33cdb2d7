"""Streams: what a running job emits, read live from anywhere.

    @q.task()
    async def answer(prompt):
        text = ""
        async for token in llm_stream(prompt):
            nbqueue.emit(token)          # any JSON value, appended in order
            text += token
        return text

    for item in job.stream():            # what was emitted, then live until the job finishes
        print(item, end="")

Items are kept in the database with the job and belong to an attempt: a reader sees the
latest attempt's (a retry starts a new stream; `stream(attempt=k)` reads an older one).
Within an attempt they are numbered in the order emitted; a run resumed after a wait emits
again from 0, and an item stored under its number is not stored twice. Emitting is cheap:
a run's items are written in small batches (every 50 ms, or 256 at once) under its claim, and
all of them before its outcome is recorded. A stream keeps at most a set number of bytes
per attempt (`@q.task(stream_bytes=...)`, 1 MiB by default), dropping the oldest whole items
(while the job runs, a cut follows each eighth of the bound written: it may hold that much
more meanwhile); a reader behind them gets a `Dropped` note first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import payload as payload_json
from .clock import seconds
from .context import current
from .errors import InvalidArgument, LeaseLost, NbqueueError, WaitTimeout
from .jobs import NOTEBOOK_JOB_ENV, Job

FLUSH_EVERY = 0.05  # seconds an emitted item waits at most before it is written
FLUSH_AT = 256  # items that are written at once, without waiting
PAGE = 1000  # items a reader reads at a time
FOLLOW_PAUSE = (0.01, 0.05)  # a follower's first and longest pause between reads (seconds)

#: Writes a run's (seq, JSON text) items under its claim, and with `trim` cuts its stream to its
#: bound; False once the claim is gone.
Write = Callable[[list[tuple[int, str]], bool], bool]


@dataclass(frozen=True, slots=True)
class Dropped:
    """A note a reader gets before the items it missed were dropped by the stream's bound."""

    count: int

    def __str__(self) -> str:
        return f"[{self.count} earlier item{'s' if self.count != 1 else ''} dropped]"


def emit(value: Any) -> None:
    """Append `value` (any JSON value) to the running job's stream; a no-op outside a job.

    Raises:
        PayloadError: the value is not JSON (nothing is emitted).
        LeaseLost: the job's claim is gone (a stale worker's items are refused).
        NbqueueError: called in a notebook job's own kernel (not supported there yet).
    """
    text = payload_json.dumps(value, "the value emitted")
    context = current()
    if context is None:
        if job := os.environ.get(NOTEBOOK_JOB_ENV):
            raise NbqueueError(
                f"emit is not yet supported inside a notebook job's own kernel (job {job}): it has no "
                "job context to write a stream in; emit from a task instead"
            )
        return
    if context.emitter is not None:
        context.emitter.add(text)


class Emitter:
    """One run's stream: items numbered from 0, buffered, written in batches by `write` (from a
    thread of its own every FLUSH_EVERY seconds, or at once when FLUSH_AT wait), and all of them
    by `close()`, which the worker calls before it records the run's outcome."""

    def __init__(self, job_id: int, write: Write, bound: int | None = None) -> None:
        self.job_id = job_id
        self._write = write
        # The stream is cut to its bound once a bound's eighth was written since (a cut reads
        # the whole kept stream: not on every batch); None: never (a child's, sent to its parent).
        self._cut_every = None if bound is None else max(1, bound // 8)
        self._uncut = 0
        self._buffer: list[tuple[int, str]] = []
        self._next = 0
        self._lock = threading.Lock()  # the buffer
        self._writing = threading.Lock()  # one write at a time, in order
        self._refused = False
        self._closed = threading.Event()
        self._flusher: threading.Thread | None = None

    def add(self, text: str) -> None:
        """Append an item (JSON text); LeaseLost once a write was refused."""
        with self._lock:
            if self._refused:
                raise LeaseLost(f"job {self.job_id} cannot emit: its claim is gone; the item is not kept")
            self._buffer.append((self._next, text))
            self._next += 1
            full = len(self._buffer) >= FLUSH_AT
            if self._flusher is None and not self._closed.is_set():
                self._flusher = threading.Thread(target=self._flush_often, daemon=True, name="nbqueue-emit")
                self._flusher.start()
        if full:
            self.flush()

    @property
    def refused(self) -> bool:
        """True once a write was refused: the claim is gone."""
        return self._refused

    def flush(self, last: bool = False) -> None:
        """Write what is buffered (in order); a refusal is remembered for the next `add`. The
        `last` write cuts the stream to its bound whatever was written since the last cut."""
        with self._writing:
            with self._lock:
                items, self._buffer = self._buffer, []
            self._uncut += sum(len(text) for _, text in items)
            if self._refused or not (items or (last and self._uncut)):  # (the last write cuts)
                return
            cut = self._cut_every is not None and (last or self._uncut >= self._cut_every)
            if not self._write(items, cut):
                self._refused = True
            elif cut:
                self._uncut = 0

    def close(self) -> None:
        """Write everything emitted and stop the flusher."""
        self._closed.set()
        if self._flusher is not None:
            self._flusher.join()
        with contextlib.suppress(NbqueueError):  # the storage is away: lost with the run
            self.flush(last=True)

    def _flush_often(self) -> None:
        while not self._closed.wait(FLUSH_EVERY):
            with contextlib.suppress(NbqueueError):  # written with the next batch (or refused)
                self.flush()


class StreamSource(Protocol):
    """What reading a stream needs of a queue."""

    def get(self, job_id: int) -> Job:
        """The job as stored now."""
        ...

    def stream_head(self, job_id: int, most: int) -> tuple[int, int] | None:
        """The newest attempt up to `most` with items, and the first item it keeps."""
        ...

    def stream_items(self, job_id: int, run: int, after: int, limit: int) -> list[tuple[int, str]]:
        """Items of attempt `run` after `after`: (seq, JSON text)."""
        ...


def read(
    source: StreamSource,
    job_id: int,
    follow: bool = True,
    attempt: int | None = None,
    timeout: float | None = None,
) -> Iterator[Any]:
    """A job's stream (its latest attempt's, or `attempt`'s): what is there, then, with
    `follow`, what comes until the job finishes (across its retries and waits)."""
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1):
        raise InvalidArgument(f"attempt is a whole number >= 1, not {attempt!r}")
    limit = seconds(timeout, "timeout")
    deadline = None if limit is None else time.monotonic() + limit
    run, after, pause = attempt, -1, FOLLOW_PAUSE[0]
    while True:
        job = source.get(job_id)  # read before the items: a finished job's items are all stored
        head = source.stream_head(job_id, attempt or job.retries + 1)
        if head is not None and (attempt is None or head[0] == attempt):
            if head[0] != run:  # a new attempt's stream (a retry): read it from its start
                run, after = head[0], -1
            if head[1] > after + 1:  # the bound dropped what this reader had not read
                yield Dropped(head[1] - after - 1)
                after = head[1] - 1
        items = [] if run is None else source.stream_items(job_id, run, after, PAGE)
        for seq, text in items:
            after = seq
            yield json.loads(text)
        if items:
            pause = FOLLOW_PAUSE[0]
            continue
        if not follow or job.finished:
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"job {job_id} was still {job.status.value} after {limit:g} s")
        time.sleep(pause)
        pause = min(pause * 2, FOLLOW_PAUSE[1])


async def aread(
    source: StreamSource,
    job_id: int,
    follow: bool = True,
    attempt: int | None = None,
    timeout: float | None = None,
) -> AsyncIterator[Any]:
    """`read` for a coroutine or a notebook cell: each read in a thread, the loop stays free."""
    items = read(source, job_id, follow, attempt, timeout)
    done = object()
    while (item := await asyncio.to_thread(next, items, done)) is not done:
        yield item


def joined(items: Sequence[Any]) -> str:
    """A stream as text, the way a view shows it: text items joined as they come, any other value
    on a line of its own."""
    parts: list[str] = []
    for item in items:
        if isinstance(item, str):
            parts.append(item)
        else:
            if parts and not parts[-1].endswith("\n"):
                parts.append("\n")
            parts.append(f"{item}\n" if isinstance(item, Dropped) else json.dumps(item) + "\n")
    return "".join(parts)
