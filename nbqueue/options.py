"""Job options, defined once: the keywords of enqueue and schedule, the magics' and CLI's flags.

A `JobOptions` is always valid: each field is checked (and durations turned
into seconds) when it is made, so whatever reaches the storage has been checked.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, NamedTuple, TypedDict

from .clock import Duration, seconds, utc_seconds
from .dependencies import when
from .errors import InvalidArgument, JobNotFound
from .jobs import stored_limits

MAX_UNITS = 10**9  # units of one limit key a job may take


class JobArgs(TypedDict, total=False):
    """The options a call may give: ``enqueue(payload, **options)``, ``schedule(..., **options)``."""

    queue: str
    priority: int
    delay: Duration | None
    run_at: datetime | None
    key: str | None
    max_retries: int
    timeout: Duration | None
    limits: Sequence[str] | Mapping[str, int] | None
    after: Sequence[Any] | None
    when: str


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How a job is queued: where, how urgent, when, how often retried, for how long."""

    #: The queue (a name) the job waits in.
    queue: str = "default"
    #: Higher runs first.
    priority: int = 0
    #: Seconds to wait before the job may run (or give run_at).
    delay: float | None = None
    #: The moment it may run (a timezone-aware datetime).
    run_at: datetime | None = None
    #: An idempotency key: a second enqueue while the first is unfinished returns the first.
    key: str | None = None
    #: Retries after the first attempt: the job runs at most max_retries + 1 times.
    max_retries: int = 3
    #: Seconds one attempt may run before it is failed.
    timeout: float | None = None
    #: The limit keys the job holds while it runs: a list (1 unit each) or {key: units}.
    limits: Mapping[str, int] | None = None
    #: The jobs it waits for (Jobs, ids, or a workflow's planned jobs).
    after: tuple[Any, ...] = ()
    #: What it waits for: "all_succeeded", "all_done" or "any_succeeded".
    when: str = "all_succeeded"

    def __post_init__(self) -> None:
        check_name(self.queue, "queue")
        check_priority(self.priority)
        if self.key is not None:
            check_name(self.key, "key")
        check_retries(self.max_retries)
        object.__setattr__(self, "delay", seconds(self.delay, "delay"))
        object.__setattr__(self, "timeout", check_timeout(self.timeout))
        object.__setattr__(self, "limits", limit_units(self.limits) or None)
        if self.after != ():  # (the common case, no parents, costs nothing)
            object.__setattr__(self, "after", parent_list(self.after))
        if self.when != "all_succeeded":
            object.__setattr__(self, "when", when(self.when).value)
        if self.run_at is not None:
            if self.delay is not None:
                raise InvalidArgument("give delay or run_at, not both")
            utc_seconds(self.run_at, "run_at")

    @classmethod
    def given(cls, options: JobArgs | dict[str, Any]) -> JobOptions:
        """Options exactly as a call gave them (None is a value here, checked like any other)."""
        if not options:  # the common call: no options, the defaults (checked once)
            return _DEFAULTS
        _known(options)
        return cls(**options)

    def but(self, options: JobArgs | dict[str, Any]) -> JobOptions:
        """These options (a task's defaults) with some replaced; None leaves a default alone."""
        if not options:
            return self
        _known(options)
        changes = {name: value for name, value in options.items() if value is not None}
        if "run_at" in changes and "delay" not in changes:
            changes["delay"] = None  # a call's run_at replaces a default delay
        if "delay" in changes and "run_at" not in changes:
            changes["run_at"] = None
        return replace(self, **changes)  # type: ignore[arg-type]  # each field checked in __post_init__


def _known(options: JobArgs | dict[str, Any]) -> None:
    unknown = sorted(set(options) - NAMES)
    if unknown:
        raise InvalidArgument(
            f"unknown job option {unknown[0]!r}; the options are: {', '.join(sorted(NAMES))}"
        )


NAMES = frozenset(f.name for f in fields(JobOptions))


# -- the same options as command-line flags (the magics and the CLI) ------------


class Flag(NamedTuple):
    """One job option as a command-line flag."""

    option: str
    flags: tuple[str, ...]
    type: Callable[[str], Any]
    help: str


def parent_list(value: object) -> tuple[Any, ...]:
    """`after=`: one job or a list of them (Jobs, ids, planned jobs), each with an integer id."""
    if value is None:
        return ()
    items = [value] if isinstance(value, int) or hasattr(value, "id") else value
    if isinstance(items, str | bytes | dict) or not isinstance(items, Iterable):
        raise InvalidArgument(f"after takes jobs or job ids, not {value!r}")
    found = tuple(items)
    for item in found:
        ref = getattr(item, "id", item)
        if isinstance(ref, bool) or not isinstance(ref, int):
            raise InvalidArgument(f"after takes jobs or job ids, not {item!r}")
    return found


