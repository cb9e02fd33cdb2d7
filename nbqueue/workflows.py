"""Workflows: jobs made together, all or nothing, and the plans they are made from.

    with q.workflow("research") as wf:     # collected in memory: no write lock while your code runs
        p = plan.enqueue(topic)
        hits = [search.schedule(args=(nbqueue.result_of(p), i), after=[p]) for i in range(5)]
        write.schedule(args=(nbqueue.results_of(hits),), after=hits)
    wf.id, wf.jobs                          # inserted in one transaction when the block ends

Inside the block, enqueue and schedule return a `Planned` job: a handle that `after=`,
`result_of` and `results_of` accept; once the block has ended it stands for the real Job.
An exception in the block writes nothing.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .dag import svg
from .dependencies import any_made, referenced
from .errors import InvalidArgument, NbqueueError
from .jobs import Job
from .options import JobOptions
from .retry import Backoff


@dataclass(frozen=True)
class Plan:
    """A job to be written: what runs, with what, under which options (parents among them)."""

    task: str | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    payload: Any  # a raw payload job's payload (task None)
    options: JobOptions
    backoff: Backoff | None = None
    signed: bool = False
    origin: str | None = None

    @cached_property
    def placeholders(self) -> list[Any]:
        """The jobs its result_of / results_of placeholders name (looked for once)."""
        if not any_made():
            return []
        return [*referenced(self.args), *referenced(self.kwargs), *referenced(self.payload)]

    @property
    def parents(self) -> list[Any]:
        """Everything it waits for: `after=`, and the jobs its placeholders name."""
        return [*self.options.after, *self.placeholders] if self.options.after else self.placeholders


class Planned:
    """A job of a workflow not written yet: `after=` and `result_of` take it. Once the block has
    ended it stands for the real Job (its attributes and methods are the Job's)."""

    def __init__(self, workflow: Workflow, index: int, plan: Plan) -> None:
        self._workflow, self._index, self.plan = workflow, index, plan

    @property
    def id(self) -> int:
        """A placeholder id inside the block (negative); the real id after it."""
        job_id = self._workflow.written_id(self._index)
        return -(self._index + 1) if job_id is None else job_id

    @property
    def job(self) -> Job:
        """The Job this stands for (once the workflow's block has ended)."""
        job = self._workflow.written(self._index)
        if job is None:
            raise NbqueueError("this job is written when the workflow's `with` block ends")
        return job

    def __getattr__(self, name: str) -> Any:
        return getattr(self.job, name)

    def __await__(self) -> Any:
        return self.job.__await__()

    def __repr__(self) -> str:
        written = self._workflow.written(self._index)
        return (
            repr(written)
            if written is not None
            else f"<planned job {self._index + 1} of {self._workflow.name!r}>"
        )


@dataclass
class Workflow:
    """Jobs made together: `with q.workflow(name) as wf:` writes them in one transaction at exit."""

    name: str
    submit: Callable[[Workflow], tuple[int, list[int]]] = field(repr=False)  # (its id, its jobs' ids)
    read: Callable[[list[int]], list[Job]] | None = field(default=None, repr=False)  # jobs by id
    owner: object = field(default=None, repr=False)  # the queue's intake: other queues are not collected
    graph: Callable[[Workflow], list[tuple[Job, list[int]]]] | None = field(default=None, repr=False)
    plans: list[Plan] = field(default_factory=list, repr=False)
    id: int | None = None
    ids: list[int] = field(default_factory=list, repr=False)  # its jobs' ids, in the order made
    _jobs: list[Job] | None = field(default=None, repr=False)
    _token: Any = field(default=None, repr=False)

    @property
    def jobs(self) -> list[Job]:
        """Its jobs, in the order made, read when first asked for: a block of thousands of jobs
        is written without reading them back, as a loop of enqueues is."""
        if self._jobs is None and self.ids:
            assert self.read is not None
            self._jobs = self.read(self.ids)
        return self._jobs or []

    def add(self, plan: Plan) -> Planned:
        """Collect a job (done by enqueue and schedule inside the block)."""
        if self.id is not None:
            raise NbqueueError(f"workflow {self.name!r} was written already")
        self.plans.append(plan)
        return Planned(self, len(self.plans) - 1, plan)

    def written(self, index: int) -> Job | None:
        return self.jobs[index] if index < len(self.ids) else None

    def written_id(self, index: int) -> int | None:
        return self.ids[index] if index < len(self.ids) else None

    def __enter__(self) -> Workflow:
        self._token = _active.set(self)
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        _active.reset(self._token)
        if kind is None and self.plans:
            self.id, self.ids = self.submit(self)

    def __repr__(self) -> str:
        return f"<nbqueue workflow {self.name!r} id={self.id} jobs={len(self.plans)}>"

    def _repr_html_(self) -> str:
        """In a notebook: the workflow's graph as it stands, nodes coloured by state."""
        if self.id is None or self.graph is None:
            return html.escape(repr(self))
        return svg(self.graph(self), f"workflow {self.name!r} (#{self.id})")


_active: ContextVar[Workflow | None] = ContextVar("nbqueue_workflow", default=None)


def active() -> Workflow | None:
    """The workflow whose `with` block is running here, if any."""
    return _active.get()


class WrittenIds(Mapping[int, int]):
    """A workflow's placeholder ids (-1, -2, ...) -> the ids its jobs were given so far: a view
    of the list the write fills (a copy per job made writing n jobs cost n**2)."""

    def __init__(self, written: Sequence[int]) -> None:
        self._written = written

    def __getitem__(self, placeholder: int) -> int:
        if placeholder < 0 and -placeholder <= len(self._written):
            return self._written[-placeholder - 1]
        raise KeyError(placeholder)

    def __len__(self) -> int:
        return len(self._written)

    def __iter__(self) -> Iterator[int]:
        return (-(i + 1) for i in range(len(self._written)))


def check_name(name: object) -> str:
    """A workflow's name: non-empty text."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(f"a workflow needs a name, not {name!r}")
    return name


#: How many jobs a family may hold: a job not made by a job, every job made inside it while it
#: ran, and inside those, however deep. A size, not a depth: a job that enqueues two of itself
#: doubles each generation, so a depth limit of 100 would still allow 2**100 jobs; a size bounds
#: the rows a runaway family can write whatever its shape, and a legitimate fan-out of thousands
#: still fits. Queue(family_limit=...) sets another.
FAMILY_LIMIT = 10_000


def origin_of(parent_id: int, task: str | None, body: str, counts: dict[str, int]) -> str:
    """A child made by a running job is keyed by that job and the call (and how many such calls
    came before it in this attempt): attempt 2 finds what attempt 1 made instead of making it again."""
    digest = hashlib.sha256(f"{task}\n{body}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    seen = counts.get(digest, 0)
    counts[digest] = seen + 1
    return f"{parent_id}:{digest}:{seen}"
