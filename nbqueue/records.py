"""What the storage hands up besides a job's own row (nbqueue.jobs.JobRow): its steps, its
attempts, a limit and a signed job's run, each read by name. Values as stored: times in
microseconds since the epoch, JSON as text."""

from __future__ import annotations

from typing import NamedTuple


class StepRow(NamedTuple):
    """A durable step as stored (times in microseconds)."""

    name: str
    value: str | None  #: its JSON, None after an error (a preview: its first characters)
    error: str | None
    attempt: int
    started_at: int
    finished_at: int


class AttemptRow(NamedTuple):
    """One attempt of a job as stored (times in microseconds; finished_at None while it runs)."""

    attempt: int
    started_at: int
    finished_at: int | None
    worker_id: str | None
    host: str | None
    pid: int | None
    outcome: str | None
    error: str | None


class LimitRow(NamedTuple):
    """A limit as stored, with the units running jobs hold of it now."""

    key: str
    concurrency: int | None
    rate: float | None
    burst: float
    tat: int
    paused_until: int | None
    paused_why: str | None
    in_flight: int


class RunRow(NamedTuple):
    """A signed job's run: the nonce its claim bound, and the MAC its result was vouched with."""

    nonce: str
    job_id: int
    finished_at: int | None
    result_mac: str | None
