"""What a running job keeps with its claim: its durable steps (`nbqueue.step`: a value recorded
once, replayed on the next attempt) and its files (a notebook job's executed notebook). Each is
written only under the live claim, so a worker whose claim is gone writes nothing.

A room of the JobManager (`manager.journal`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .context import StepBook
from .errors import InvalidArgument
from .jobs import Job
from .options import check_id
from .records import StepRow
from .storage import StepRecord, Storage
from .streams import Emitter


class Journal:
    """A queue's record of what its running jobs keep."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def step_book(self, job: Job) -> StepBook:
        """The durable steps of this claim of `job`: recorded only while the claim lives."""

        def record(name: str, value: str | None, error: str | None, started_us: int) -> str | None:
            step = StepRecord(job.id, job.attempts, name, value, error, started_us)
            return self.storage.record_step(step)

        return StepBook(job.id, lambda: self.storage.step_values(job.id), record)

    def emitter(self, job: Job, bound: int) -> Emitter:
        """The stream of this claim of `job` (its attempt: retries + 1), keeping `bound` bytes."""

        def write(items: list[tuple[int, str]], cut: bool) -> bool:
            return self.storage.emit(job.id, job.attempts, job.retries + 1, items, bound if cut else None)

        return Emitter(job.id, write, bound)

    def steps(self, job_id: int) -> list[StepRow]:
        """A job's recorded steps: name, value, error, attempt, started_at, finished_at."""
        return self.storage.steps(check_id(job_id))

    def step_previews(self, job_id: int, chars: int) -> list[StepRow]:
        """A job's recorded steps, each value cut to `chars` characters (a view reads no more):
        name, value, error, attempt, started_at, finished_at."""
        return self.storage.step_previews(check_id(job_id), chars)

    def save_file(self, job: Job, name: str, content: str) -> bool:
        """Keep a file with this claim of `job` (replacing one of that name); False (nothing
        written) once the claim is gone."""
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a file name is a non-empty string, not {name!r}")
        if not isinstance(content, str):
            raise InvalidArgument(f"a file's content is a string, not {type(content).__name__}")
        return self.storage.save_file(job.id, job.attempts, name, content)

    def load_file(self, job_id: int, name: str) -> str | None:
        """The content of a job's file `name`, or None if it has none."""
        return self.storage.load_file(check_id(job_id), name)

    def file_names(self, job_ids: Sequence[int]) -> dict[int, list[str]]:
        """The names of each job's files, sorted, for the jobs that have any."""
        ids = [check_id(i) for i in job_ids]
        return self.storage.file_names(ids) if ids else {}
