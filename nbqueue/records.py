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


class WaitRow(NamedTuple):
    """What a job waits for, or was sent, under one name (times in microseconds)."""

    job_id: int
    name: str
    kind: str | None  #: "event", "sleep" or "jobs"; None while only a value sent ahead is known
    prompt: str | None  #: an event's question for a person (None: an event for a program)
    choices: str | None  #: an event's allowed values, a JSON array (None: any value)
    deadline: int | None  #: an event's deadline, or a sleep's wake-up time
    value: str | None  #: the JSON value sent, once sent
    sent_by: str | None
    sent_at: int | None
    expired_at: int | None  #: when the wait expired (recorded: every later run sees the same)
    reached_at: int | None  #: when the job first reached it


class WaitSpec(NamedTuple):
    """A wait a running job reached (nbqueue.suspend), as the storage records it: an event
    (`wait_for`), a sleep, or jobs (`wait_for_jobs`). Times in microseconds. (A named tuple:
    one is made per run that reaches a wait, in a third of a frozen dataclass's time.)"""

    kind: str  # "event", "sleep" or "jobs"
    name: str
    prompt: str | None = None  # an event's question for a person; a jobs wait: the jobs, as text
    choices: str | None = None  # an event's allowed values: a JSON array
    timeout_us: int | None = None  # from when first reached: an event's deadline, a sleep's end
    until_us: int | None = None  # a sleep's wake-up time (sleep_until)
    jobs: tuple[int, ...] = ()  # a jobs wait's jobs
    when: str | None = None  # a jobs wait's condition (nbqueue.dependencies.When)


class Reached(NamedTuple):
    """What reaching a wait led to: "value" (the JSON `value`, sent or a sleep's None), "expired",
    "suspend" (the job is to wait until `wake`: its worker writes that, with its batch),
    "suspended" (the job waits now), "done" (its jobs are finished as it asked) or "doomed" (a
    job it waits for failed as it may not: the job is upstream_failed)."""

    outcome: str
    value: str | None = None
    wake: int | None = None  # when a job that is to wait wakes by itself (µs)


class Suspension(NamedTuple):
    """A run that reached a wait with nothing to return: its claim, the wait, and when it wakes
    by itself (µs). Written like a success, with the worker's batch."""

    job_id: int
    attempt: int
    wait: WaitSpec
    wake: int


class CheckpointRow(NamedTuple):
    """A checkpoint of a LangGraph thread as stored (nbqueue.checkpoints): its body is what the
    saver's serializer made of it without its channel values, which are stored once each."""

    thread: str
    ns: str
    id: str
    parent: str | None
    kind: str  #: the serializer's name for how `body` is encoded
    body: bytes
    versions: str  #: JSON {channel: version}: the stored values it reads


class StoredValue(NamedTuple):
    """One serialized value: a channel's value at a version, or a pending write's."""

    kind: str
    data: bytes


class PendingWriteRow(NamedTuple):
    """A write a task made after a checkpoint, before the next one (in LangGraph's sort order)."""

    task: str
    idx: int
    channel: str
    value: StoredValue
    path: str
