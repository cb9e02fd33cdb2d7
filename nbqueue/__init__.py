"""nbqueue: a durable job queue in one SQLite file, with a Jupyter front end."""

from __future__ import annotations

import logging
from typing import Any

from .aio import ForeignLoopError, per_loop, run_sync
from .clock import ManualClock
from .context import Cancelled, cancelled, progress
from .dependencies import Outcome, result_of, results_of
from .errors import (
    DamagedJob,
    DatabaseFull,
    FamilyTooLarge,
    InvalidArgument,
    InvalidTransition,
    JobFailed,
    JobNotFound,
    LeaseLost,
    MissingDependency,
    NbqueueError,
    NotAQueueDatabase,
    PayloadError,
    ReadOnlyDatabase,
    SchemaTooNew,
    StorageError,
    TaskNotFound,
    Unretryable,
    WaitExpired,
    WaitTimeout,
)
from .jobs import Job, Progress, State, Verdict
from .network import NETWORK_ERRORS
from .notebooks import CellFailed, NotebookError, output
from .queue import Queue
from .retry import Backoff, RetryAfter
from .steps import step
from .streams import Dropped, emit
from .suspend import Suspended, sleep, sleep_until, wait_for, wait_for_jobs
from .tasks import Task
from .worker import Worker
from .workflows import Workflow

__version__ = "0.1.0"

# A library never prints: without this, warnings would reach stderr via logging's last resort.
logging.getLogger("nbqueue").addHandler(logging.NullHandler())

__all__ = [
    "NETWORK_ERRORS",
    "Backoff",
    "Cancelled",
    "CellFailed",
    "DamagedJob",
    "DatabaseFull",
    "Dropped",
    "FamilyTooLarge",
    "ForeignLoopError",
    "InvalidArgument",
    "InvalidTransition",
    "Job",
    "JobFailed",
    "JobNotFound",
    "LeaseLost",
    "ManualClock",
    "MissingDependency",
    "NbqueueError",
    "NotAQueueDatabase",
    "NotebookError",
    "Outcome",
    "PayloadError",
    "Progress",
    "Queue",
    "ReadOnlyDatabase",
    "RetryAfter",
    "SchemaTooNew",
    "State",
    "StorageError",
    "Suspended",
    "Task",
    "TaskNotFound",
    "Unretryable",
    "Verdict",
    "WaitExpired",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "__version__",
    "cancelled",
    "emit",
    "output",
    "per_loop",
    "progress",
    "result_of",
    "results_of",
    "run_sync",
    "sleep",
    "sleep_until",
    "step",
    "wait_for",
    "wait_for_jobs",
]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext nbqueue`: register the magics."""
    from .jupyter import load_ipython_extension as load  # noqa: PLC0415 - IPython only here

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext nbqueue`: stop the notebook's worker and views."""
    from .jupyter import unload_ipython_extension as unload  # noqa: PLC0415

    unload(ipython)
