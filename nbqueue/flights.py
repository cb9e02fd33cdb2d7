"""What a worker has in flight: each running job's claim, context and runner, the runners it
has retired, and the counts that tell `run_until_idle()` and `stop()` whether it is busy.

One object owns them and the one lock (a Condition) they are read and changed under, so a
reader never sees a job counted twice or a runner half retired; the worker asks it, it does
not reach into it.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field

from .batches import Batch
from .context import JobContext
from .jobs import Job


@dataclass
class Flight:
    """A job this worker is running: its claim, when it started, its context, its runner."""

    job: Job
    started: float
    context: JobContext
    runner: threading.Thread = field(default_factory=threading.current_thread)
    task: concurrent.futures.Future[None] | None = None  # a coroutine job on the worker's loop


class Flights:
    """A worker's jobs in flight, its runners' batches and its busy counts, under `lock`.

    `lock` is re-entrant: the worker holds it while it changes its set of threads, and may
    call these methods meanwhile. Waiters on it are woken whenever a count drops.
    """

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self._by_id: dict[int, Flight] = {}
        self._retired: set[threading.Thread] = set()  # runners left to a handler whose job was taken away
        self._batches: list[Batch] = []  # each runner's claimed jobs and unwritten successes
        self.busy = 0  # runners claiming or running
        self.async_busy = 0  # coroutine jobs in flight
        self.completed = 0
        self.failed = 0

    # -- jobs ------------------------------------------------------------------

    def add(self, flight: Flight) -> None:
        with self.lock:
            self._by_id[flight.job.id] = flight

    def holds(self, flight: Flight) -> bool:
        """Whether this is still the worker's flight of its job (no stop, timeout or newer claim
        took it)."""
        with self.lock:
            return self._by_id.get(flight.job.id) is flight

    def land(self, flight: Flight) -> bool:
        """The flight's job has ended in its runner: forget it; True if it was still held."""
        with self.lock:
            owned = self._by_id.get(flight.job.id) is flight
            if owned:
                del self._by_id[flight.job.id]
            return owned

    def now(self) -> list[Flight]:
        """The flights as they are now."""
        with self.lock:
            return list(self._by_id.values())

    def ids(self) -> list[int]:
        with self.lock:
            return sorted(self._by_id)

    def deadlines(self) -> list[float]:
        """When each threaded job with a timeout is due to be stopped (time.monotonic())."""
        with self.lock:
            return [
                f.started + f.job.timeout
                for f in self._by_id.values()
                if f.job.timeout is not None and f.task is None
            ]

    # -- retiring --------------------------------------------------------------

    def retire(self, flight: Flight) -> bool:
        """Take a job from its runner: the runner stops counting as the worker's, and its handler
        is told to stop (a coroutine is cancelled at its next await). False if the runner was
        retired already."""
        with self.lock:
            self._by_id.pop(flight.job.id, None)
            flight.context.cancel.set()  # progress() raises Cancelled in a cooperative handler
            if flight.task is not None:  # no thread to retire
                flight.task.cancel()
                return True
            if flight.runner in self._retired:
                return False
            self._retired.add(flight.runner)
            return True

    def retire_if_held(self, flight: Flight) -> bool:
        """Retire the flight if it is still the worker's and its runner is not retired yet."""
        with self.lock:
            return self._by_id.get(flight.job.id) is flight and self.retire(flight)

    def retire_late(self) -> list[Flight]:
        """Retire the threaded jobs whose timeout has passed; those retired now."""
        now = time.monotonic()
        with self.lock:
            late = [
                f
                for f in self._by_id.values()
                if f.task is None and f.job.timeout is not None and now - f.started >= f.job.timeout
            ]
            return [f for f in late if self.retire(f)]

    def retire_all(self) -> list[Flight]:
        """Retire every flight (the worker stops); those retired now."""
        with self.lock:
            return [f for f in list(self._by_id.values()) if self.retire(f)]

    def is_retired(self, runner: threading.Thread) -> bool:
        with self.lock:
            return runner in self._retired

    def serving(self, threads: list[threading.Thread]) -> list[threading.Thread]:
        """The threads not retired (a retired runner is left to its handler)."""
        with self.lock:
            return [t for t in threads if t not in self._retired]

    def forget_ended(self) -> None:
        """Forget the retired runners that have ended (the worker starts a new set of threads)."""
        with self.lock:
            self._retired = {t for t in self._retired if t.is_alive()}

    # -- batches ---------------------------------------------------------------

    def add_batch(self, batch: Batch) -> None:
        with self.lock:
            self._batches.append(batch)

    def drop_batch(self, batch: Batch) -> None:
        with self.lock:
            self._batches.remove(batch)

    def batches(self) -> list[Batch]:
        """Every runner's batch now (retired runners still hold theirs)."""
        with self.lock:
            return list(self._batches)

    # -- counts ----------------------------------------------------------------

    def count(self, busy: int = 0, async_busy: int = 0, completed: int = 0, failed: int = 0) -> None:
        """Change the counts; a drop wakes whoever waits for the worker to be idle."""
        with self.lock:
            self.busy += busy
            self.async_busy += async_busy
            self.completed += completed
            self.failed += failed
            if busy < 0 or async_busy < 0:
                self.lock.notify_all()

    def idle(self) -> bool:
        """No runner claims or runs, and no coroutine job is in flight."""
        with self.lock:
            return self.busy == 0 and self.async_busy == 0

    def wait(self, timeout: float) -> None:
        """Sleep until a count drops, or `timeout` seconds."""
        with self.lock:
            self.lock.wait(timeout)
