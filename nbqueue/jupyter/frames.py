"""Jobs as pandas DataFrames with real dtypes (UTC datetimes, categories, integers)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependency
from ..jobs import Job, State

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


def _pandas() -> Any:
    try:
        import pandas  # noqa: PLC0415 - heavy: only when a frame is asked for
    except ImportError:
        raise MissingDependency(
            "DataFrames need pandas: pip install 'nbqueue[notebook]' (or pip install pandas)"
        ) from None
    return pandas


def jobs_frame(jobs: Sequence[Job]) -> pd.DataFrame:
    """One row per job, newest first as given; `duration` is finished - started."""
    pandas = _pandas()
    frame = pandas.DataFrame(
        {
            "id": pandas.array([j.id for j in jobs], dtype="int64"),
            "task": pandas.array([j.task for j in jobs], dtype="string"),
            "queue": pandas.Categorical([j.queue for j in jobs]),
            "status": pandas.Categorical([j.status.value for j in jobs], categories=[s.value for s in State]),
            "priority": pandas.array([j.priority for j in jobs], dtype="int64"),
            "attempts": pandas.array([j.attempts for j in jobs], dtype="int64"),
            "retries": pandas.array([j.retries for j in jobs], dtype="int64"),
            "max_retries": pandas.array([j.max_retries for j in jobs], dtype="int64"),
            "key": pandas.array([j.key for j in jobs], dtype="string"),
            **{
                name: pandas.to_datetime([getattr(j, name) for j in jobs], utc=True)
                for name in ("created_at", "run_at", "started_at", "finished_at", "updated_at")
            },
            "error": pandas.array([j.error for j in jobs], dtype="string"),
            "payload": [json.dumps(j.payload) for j in jobs],
            "result": [j.result_json for j in jobs],
            "output": pandas.array([j.output for j in jobs], dtype="string"),
            "worker_id": pandas.array([j.worker_id for j in jobs], dtype="string"),
        },
        columns=[c for c in COLUMNS if c != "duration"],
    )
    frame.insert(COLUMNS.index("duration"), "duration", frame["finished_at"] - frame["started_at"])
    result: pd.DataFrame = frame.set_index("id", drop=False).rename_axis(None)
    return result
