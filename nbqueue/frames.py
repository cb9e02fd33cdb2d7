"""Jobs as pandas DataFrames with real dtypes (UTC datetimes, categories, integers).

Built from the stored rows, not from Jobs: a row that cannot be decoded still
shows (its payload as the text stored), and no JSON is parsed for a table.
pandas is imported only when a frame is asked for, so a plain worker stays light.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from .clock import from_us
from .errors import MissingDependency
from .jobs import COLUMNS as STORED
from .jobs import Job, State
from .limits import format_rate
from .records import AttemptRow, LimitRow, StepRow, WaitRow

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = (
    "id",
    "task",
    "queue",
    "status",
    "priority",
    "attempts",
    "retries",
    "max_retries",
    "key",
    "created_at",
    "run_at",
    "started_at",
    "finished_at",
    "updated_at",
    "duration",
    "error",
    "payload",
    "result",
    "output",
    "worker_id",
)
TIMES = ("created_at", "run_at", "started_at", "finished_at", "updated_at")
INTEGERS = ("id", "priority", "attempts", "retries", "max_retries")
TEXTS = ("task", "key", "error", "output", "worker_id")


def _pandas() -> Any:
    try:
        import pandas  # noqa: PLC0415 - heavy: only when a frame is asked for
    except ImportError:
        raise MissingDependency("DataFrames need pandas: pip install pandas") from None
    return pandas


def jobs_frame(rows: Sequence[Sequence[Any]]) -> pd.DataFrame:
    """One row per stored job (in `nbqueue.jobs.COLUMNS` order), as given; `duration` = finished - started."""
    pandas = _pandas()
    column = {name: [row[i] for row in rows] for i, name in enumerate(STORED)}
    frame = pandas.DataFrame(
        {
            **{name: _integers(pandas, column[name]) for name in INTEGERS},
            **{name: pandas.array(column[name], dtype="string") for name in TEXTS},
            "queue": pandas.Categorical(column["queue"]),
            "status": pandas.Categorical(column["status"], categories=[s.value for s in State]),
            **{name: pandas.to_datetime([_time(v) for v in column[name]], utc=True) for name in TIMES},
            "payload": column["payload"],
            "result": column["result"],
        },
        columns=[c for c in COLUMNS if c != "duration"],
    )
    frame.insert(COLUMNS.index("duration"), "duration", frame["finished_at"] - frame["started_at"])
    result: pd.DataFrame = frame.set_index("id", drop=False).rename_axis(None)
    return result


def _integers(pandas: Any, values: list[Any]) -> Any:
    """int64; a column damaged by hand (text where a number belongs) becomes nullable Int64 with gaps."""
    try:
        return pandas.array(values, dtype="int64")
    except (TypeError, ValueError, OverflowError):
        return pandas.to_numeric(pandas.Series(values, dtype="object"), errors="coerce").astype("Int64").array


def _time(value: Any) -> Any:
    return from_us(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _next_start(row: LimitRow, now_us: int) -> float:
    """Seconds until the key's rate lets one more unit start (0: it may start now)."""
    rate, burst, tat = row.rate, float(row.burst or 0), int(row.tat or 0)
    if not rate:
        return 0.0
    return max(0.0, (tat - burst * 1e6 / float(rate) - now_us) / 1e6)


# What each column of a limits row holds when nbqueue wrote it (NoneType: it may be NULL).
_LIMIT_COLUMNS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    ("key", "text", (str,)),
    ("concurrency", "integer", (int, type(None))),
    ("rate", "number", (int, float, type(None))),
    ("burst", "number", (int, float)),
    ("tat", "integer", (int,)),
    ("paused_until", "integer", (int, type(None))),
    ("paused_why", "text", (str, type(None))),
    ("in flight", "number", (int, float, Decimal)),  # a sum: PostgreSQL's is numeric
)


def _limit_damage(row: LimitRow) -> str | None:
    """What is wrong with a limits row written by hand (text where a number belongs, a BLOB, a
    time out of range), or None: such a row is listed as damaged, never stops the frame."""
    for (name, kind, types), value in zip(_LIMIT_COLUMNS, row, strict=True):
        if isinstance(value, bool) or not isinstance(value, types):
            return f"its {name} is {value!r:.40}, not {kind}"
        endless = isinstance(value, float) and not math.isfinite(value)
        if endless or (name == "rate" and isinstance(value, int | float) and value <= 0):
            return f"its {name} is {value!r}"  # nbqueue writes only finite rates above zero
    try:
        from_us(row.paused_until)
    except (OverflowError, ValueError, OSError):
        return f"its paused_until {row.paused_until!r} is no time"
    return None


