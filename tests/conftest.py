"""Fixtures shared by the core suite.

Tests speak to the public `Queue` API only, so that a second backend can later
parametrise `queue_target` and run the same contract tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import tasks

MakeQueue = Callable[..., nbqueue.Queue]


@pytest.fixture(autouse=True)
def _isolated_registry() -> Iterator[None]:
    """Tasks registered by one test must not be run by another test's worker."""
    with tasks._registry_lock:
        saved = dict(tasks._registry)
    yield
    with tasks._registry_lock:
        tasks._registry.clear()
        tasks._registry.update(saved)


@pytest.fixture
def queue_target(tmp_path: Path) -> str:
    """Where the queue under test lives (a fresh SQLite file per test)."""
    return str(tmp_path / "jobs.db")


@pytest.fixture
def make_queue(queue_target: str) -> Iterator[MakeQueue]:
    """Open (another) Queue on the test's target; every one is closed at teardown."""
    opened: list[nbqueue.Queue] = []

    def make(**options: Any) -> nbqueue.Queue:
        q = nbqueue.Queue(queue_target, **options)
        opened.append(q)
        return q

    yield make
    for q in opened:
        q.close()


@pytest.fixture
def queue(make_queue: MakeQueue) -> nbqueue.Queue:
    return make_queue()


@pytest.fixture
def clock() -> nbqueue.ManualClock:
    return nbqueue.ManualClock()


@pytest.fixture
def clocked_queue(make_queue: MakeQueue, clock: nbqueue.ManualClock) -> nbqueue.Queue:
    return make_queue(clock=clock)


@pytest.fixture
def exact_queue(make_queue: MakeQueue, clock: nbqueue.ManualClock) -> nbqueue.Queue:
    """A queue on the manual clock whose backoff has no jitter: delays are exactly 2, 4, 8 ..."""
    return make_queue(clock=clock, backoff=nbqueue.Backoff(base=2, cap=3600, jitter=0))
