"""The task registry: `@q.task` functions, known process-wide by name."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from .clock import Duration
from .errors import InvalidArgument, TaskNotFound
from .retry import Backoff
from .schedule import Cron, Every

if TYPE_CHECKING:
    from .jobs import Job
    from .queue import Queue

P = ParamSpec("P")
R = TypeVar("R")

_registry: dict[str, Task[Any, Any]] = {}
_registry_lock = threading.Lock()


@dataclass(eq=False)
class Task(Generic[P, R]):
    """A function the queue can run later; calling it directly runs it now."""

    fn: Callable[P, R]
    name: str
    queue: Queue
    max_retries: int = 3
    backoff: Backoff | None = None
    queue_name: str = "default"
    priority: int = 0
    timeout: float | None = None
    opt_in: bool = False  # run only by workers that allow it by name (notebook code jobs)
    on_complete: Callable[[Job], object] | None = None  # called after the outcome is committed
    on_dead: Callable[[Job], object] | None = None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here and now, without the queue."""
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Queue a call with this task's defaults; durable when it returns."""
        return self.queue._enqueue_task(self, args, kwargs)

    def schedule(
        self,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        delay: Duration | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        key: str | None = None,
        queue: str | None = None,
        max_retries: int | None = None,
        timeout: Duration | None = None,
    ) -> Job:
        """Queue a call with options: later, at a time, by priority, with an idempotency key."""
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise InvalidArgument(f"args must be a list or tuple of arguments, not {args!r}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise InvalidArgument(f"kwargs must be a dict, not {type(kwargs).__name__}")
        return self.queue._enqueue_task(
            self,
            tuple(args),
            kwargs or {},
            delay=delay,
            run_at=run_at,
            priority=priority,
            key=key,
            queue=queue,
            max_retries=max_retries,
            timeout=timeout,
        )

    def __repr__(self) -> str:
        return f"<nbqueue task {self.name!r} queue={self.queue_name!r} max_retries={self.max_retries}>"


@dataclass(frozen=True)
class Periodic:
    """A task enqueued on a schedule, with fixed arguments."""

    task: Task[Any, Any]
    schedule: Every | Cron
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


_periodic: dict[str, Periodic] = {}


def register_periodic(periodic: Periodic) -> None:
    """Make every worker in this process enqueue `periodic` on its schedule."""
    with _registry_lock:
        _periodic[periodic.task.name] = periodic


def periodics() -> tuple[Periodic, ...]:
    """Every periodic task registered in this process, as a snapshot."""
    with _registry_lock:
        return tuple(_periodic.values())


def default_name(fn: Callable[..., Any]) -> str:
    """The module-qualified name a task gets when none is given."""
    return f"{fn.__module__}.{fn.__qualname__}"


def register(task: Task[Any, Any]) -> None:
    """Make `task` runnable by every worker in this process (a newer definition wins)."""
    with _registry_lock:
        _registry[task.name] = task


def unregister(name: str) -> None:
    """Forget a task (for tests and notebooks that redefine things)."""
    with _registry_lock:
        _registry.pop(name, None)
        _periodic.pop(name, None)


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


def names() -> tuple[str, ...]:
    """Every registered task name, as a snapshot."""
    with _registry_lock:
        return tuple(_registry)