def limits_frame(rows: Sequence[LimitRow], waiting: dict[str, int], now_us: int) -> pd.DataFrame:
    """One row per limit key: what it allows, what holds it now, what waits, when its rate lets the
    next start go, and its pause; `damaged` says what is wrong with a row written by hand (its
    other columns then empty)."""
    pandas = _pandas()
    damage = [_limit_damage(r) for r in rows]
    rows = [
        r if why is None else LimitRow(str(r.key), None, None, 0.0, 0, None, None, 0)
        for r, why in zip(rows, damage, strict=True)
    ]

    def paused(until: Any) -> Any:
        return from_us(until) if isinstance(until, int) and until > now_us else None

    frame = pandas.DataFrame(
        {
            "key": pandas.array([r.key for r in rows], dtype="string"),
            "concurrency": pandas.array([r.concurrency for r in rows], dtype="Int64"),
            "rate": pandas.array(
                [None if r.rate is None else format_rate(r.rate) for r in rows], dtype="string"
            ),
            "burst": pandas.array([r.burst for r in rows], dtype="float64"),
            "in_flight": pandas.array([int(r.in_flight or 0) for r in rows], dtype="int64"),
            "waiting": pandas.array([waiting.get(r.key, 0) for r in rows], dtype="int64"),
            "next_start_in": pandas.array([_next_start(r, now_us) for r in rows], dtype="float64"),
            "paused_until": pandas.to_datetime([paused(r.paused_until) for r in rows], utc=True),
            "paused_why": pandas.array(
                [r.paused_why if paused(r.paused_until) else None for r in rows], dtype="string"
            ),
            "damaged": pandas.array(damage, dtype="string"),
        }
    )
    result: pd.DataFrame = frame
    return result


def graph_frame(graph: Sequence[tuple[Job, list[int]]]) -> pd.DataFrame:
    """One row per job of a graph: id, task, status, parents (a list of ids), when, root_cause,
    workflow, attempts, created_at, finished_at, error (its last line)."""
    pandas = _pandas()
    jobs = [job for job, _ in graph]
    frame = pandas.DataFrame(
        {
            "id": pandas.array([j.id for j in jobs], dtype="int64"),
            "task": pandas.array([j.task for j in jobs], dtype="string"),
            "status": pandas.Categorical([j.status.value for j in jobs], categories=[s.value for s in State]),
            "parents": [list(parents) for _, parents in graph],
            "when": pandas.array([j.when for j in jobs], dtype="string"),
            "root_cause": pandas.array([j.root_cause for j in jobs], dtype="Int64"),
            "workflow": pandas.array([j.workflow for j in jobs], dtype="Int64"),
            "attempts": pandas.array([j.attempts for j in jobs], dtype="int64"),
            "created_at": pandas.to_datetime([j.created_at for j in jobs], utc=True),
            "finished_at": pandas.to_datetime([j.finished_at for j in jobs], utc=True),
            "error": pandas.array([last_line(j.error) for j in jobs], dtype="string"),
        }
    )
    result: pd.DataFrame = frame.set_index("id", drop=False).rename_axis(None)
    return result


def stored_value(text: str | None) -> Any:
    """A stored JSON value, decoded; one written by hand that is not JSON stays the text stored
    (one damaged row never hides the others)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def steps_frame(rows: Sequence[StepRow]) -> pd.DataFrame:
    """One row per recorded step: step, status, attempt, started, finished, value (decoded JSON), error."""
    pandas = _pandas()
    frame = pandas.DataFrame(
        {
            "step": pandas.array([r.name for r in rows], dtype="string"),
            "status": pandas.Categorical(
                ["completed" if r.error is None else "failed" for r in rows],
                categories=["completed", "failed"],
            ),
            "attempt": pandas.array([r.attempt for r in rows], dtype="int64"),
            "started": pandas.to_datetime([_time(r.started_at) for r in rows], utc=True),
            "finished": pandas.to_datetime([_time(r.finished_at) for r in rows], utc=True),
            "value": [stored_value(r.value) for r in rows],
            "error": pandas.array([r.error for r in rows], dtype="string"),
        }
    )
    result: pd.DataFrame = frame
    return result


def schedules_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Schedules (JobManager.periodic.rows), soonest first; times in each schedule's own zone."""
    pandas = _pandas()
    columns = ["name", "task", "schedule", "tz", "next_run", "last_run", "stored", "notebook", "parameters"]
    soonest = sorted(
        rows, key=lambda row: (row["next_run"] is None, row["next_run"] and row["next_run"].timestamp())
    )
    frame: pd.DataFrame = pandas.DataFrame(soonest, columns=columns)
    return frame