def parse_limits(text: str) -> dict[str, int]:
    """ "openai,openai-tokens=1200" -> {"openai": 1, "openai-tokens": 1200} (for flags)."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, _, amount = part.partition("=")
        try:
            out[key.strip()] = int(amount) if amount else 1
        except ValueError:
            raise InvalidArgument(f"limits {text!r}: {amount!r} is not a whole number of units") from None
    return limit_units(out)


FLAGS = (
    Flag("queue", ("--queue", "-q"), str, "queue name"),
    Flag("delay", ("--delay", "-d"), float, "seconds before it may run"),
    Flag("priority", ("--priority", "-p"), int, "higher runs first"),
    Flag("max_retries", ("--retries", "-r"), int, "retries after the first attempt (default 3)"),
    Flag("key", ("--key", "-k"), str, "idempotency key"),
    Flag("timeout", ("--timeout",), float, "seconds an attempt may run"),
    Flag("limits", ("--limits",), parse_limits, "limit keys: a,b or a=2,tokens=1200"),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add every job option to an argparse parser (dest = the option's name)."""
    for flag in FLAGS:
        parser.add_argument(*flag.flags, dest=flag.option, type=flag.type, default=None, help=flag.help)


def from_flags(namespace: argparse.Namespace) -> JobArgs:
    """The job options given on a command line (those left out are not included)."""
    given = {f.option: getattr(namespace, f.option, None) for f in FLAGS}
    chosen: JobArgs = {k: v for k, v in given.items() if v is not None}  # type: ignore[assignment]
    return chosen


# -- argument checks (each names what was wrong) -----------------------------------


def check_name(value: object, what: str) -> str:
    """A queue, task or key name: non-empty text, under 1000 characters, no NUL."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > 1000 or "\x00" in value:
        raise InvalidArgument(f"{what} must be under 1000 characters with no NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} {value!r} is not valid unicode text (a lone surrogate)") from None
    return value


def check_priority(value: object) -> int:
    """A priority: an integer that fits the database."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"priority must be an integer, not {value!r}")
    if not -(2**62) < value < 2**62:
        raise InvalidArgument(f"priority {value} is out of range")
    return value


def check_retries(value: object) -> int:
    """max_retries: a whole number from 0 to 1000."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"max_retries must be a whole number >= 0, not {value!r}")
    if value > 1000:
        raise InvalidArgument(f"max_retries {value} is more than 1000")
    return value


def check_timeout(value: Duration | None) -> float | None:
    """A timeout: None, or seconds above 0."""
    timeout = seconds(value, "timeout")
    if timeout is not None and timeout <= 0:
        raise InvalidArgument("timeout must be more than 0 seconds (or None for no timeout)")
    return timeout


def check_hook(hook: Callable[..., object] | None, what: str) -> Callable[..., object] | None:
    """An on_complete / on_dead hook: None or a callable."""
    if hook is not None and not callable(hook):
        raise InvalidArgument(f"{what} must be a function taking the Job, not {hook!r}")
    return hook


def names(value: object, what: str) -> list[Any]:
    """One name or an iterable of names, as a list."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, bytes | dict) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be a name or a list of names, not {value!r}")
    return list(value)


def queue_names(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """The queues a worker or claim takes from: None for every queue, else at least one."""
    if value is None:
        return None
    found = names(value, "queues")
    if not found:
        raise InvalidArgument("queues must name at least one queue (or be None for every queue)")
    return tuple(dict.fromkeys(check_name(q, "queue") for q in found))


def check_id(value: object) -> int:
    """A job id: an integer any job could have (others cannot exist)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"job ids are integers, not {value!r}")
    if not 0 < value < 2**63:
        raise JobNotFound(f"no job with id {value}")
    return value


def limit_units(limits: object) -> dict[str, int]:
    """A job's `limits=`: a list of keys (1 unit each) or a dict of key -> units, checked."""
    if limits is None:
        return {}
    if isinstance(limits, str):
        limits = [limits]
    if isinstance(limits, Mapping):
        pairs = list(limits.items())
    elif isinstance(limits, Sequence):
        pairs = [(key, 1) for key in limits]
    else:
        raise InvalidArgument(f"limits must be a list of keys or a dict of key -> units, not {limits!r}")
    out: dict[str, int] = {}
    for key, amount in pairs:
        check_name(key, "limit key")
        if isinstance(amount, bool) or not isinstance(amount, int) or not 1 <= amount < MAX_UNITS:
            raise InvalidArgument(f"units of limit {key!r} must be a whole number >= 1, not {amount!r}")
        out[key] = amount
    return dict(sorted(out.items()))


def gate(limits: Mapping[str, int]) -> str:
    """The claim index groups jobs by the keys they hold: one line per set of keys."""
    return json.dumps(sorted(limits)) if limits else ""


def stored(limits: Mapping[str, int]) -> str | None:
    """A job's limits as stored (JSON), or None for an unlimited job."""
    return json.dumps(dict(sorted(limits.items())), separators=(",", ":")) if limits else None


def read_stored(text: object) -> dict[str, int]:
    """A job's limits read back as `stored` wrote them; InvalidArgument if the row holds anything
    else (text that is not JSON, a BLOB, units that enqueue would refuse)."""
    if isinstance(text, str):  # the few texts a queue's jobs hold, read once each
        return dict(_read_text(text))
    return _read(text)


@functools.lru_cache(maxsize=1024)
def _read_text(text: str) -> tuple[tuple[str, int], ...]:
    return tuple(_read(text).items())


def _read(text: object) -> dict[str, int]:
    try:
        found = stored_limits(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"limits cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None
    return limit_units(found)


def held_keys(text: object) -> list[str]:
    """The keys a stored limits text names (none if it cannot be read: the claim then buries
    that job with why, and reading the other jobs' keys goes on)."""
    try:
        return list(read_stored(text))
    except InvalidArgument:
        return []


_DEFAULTS = JobOptions()  # frozen: every call without options shares it
