"""The board's picture, drawn with matplotlib as a small SVG: attempts finished and failed per
minute over the last hour, and per task the median time in queue next to time running.

matplotlib (in the notebook extra) is the plotting library people already read and that
`q.history().plot()` needs anyway; an SVG string drops into an HTML widget, so the board
needs no second front-end library. Drawn on a Figure object (no pyplot), so the board's
timer thread can draw while the kernel runs cells.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING, Any

from ..jobs import shown_task

if TYPE_CHECKING:
    import pandas as pd

TASKS_DRAWN = 6  # the busiest tasks in the timing panel
GREEN, RED, BLUE, GREY, AMBER = "#28a745", "#dc3545", "#0d6efd", "#adb5bd", "#fd7e14"


def task_timings(history: pd.DataFrame) -> pd.DataFrame:
    """Per task (as a person reads its name), over the finished jobs of `history`: jobs, and
    the median seconds in queue (created to started) and running (started to finished)."""
    import pandas  # noqa: PLC0415 - only with the board

    ran = history.dropna(subset=["started_at", "finished_at"])
    if ran.empty:
        return pandas.DataFrame(columns=["jobs", "queued", "running"], dtype="float64")
    frame = pandas.DataFrame(
        {
            "task": [shown_task(t) if isinstance(t, str) else "(payload)" for t in ran["task"]],
            "queued": (ran["started_at"] - ran["created_at"]).dt.total_seconds().clip(lower=0),
            "running": (ran["finished_at"] - ran["started_at"]).dt.total_seconds().clip(lower=0),
        }
    )
    grouped = frame.groupby("task")
    out: pd.DataFrame = grouped[["queued", "running"]].median()
    out.insert(0, "jobs", grouped.size())
    return out.sort_values("jobs", ascending=False)


def board_chart(activity: pd.DataFrame, timings: pd.DataFrame) -> str:
    """The two panels as one SVG (text, no XML prolog), or "" when there is nothing to draw."""
    if not int(activity[["completed", "failed", "snoozed"]].to_numpy().sum()) and timings.empty:
        return ""
    import matplotlib  # noqa: PLC0415 - heavy: only when the board draws
    from matplotlib.figure import Figure  # noqa: PLC0415

    # Text as text in the SVG (a fifth of the size); task names as plain text: a name like
    # "price $x^{$ total" is never read as mathtext, nor handed to TeX by a usetex rc setting.
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "text.parse_math": False, "text.usetex": False}):
        figure = Figure(figsize=(9.5, 1.5), layout="constrained")
        minutes, tasks = figure.subplots(1, 2, width_ratios=[3, 2])
        _activity(minutes, activity)
        _timings(tasks, timings.head(TASKS_DRAWN))
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    svg = text[text.index("<svg") :]
    # Scale with the output area: the viewBox stays, the fixed size in points goes.
    return re.sub(r'width="[\d.]+pt" height="[\d.]+pt"', 'width="100%" style="height:auto"', svg, count=1)


def _activity(axes: Any, activity: pd.DataFrame) -> None:
    x = range(len(activity))
    axes.bar(x, activity["completed"], width=0.9, color=GREEN, label="finished")
    axes.bar(x, -activity["failed"], width=0.9, color=RED, label="failed")
    # Snoozes (a 429, a RetryAfter) spend no attempt, but a storm of them is what a person asks about.
    axes.bar(x, -activity["snoozed"], bottom=-activity["failed"], width=0.9, color=AMBER, label="snoozed")
    axes.axhline(0, color=GREY, linewidth=0.5)
    axes.set_title("runs per minute, last hour (below: failed, snoozed)", fontsize=8, loc="left")
    ticks = list(range(0, len(activity), 15))
    axes.set_xticks(ticks, [f"{activity.index[i]:%H:%M}" for i in ticks], fontsize=7)
    axes.set_xlim(-0.5, len(activity) - 0.5)
    axes.tick_params(axis="y", labelsize=7)
    axes.yaxis.set_major_formatter(lambda v, _pos: f"{abs(v):g}")
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)


def _timings(axes: Any, timings: pd.DataFrame) -> None:
    names = [str(n)[:18] for n in timings.index]
    y = range(len(names))
    axes.barh(y, timings["queued"], color=GREY, label="in queue")
    axes.barh(y, timings["running"], left=timings["queued"], color=BLUE, label="running")
    axes.set_yticks(list(y), names, fontsize=7)
    axes.invert_yaxis()
    axes.set_title("median seconds per task: in queue | running", fontsize=8, loc="left")
    axes.tick_params(axis="x", labelsize=7)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
