"""Helpers shared by the notebook-layer tests (threads, polling, running cells)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

WORKER_PREFIXES = ("nbqueue-worker-", "nbqueue-keeper")


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `condition` until it holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.02)


def worker_threads() -> list[str]:
    """Names of the live threads that run jobs ("nbqueue-worker-N")."""
    return [t.name for t in threading.enumerate() if t.name.startswith("nbqueue-worker-") and t.is_alive()]


def nbqueue_threads() -> list[str]:
    """Worker and keeper threads still alive."""
    return [t.name for t in threading.enumerate() if t.name.startswith(WORKER_PREFIXES) and t.is_alive()]


def stop_orphans() -> list[str]:
    """Stop every running Worker object in this process; returns their reprs."""
    from nbqueue.worker import Worker

    stopped = []
    for obj in gc.get_objects():
        if isinstance(obj, Worker) and obj.running:
            stopped.append(repr(obj))
            obj.stop(timeout=5)
    return stopped


def run(shell: Any, code: str) -> Any:
    """Run a cell in the shell; raise if it failed, return its result."""
    result = shell.run_cell(code)
    result.raise_error()
    return result.result
