"""nbqueue: a durable job queue in one SQLite file, with a Jupyter front end."""

from __future__ import annotations

import logging

from .clock import ManualClock
from .errors import (
    DatabaseFull,
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
    WaitTimeout,
)
from .jobs import Job, State
from .queue import Queue
from .retry import Backoff
from .tasks import Task
from .worker import Worker

__version__ = "0.1.0"

# A library never prints: without this, warnings would reach stderr via logging's last resort.
logging.getLogger("nbqueue").addHandler(logging.NullHandler())

__all__ = [
    "Backoff",
    "DatabaseFull",
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
    "PayloadError",
    "Queue",
    "ReadOnlyDatabase",
    "SchemaTooNew",
    "State",
    "StorageError",
    "Task",
    "TaskNotFound",
    "WaitTimeout",
    "Worker",
    "__version__",
]
