"""The task registry: `@q.task` functions, known process-wide by name."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, Unpack

from .errors import InvalidArgument, TaskNotFound, Unretryable
from .options import JobArgs, JobOptions
from .retry import Backoff

if TYPE_CHECKING:
    from .jobs import Job

P = ParamSpec("P")
R = TypeVar("R")

_registry: dict[str, Task[Any, Any]] = {}
_registry_lock = threading.Lock()
_version = [0]  # moves on at every change, so workers can keep what they derived from it


class Producer(Protocol):
    """Where a task's calls are queued (a Queue's job manager)."""

    def enqueue_call(
        self, task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: JobArgs
    ) -> Job:
        """Queue `task(*args, **kwargs)` with the task's options, some replaced by `options`."""
        ...

    def enqueue_map(self, task: Task[Any, Any], items: Iterable[Any], options: JobArgs) -> list[Job]:
        """Queue `task(item)` for each item, in one transaction: all are written, or none."""
        ...


@dataclass(eq=False)
class Task(Generic[P, R]):
    """A function the queue can run later; calling it directly runs it now."""

    fn: Callable[P, R]
    name: str
    producer: Producer
    options: JobOptions = field(default_factory=JobOptions)
    backoff: Backoff | None = None
    opt_in: bool = False  # run only by workers that allow it by name (notebook code jobs)
    signed: bool = False  # run only jobs this user's processes queued (nbqueue.signing)
    own_process: bool = False  # it starts (and kills) a child itself: process mode runs it in a thread
    retry_on: tuple[type[BaseException], ...] | None = None  # only these errors are retried
    give_up_on: tuple[type[BaseException], ...] = ()  # these errors are dead at once
    on_complete: Callable[[Job], object] | None = None  # called after the outcome is committed
    on_dead: Callable[[Job], object] | None = None
    stream_bytes: int | None = None  # what a stream of its jobs keeps per attempt (None: the default)

    @property
    def queue(self) -> str:
        """The name of the queue the task's jobs wait in (unless a call names another)."""
        return self.options.queue

    @property
    def priority(self) -> int:
        """The task's default priority."""
        return self.options.priority

    @property
    def max_retries(self) -> int:
        """The task's default number of retries."""
        return self.options.max_retries

    @property
    def timeout(self) -> float | None:
        """Seconds an attempt may run (None: no limit)."""
        return self.options.timeout

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here and now, without the queue."""
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Queue a call with this task's defaults; durable when it returns."""
        return self.producer.enqueue_call(self, args, kwargs, {})

    def schedule(
        self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, **options: Unpack[JobArgs]
    ) -> Job:
        """Queue a call with options: later (delay, run_at), by priority, with an idempotency key,
        in another queue, with other retries or timeout."""
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise InvalidArgument(f"args must be a list or tuple of arguments, not {args!r}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise InvalidArgument(f"kwargs must be a dict, not {type(kwargs).__name__}")
        return self.producer.enqueue_call(self, tuple(args), kwargs or {}, options)

    def map(self, items: Iterable[Any], **options: Unpack[JobArgs]) -> list[Job]:
        """Queue one job per item, the item its one argument, in one transaction: all are
        written, or none (an item JSON cannot hold refuses the call, naming it). Options as for
        `schedule`, shared by every job (not `key`). Inside a running job its children are
        made once, like `enqueue`'s; inside a workflow's block they join the workflow."""
        return self.producer.enqueue_map(self, items, options)

    def __repr__(self) -> str:
        return f"<nbqueue task {self.name!r} queue={self.queue!r} max_retries={self.max_retries}>"


def default_name(fn: Callable[..., Any]) -> str:
    """The module-qualified name a task gets when none is given."""
    return f"{fn.__module__}.{fn.__qualname__}"


def register(task: Task[Any, Any]) -> None:
    """Make `task` runnable by every worker in this process (a newer definition wins)."""
    with _registry_lock:
        _version[0] += 1
        _registry[task.name] = task


def unregister(name: str) -> None:
    """Forget a task (for tests and notebooks that redefine things)."""
    with _registry_lock:
        _version[0] += 1
        _registry.pop(name, None)


def version() -> int:
    """A number that changes whenever a task is registered or forgotten."""
    return _version[0]


def snapshot() -> dict[str, Task[Any, Any]]:
    """Every registration as it stands (a test saves it, then `restore`s it)."""
    with _registry_lock:
        return dict(_registry)


def restore(saved: dict[str, Task[Any, Any]]) -> None:
    """Put the registrations back to a `snapshot`."""
    with _registry_lock:
        _version[0] += 1
        _registry.clear()
        _registry.update(saved)


def find(name: str | None) -> Task[Any, Any] | None:
    """The task registered under `name`, or None."""
    with _registry_lock:
        return None if name is None else _registry.get(name)


#: What a stream keeps per attempt unless its task says otherwise: 1 MiB of its newest items.
STREAM_BYTES = 1 << 20


def stream_bytes(name: str | None) -> int:
    """The bytes a stream of the task's jobs keeps per attempt (`@q.task(stream_bytes=...)`)."""
    task = find(name)
    return STREAM_BYTES if task is None or task.stream_bytes is None else task.stream_bytes


def lookup(name: str) -> Task[Any, Any]:
    """The task registered under `name`."""
    with _registry_lock:
        try:
            return _registry[name]
        except KeyError:
            raise TaskNotFound(
                f"no task named {name!r} is registered in this process; "
                "import the module that defines it (nbqueue worker --import ...)"
            ) from None


def runnable(allow: Collection[str] = ()) -> tuple[str, ...]:
    """Task names a worker may take: every task except opt-in ones not in `allow`."""
    with _registry_lock:
        return tuple(name for name, task in _registry.items() if not task.opt_in or name in allow)


def signed_names() -> tuple[str, ...]:
    """The registered tasks that run only jobs signed by this user."""
    with _registry_lock:
        return tuple(name for name, task in _registry.items() if task.signed)


def names() -> tuple[str, ...]:
    """Every registered task name, as a snapshot."""
    with _registry_lock:
        return tuple(_registry)


def missing(pending: dict[str | None, int], runs: Collection[str] | None = None) -> dict[str, int]:
    """Of the pending jobs per task, those of tasks not registered here (or not among `runs`):
    jobs that wait for their function (a kernel restarted, a worker without the import)."""
    known = set(names() if runs is None else runs)
    return {task: n for task, n in pending.items() if task is not None and task not in known and n}


def opt_in_names() -> tuple[str, ...]:
    """The registered tasks that run only where a worker allows them by name."""
    with _registry_lock:
        return tuple(name for name, task in _registry.items() if task.opt_in)


def unfit(fn: Any, job: Job) -> Unretryable | None:
    """If the job's arguments cannot bind to the function, why (no retry can mend that)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: let the call speak
        return None
    try:
        signature.bind(*job.args, **job.kwargs)
    except TypeError as exc:
        return Unretryable(f"the job's arguments do not fit {job.task}{signature}: {exc}")
    return None


def check_arguments(fn: Any, job: Job) -> None:
    """Before a child process is started for it: a call the function cannot take is Unretryable."""
    problem = unfit(fn, job)
    if problem is not None:
        raise problem
