"""Helpers shared by every test folder: `from tests.helpers import wait_until`.

A plain module (no fixtures): pytest puts the checkout on sys.path because tests/ is a package.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from nbqueue import Backoff, Queue

T = TypeVar("T")
MakeQueue = Callable[..., Queue]
QUICK_RETRY = Backoff(base=0.1, cap=0.1, jitter=0)  # a retry is due a tenth of a second later


def wait_until(
    condition: Callable[[], T], timeout: float = 10.0, what: str = "condition", every: float = 0.01
) -> T:
    """Poll `condition` every `every` seconds until it returns something truthy, and return that.

    Fails the test after `timeout` seconds with a message naming `what` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s (last value seen: {_short(value)})")
        time.sleep(every)


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- processes (process mode, cancelling a child) ---------------------------------------------


def alive(pid: int) -> bool:
    """True while a process with this pid exists and has not ended (a zombie waiting to be reaped
    by whoever adopted it has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the (command name)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def read_pids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().splitlines() if line.strip()]


def write_pid(path: str) -> None:
    with open(path, "a") as file:
        file.write(f"{os.getpid()}\n")


#: The test profile: NBQUEUE_TEST_PROFILE=fast (`make test-fast`) runs each property test at a few
#: examples (a smoke run); unset or "full" (`make test`) at its full size.
TEST_PROFILE = os.environ.get("NBQUEUE_TEST_PROFILE") or "full"
FAST_EXAMPLES = 15


def examples(full: int) -> int:
    """How many examples a property test runs: `full`, or at most FAST_EXAMPLES in the fast profile."""
    return min(full, FAST_EXAMPLES) if TEST_PROFILE == "fast" else full
