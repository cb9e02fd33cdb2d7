"""Every error nbqueue raises; one root, `NbqueueError`, so callers can catch them all."""

from __future__ import annotations


class NbqueueError(Exception):
    """Something went wrong in nbqueue."""


class InvalidArgument(NbqueueError, ValueError):
    """An argument given to nbqueue is not valid; the message names it."""


class PayloadError(InvalidArgument):
    """A payload, argument or result is not JSON; the message names the field."""


class JobNotFound(NbqueueError, LookupError):
    """No job has that id."""


class TaskNotFound(NbqueueError, LookupError):
    """No task is registered under that name in this process."""


class InvalidTransition(NbqueueError):
    """The job's state machine does not allow that change of state."""


class FamilyTooLarge(NbqueueError):
    """A running job's family (it, the jobs it made, theirs...) already holds the queue's
    `family_limit` jobs: the job it tried to make was not written."""


class LeaseLost(NbqueueError):
    """The claim on this job has expired or was taken over; nothing was changed."""


class JobFailed(NbqueueError):
    """The job ended dead or cancelled instead of completing."""

    def __init__(self, message: str, job: object = None) -> None:
        super().__init__(message)
        self.job = job


class WaitTimeout(NbqueueError, TimeoutError):
    """Waiting for a job or a worker took longer than the timeout."""


class StorageError(NbqueueError):
    """The storage under the queue failed; the message says how."""


class NotAQueueDatabase(StorageError):
    """The file is not an nbqueue database (or is corrupt)."""


class DamagedJob(StorageError):
    """A stored job cannot be read back (its row was damaged or written by hand)."""


class SchemaTooNew(StorageError):
    """The database was written by a newer nbqueue; upgrade nbqueue to open it."""


class ReadOnlyDatabase(StorageError):
    """The database cannot be written (read-only file or folder)."""


class DatabaseFull(StorageError):
    """The database or the disk under it is full; nothing was written."""


class Unretryable(NbqueueError):
    """No retry can mend this (a result that is not JSON, arguments the function cannot take):
    the job is dead at once, whatever its retry policy."""


class MissingDependency(NbqueueError, ImportError):
    """An optional dependency is missing; the message gives the pip command."""


class WaitExpired(Unretryable):
    """A wait (`nbqueue.wait_for`) reached its deadline with nothing sent and no default: never
    retried (the expiry is recorded, so every later run would expire the same way)."""