def last_line(text: str | None) -> str | None:
    """The last line of an error (its exception), or None."""
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else None


def with_failures(frame: pd.DataFrame, failures: dict[int, int]) -> pd.DataFrame:
    """A jobs frame with a `failures` column: each job's failed attempts (0 when none)."""
    pandas = _pandas()
    frame["failures"] = pandas.array([failures.get(int(i), 0) for i in frame["id"]], dtype="int64")
    return frame


def attempts_frame(rows: Sequence[AttemptRow]) -> pd.DataFrame:
    """One row per attempt (in order): attempt, started, finished,
    duration (seconds, NaN while running), worker, host, pid, outcome ("running" while it runs), error."""
    pandas = _pandas()
    started = pandas.to_datetime([_time(r.started_at) for r in rows], utc=True)
    finished = pandas.to_datetime([_time(r.finished_at) for r in rows], utc=True)
    frame = pandas.DataFrame(
        {
            "attempt": pandas.array([int(r.attempt) for r in rows], dtype="int64"),
            "started": started,
            "finished": finished,
            "duration": pandas.array(
                [
                    (r.finished_at - r.started_at) / 1e6 if r.finished_at is not None else float("nan")
                    for r in rows
                ],
                dtype="float64",
            ),
            "worker": pandas.array([r.worker_id for r in rows], dtype="string"),
            "host": pandas.array([r.host for r in rows], dtype="string"),
            "pid": pandas.array([r.pid for r in rows], dtype="Int64"),
            "outcome": pandas.array([r.outcome or "running" for r in rows], dtype="string"),
            "error": pandas.Series([r.error for r in rows], dtype="object"),
        }
    )
    result: pd.DataFrame = frame
    return result


def activity_frame(first: int, minutes: int, counts: dict[int, tuple[int, int, int]]) -> pd.DataFrame:
    """Per minute from minute number `first` (time // 60 s) on, `minutes` of them: completed,
    failed and snoozed."""
    pandas = _pandas()
    numbers = range(first, first + minutes)
    index = pandas.DatetimeIndex([from_us(m * 60_000_000) for m in numbers], name="minute")
    columns = {
        name: pandas.array([counts.get(m, (0, 0, 0))[i] for m in numbers], dtype="int64")
        for i, name in enumerate(("completed", "failed", "snoozed"))
    }
    frame = pandas.DataFrame(columns, index=index)
    result: pd.DataFrame = frame
    return result


def waiting_frame(rows: Sequence[tuple[Job, WaitRow | None, str]]) -> pd.DataFrame:
    """One row per waiting job (q.waiting): id, task, queue, waits_for (text), name, kind, prompt,
    choices (a list, or None), deadline (an event's, or a sleep's wake-up), since (suspended)."""
    pandas = _pandas()
    frame = pandas.DataFrame(
        {
            "id": pandas.array([j.id for j, _, _ in rows], dtype="int64"),
            "task": pandas.array([j.task for j, _, _ in rows], dtype="string"),
            "queue": pandas.array([j.queue for j, _, _ in rows], dtype="string"),
            "waits_for": pandas.array([text for _, _, text in rows], dtype="string"),
            "name": pandas.array([None if w is None else w.name for _, w, _ in rows], dtype="string"),
            "kind": pandas.array([None if w is None else w.kind for _, w, _ in rows], dtype="string"),
            "prompt": pandas.array(
                [None if w is None or w.kind != "event" else w.prompt for _, w, _ in rows], dtype="string"
            ),
            "choices": [None if w is None else stored_value(w.choices) for _, w, _ in rows],
            "deadline": pandas.to_datetime(
                [None if w is None else _time(w.deadline) for _, w, _ in rows], utc=True
            ),
            "since": pandas.to_datetime([j.updated_at for j, _, _ in rows], utc=True),
        }
    )
    result: pd.DataFrame = frame
    return result
