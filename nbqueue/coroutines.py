"""A worker's coroutine jobs: each runs on the worker's own event loop (nbqueue.aio), up to
`async_concurrency` at once, while the runner thread that claimed it goes back to claiming.

Its outcome is recorded by a small pool of reporter threads, so the loop never waits on the
storage. A timeout or a cancel interrupts the coroutine at its next await.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import threading
import time
from collections.abc import Callable
from typing import Any

from .aio import JobLoop
from .capture import captured, tail
from .context import running
from .flights import Flight, Flights
from .isolation import Ending, Outcome
from .jobs import Job
from .loops import check_clients, foreign_loop

SLOT_RECHECK = 0.2  # seconds a runner waits for a free slot before it looks for a stop or cancel


class Coroutines:
    """The coroutine jobs of one worker, its event loop and its reporter threads."""

    def __init__(
        self,
        flights: Flights,
        most: int,
        name: str,
        stopping: threading.Event,
        report: Callable[[Job, Outcome, str | None], None],
        stopped: Callable[[Job], None],
        give_back: Callable[[Job], None],
    ) -> None:
        """`report` records an outcome, `stopped` tells of a job whose claim ended under it (a
        cancel, a stop), `give_back` returns a job that never started."""
        self.flights = flights
        self.name = name
        self._slots = threading.BoundedSemaphore(most)
        self._stopping = stopping
        self._report = report
        self._stopped = stopped
        self._give_back = give_back
        self._loop: JobLoop | None = None
        self._reporter: concurrent.futures.ThreadPoolExecutor | None = None

    def launch(self, flight: Flight, coroutine: Any, buffer: io.StringIO) -> None:
        """Hand a coroutine job to the loop once a slot is free (the runner waits for one)."""
        while not self._slots.acquire(timeout=SLOT_RECHECK):
            with self.flights.lock:
                taken = not self.flights.holds(flight)  # stopped or cancelled meanwhile
                stopping = not taken and self._stopping.is_set()
                if stopping:  # never started: back to pending, and stop() need not wait for a slot
                    self.flights.land(flight)
            if taken or stopping:
                coroutine.close()
                if stopping:
                    self._give_back(flight.job)
                return
        with self.flights.lock:
            if not self.flights.holds(flight):
                self._slots.release()
                coroutine.close()
                return
            self.flights.count(async_busy=1)
            if self._loop is None:
                self._loop = JobLoop(f"nbqueue-loop-{self.name}", self.name)
                self._reporter = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="nbqueue-report")
            flight.task = self._loop.submit(self._run(flight, coroutine, buffer))

    async def _run(self, flight: Flight, coroutine: Any, buffer: io.StringIO) -> None:
        """A coroutine job on the loop; its job's context follows it across awaits."""
        job = flight.job
        left = None if job.timeout is None else max(0.0, job.timeout - (time.monotonic() - flight.started))
        deadline = asyncio.timeout(left)  # nbqueue's own: a TimeoutError the job raises is the job's
        try:
            check_clients(coroutine, asyncio.get_running_loop())  # before anything is sent
            with captured(buffer), running(flight.context):
                async with deadline:
                    value = await coroutine
            outcome = Outcome(Ending.RETURNED, value)
        except asyncio.CancelledError:
            outcome = Outcome(Ending.CANCELLED)
        except TimeoutError as exc:
            if deadline.expired():
                timed_out = f"timed out after {job.timeout:g} s (interrupted at an await)"
                outcome = Outcome(Ending.TIMED_OUT, timed_out)
            else:  # the job's own (a client's timeout, its own asyncio.timeout): an ordinary error
                outcome = Outcome(Ending.RAISED, exc)
        except BaseException as exc:  # a handler's failure is the job's, never the worker's
            outcome = Outcome(Ending.RAISED, foreign_loop(exc, asyncio.get_running_loop()) or exc)
        finally:
            coroutine.close()  # never started (a client of another loop): no "never awaited" warning
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._reporter, self._finish, flight, outcome, buffer)

    def _finish(self, flight: Flight, outcome: Outcome, buffer: io.StringIO) -> None:
        """Record a coroutine job's outcome (in a reporter thread)."""
        try:
            owned = self.flights.land(flight)
            flight.context.close_stream()
            if flight.context.suspended:  # it waits: its suspension to write, if not already
                outcome = Outcome(Ending.SUSPENDED, flight.context.suspension)
            if not owned or outcome.ending is Ending.CANCELLED:
                if not self._stopping.is_set():  # at a stop, stop() says what became of the job
                    self._stopped(flight.job)
            else:
                self._report(flight.job, outcome, tail(buffer.getvalue()))
        finally:
            self._slots.release()
            self.flights.count(async_busy=-1)

    def watch(self) -> None:
        """Log a coroutine that has blocked the loop for over a second, with its job's id."""
        if self._loop is not None:
            self._loop.warn_if_blocked(Coroutines._run.__code__)

    def stop(self, timeout: float) -> None:
        """End the loop and the reporter threads (the coroutines were cancelled first)."""
        if self._loop is not None:
            self._loop.stop(max(0.1, timeout))
            self._loop = None
        if self._reporter is not None:
            self._reporter.shutdown(wait=True)
            self._reporter = None
