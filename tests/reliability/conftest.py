"""Fixtures of the reliability suite: what nbqueue logs while a fault is under way."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.helpers import FAST_EXAMPLES, TEST_PROFILE

# Hypothesis profiles for a plain @given: "full" (make test) hypothesis's own sizes, "fast"
# (NBQUEUE_TEST_PROFILE=fast, make test-fast) a few examples. The models size themselves with
# tests.helpers.examples (their full size is not hypothesis's default).
settings.register_profile("full", settings())
settings.register_profile("fast", settings(max_examples=FAST_EXAMPLES))
settings.load_profile(TEST_PROFILE)


class Records(logging.Handler):
    """Collects what nbqueue logs, so a test can see what the worker went through."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._guard:
            self.records.append(record)

    def since(self, start: int, level: int = logging.WARNING) -> list[logging.LogRecord]:
        with self._guard:
            return [r for r in self.records[start:] if r.levelno >= level]

    def __len__(self) -> int:
        with self._guard:
            return len(self.records)


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("nbqueue")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # a flood of tracebacks would bury pytest's report
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
