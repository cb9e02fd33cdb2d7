"""Helpers shared by the notebook-layer tests (threads, polling, running cells)."""

from __future__ import annotations

import gc
import threading
from typing import Any

WORKER_PREFIXES = ("nbqueue-worker-", "nbqueue-keeper")


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
