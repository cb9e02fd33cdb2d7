"""The `nbqueue` command: worker, notebook, stats, jobs, graph, steps, waiting, send, requeue,
cancel, purge; thin over Queue."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from .cells import CELL_TASK
from .clock import MAX_SECONDS, from_us
from .errors import NbqueueError
from .frames import stored_value
from .jobs import NOTEBOOK_TASK, State, attempt_text, shown_task
from .notebooks import parameter
from .queue import Queue
from .targets import ENVIRONMENT, mask_in, redact

COMMANDS = {
    "worker": "run jobs until SIGINT/SIGTERM (the running job finishes or is released)",
    "notebook": "queue a run of a notebook with parameters (a worker with --allow-code runs it)",
    "schedules": "the periodic schedules kept in the queue, with their next run (--remove NAME)",
    "stats": "count the jobs in each state",
    "jobs": "list jobs, newest first",
    "show": "one job in full: its state, attempt, arguments, error and output",
    "graph": "the jobs linked to a job by after= (its workflow's graph), with their parents",
    "steps": "a job's durable steps (nbqueue.step) and their values",
    "waiting": "the jobs that wait (nbqueue.wait_for, sleep, wait_for_jobs), and for what",
    "send": "send a value to a job's wait (what its nbqueue.wait_for(NAME) returns)",
    "requeue": "give dead or cancelled jobs a fresh start",
    "cancel": "cancel jobs that have not finished",
    "purge": "delete finished jobs, for example completed ones older than 7 days",
}

#: Commands that only read, or change only jobs that must already be there: a missing SQLite
#: file is refused ("no queue at PATH") instead of being created empty.
EXISTING_ONLY = frozenset(COMMANDS) - {"worker", "notebook"}

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

# C0 and C1 controls and DEL, as the text a person reads: printed raw, a job's name, error or
# output could clear the screen, set the title, write the clipboard (OSC 52) or overwrite a
# line with a fake one. Human output only: --json escapes them its own way.
_ESCAPED = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {9: "\\t", 13: "\\r"}
_ESCAPED_BUT_LINES = {c: text for c, text in _ESCAPED.items() if c != 10}


def plain(text: object, lines: bool = False) -> str:
    """`text` safe to print to a terminal: control characters escaped (``\\x1b``); with
    `lines`, newlines kept (a traceback, an output), every other control still escaped."""
    return str(text).translate(_ESCAPED_BUT_LINES if lines else _ESCAPED)


class _PlainFormatter(logging.Formatter):
    """The worker's log lines (which quote tasks and errors) with control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return plain(super().format(record), lines=True)


def duration(text: str) -> float:
    """'90', '90s', '15m', '12h', '7d', '2w' or '1d12h' as seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", text.strip().lower())
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", "", text.strip().lower()).strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 15m, 12h or 7d")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one name")
    return names


def sent_value(text: str) -> Any:
    """A value given on a command line: JSON when it reads as JSON (`3` is 3, `{"a": 1}` an
    object, `"3"` the text 3), else the text itself (`approve`). NaN and Infinity stay text:
    they are not JSON, and a queue refuses them."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError:
        return text


def sent_text(job_id: int, name: str, value: Any, woke: bool) -> str:
    """What a send did, as a person reads it (the CLI's `send` and the `%send` magic)."""
    what = "it runs again" if woke else "kept for its wait"
    return plain(f"job {job_id}: sent {name} = {json.dumps(value)}; {what}")


def parser() -> argparse.ArgumentParser:
    """The argument parser (also read by the README test)."""
    top = argparse.ArgumentParser(
        prog="nbqueue", description="A durable job queue in one SQLite file (or PostgreSQL)."
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cmd = {name: sub.add_parser(name, help=text, description=text) for name, text in COMMANDS.items()}
    for p in cmd.values():
        p.add_argument(
            "database",
            nargs="?",
            default=None,
            help="the queue: a SQLite file path or a postgresql:// URL (default: $NBQUEUE_URL)",
        )
    w = cmd["worker"]
    w.add_argument(
        "--import",
        "-i",
        dest="imports",
        action="append",
        default=[],
        type=_names,
        metavar="MODULE",
        help="module(s) defining tasks; repeat or comma-separate",
    )
    w.add_argument("--concurrency", "-c", type=int, default=1, help="jobs at once (default 1)")
    w.add_argument("--queues", "-q", type=_names, default=None, help="comma-separated queue names")
    w.add_argument("--lease", type=duration, default=60.0, help="claim lease (default 60s)")
    w.add_argument(
        "--grace",
        type=duration,
        default=30.0,
        help="on stop, how long the running job may finish before it is released",
    )
    w.add_argument(
        "--allow-code",
        action="store_true",
        help="also run queued code (%%%%enqueue cells, notebook jobs): only for trusted queues",
    )
    w.add_argument(
        "--notebook-dir",
        default=None,
        help="where notebook jobs' executed notebooks go (default: nbqueue-notebooks/ beside a "
        "SQLite file, else in the working folder)",
    )
    w.add_argument(
        "--mode",
        choices=["thread", "process"],
        default="thread",
        help="process: each job in a child process, killed at its timeout or on cancel",
    )
    w.add_argument(
        "--retention",
        type=duration,
        default=None,
        help="prune completed jobs older than this (like 7d); dead jobs are kept",
    )
    w.add_argument("--verbose", "-v", action="store_true", help="log each job")
    nb = cmd["notebook"]
    nb.add_argument("path", help="the .ipynb file (copied into the job now)")
    nb.add_argument(
        "--parameter",
        "-p",
        dest="parameters",
        action="append",
        default=[],
        type=parameter,
        metavar="NAME=VALUE",
        help="a parameter (repeatable); a value that reads as JSON is that value (n=21 is a number)",
    )
    nb.add_argument("--timeout", type=duration, default=None, help="kill the run after this long")
    nb.add_argument("--max-retries", type=int, default=None, help="retries after a failed run")
    nb.add_argument("--html", action="store_true", help="also export the executed notebook as HTML")
    nb.add_argument("--queue", "-q", default=None, help="the queue name (default: default)")
    nb.add_argument(
        "--cron", default=None, help="run it on this schedule instead of once (kept in the queue)"
    )
    nb.add_argument("--every", type=duration, default=None, help="or every this long (like 1h)")
    nb.add_argument("--tz", default=None, help="the cron's IANA time zone, like Europe/Berlin (default UTC)")
    nb.add_argument("--name", default=None, help="the schedule's name (default: the file's name)")
    sc = cmd["schedules"]
    sc.add_argument("--remove", metavar="NAME", default=None, help="forget this schedule")
    sc.add_argument("--json", action="store_true", help="print JSON")
    j = cmd["jobs"]
    j.add_argument("--status", "-s", choices=[s.value for s in State], help="only this state")
    j.add_argument("--queue", "-q", help="only this queue")
    j.add_argument("--limit", "-n", type=int, default=50, help="how many (default 50)")
    for name in ("show", "graph", "steps"):
        cmd[name].add_argument("id", type=int, help="a job id")
    cmd["waiting"].add_argument("--queue", "-q", help="only this queue")
    for name in ("stats", "jobs", "show", "graph", "steps", "waiting"):
        cmd[name].add_argument("--json", action="store_true", help="print JSON")
    se = cmd["send"]
    se.add_argument("id", type=int, help="a job id")
    se.add_argument("name", help="the name it waits for (nbqueue.wait_for(NAME))")
    se.add_argument("value", help="the value: JSON when it reads as JSON (3, true, {...}), else text")
    se.add_argument("--by", default=None, help="who sends (default: your user name and host)")
    r = cmd["requeue"]
    r.add_argument("ids", nargs="*", type=int, help="job ids")
    r.add_argument("--all-dead", action="store_true", help="every dead job")
    r.add_argument(
        "--reload", action="store_true", help="notebook jobs run the notebook file as it is now (fixed)"
    )
    cmd["cancel"].add_argument("ids", nargs="+", type=int, help="job ids")
    pu = cmd["purge"]
    pu.add_argument(
        "--status",
        "-s",
        action="append",
        choices=["completed", "dead", "cancelled", "upstream_failed"],
        help="state to purge (repeatable; default completed)",
    )
    pu.add_argument("--older-than", type=duration, default=None, help="age, like 7d or 12h")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    top = parser()
    args = top.parse_args(argv)
    if args.command == "requeue" and bool(args.ids) == bool(args.all_dead):
        top.error("requeue takes job ids or --all-dead (one of the two)")
    if args.command == "requeue" and args.reload and args.all_dead:
        top.error("requeue --reload takes the notebook jobs to reload by id, not --all-dead")
    if args.command == "worker" and args.concurrency < 1:
        top.error("--concurrency must be at least 1")
    if args.command == "jobs" and args.limit < 0:
        top.error("--limit must be 0 or more")
    if args.command == "worker" and args.grace > MAX_SECONDS:
        top.error("--grace must be under a century")
    if args.database is None and not os.environ.get(ENVIRONMENT):
        top.error(f"give the queue (a SQLite file or a postgresql:// URL), or set {ENVIRONMENT}")
    target = args.database or os.environ[ENVIRONMENT]
    if args.command in EXISTING_ONLY and _missing_file(target):
        print(f"nbqueue: error: no queue at {target}", file=sys.stderr)
        return 1
    try:
        with Queue(args.database) as queue:
            return int(_COMMANDS[args.command](queue, args) or 0)
    except NbqueueError as exc:
        shown = redact(args.database or "")
        message = mask_in(str(exc), args.database) if args.database else str(exc)
        where = "" if not shown or shown in message else f"{shown}: "
        print(f"nbqueue: error: {plain(where + message, lines=True)}", file=sys.stderr)
        return 1


def _missing_file(target: str) -> bool:
    """True when `target` names a SQLite file that does not exist (a URL is never missing)."""
    return "://" not in target and not os.path.exists(target)


def _most_first(counts: dict[str | None, int]) -> dict[str | None, int]:
    """Tasks by how many jobs they have, most first; then by name, raw payloads last."""
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0] is None, shown_task(kv[0]))))


def _unserved(queue: Queue, runnable: Sequence[str], queues: Sequence[str] | None) -> str | None:
    """What a worker that runs `runnable` says about pending jobs of other tasks (None: nothing)."""
    waiting = _most_first(queue.pending_per_task(queues))
    missing = {task: n for task, n in waiting.items() if task is not None and task not in runnable}
    if not missing:
        return None
    total = sum(missing.values())
    named = ", ".join(f"{plain(shown_task(task))} ({n})" for task, n in missing.items())
    code = {CELL_TASK, NOTEBOOK_TASK}
    hints = []
    if set(missing) - code:
        hints.append("--import MODULE")
    if set(missing) & code:
        hints.append("--allow-code (queued code: only for a queue you trust)")
    return (
        f"nbqueue worker: no task here for {total} pending job(s) of: {named}; "
        f"start the worker with {' or '.join(hints)}"
    )


def _worker(queue: Queue, args: argparse.Namespace) -> int:
    handler = logging.StreamHandler()
    handler.setFormatter(_PlainFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    sys.path.insert(0, os.getcwd())  # `--import mypkg.tasks` from the project folder
    for module in (m for group in args.imports for m in group):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"nbqueue: error: cannot import {module}: {exc}", file=sys.stderr)
            return 2
    from . import tasks as registry  # noqa: PLC0415

    worker = queue.worker(
        queues=args.queues,
        concurrency=args.concurrency,
        lease=args.lease,
        allow=registry.opt_in_names() if args.allow_code else (),
        allow_code=args.allow_code,  # %%enqueue cells (in a fresh namespace) and notebook jobs
        notebook_dir=args.notebook_dir,
        mode=args.mode,
        retention=args.retention,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    unserved = _unserved(queue, registry.runnable(worker.allow), args.queues)
    if unserved:
        print(unserved, file=sys.stderr, flush=True)
    worker.start()
    print(
        f"nbqueue worker {worker.worker_id} on {queue}: "
        f"{len(registry.names())} task(s), concurrency {args.concurrency}; Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    while not stop.wait(0.5):
        if not worker.running:
            return 1
    print("nbqueue worker stopping...", file=sys.stderr, flush=True)
    worker.stop(timeout=args.grace)
    status = worker.status()
    print(
        f"nbqueue worker stopped: {status['completed']} completed, {status['failed']} failed", file=sys.stderr
    )
    return 0


def _notebook(queue: Queue, args: argparse.Namespace) -> int:
    options: dict[str, Any] = {"timeout": args.timeout}
    if args.max_retries is not None:
        options["max_retries"] = args.max_retries
    if args.queue is not None:
        options["queue"] = args.queue
    outputs = ("ipynb", "html") if args.html else ("ipynb",)
    if args.cron is not None or args.every is not None:
        name = queue.periodic_notebook(
            args.path,
            args.cron,
            every=args.every,
            tz=args.tz,
            parameters=dict(args.parameters),
            name=args.name,
            outputs=outputs,
            **options,
        )
        print(f"scheduled notebook {args.path} as {name!r}; workers with --allow-code run it")
        return 0
    if args.tz is not None or args.name is not None:
        print("nbqueue: error: --tz and --name belong to a schedule (--cron or --every)", file=sys.stderr)
        return 2
    job = queue.enqueue_notebook(args.path, dict(args.parameters), outputs=outputs, **options)
    print(f"queued notebook job {job.id} ({args.path})")
    return 0


def _schedules(queue: Queue, args: argparse.Namespace) -> int:
    if args.remove is not None:
        if not queue.unschedule(args.remove):
            print(f"nbqueue: error: no schedule named {args.remove!r}", file=sys.stderr)
            return 1
        print(f"removed schedule {args.remove!r}")
        return 0
    rows = [row for row in queue.schedule_rows() if row["stored"]]
    if args.json:
        shown = [
            {**row, "next_run": _iso(row["next_run"]), "last_run": _iso(row["last_run"])} for row in rows
        ]
        print(json.dumps(shown))
        return 0
    if not rows:
        print(f"no schedules in {queue}")
        return 0
    print(f"{'name':<20}  {'schedule':<40}  {'next run (local)':<25}  notebook")
    for row in rows:
        upcoming = _iso(row["next_run"]) or "-"
        name, schedule, notebook = (plain(row[k] or "") for k in ("name", "schedule", "notebook"))
        print(f"{name[:20]:<20}  {schedule[:40]:<40}  {upcoming:<25}  {notebook}")
    return 0


def _iso(moment: Any) -> str | None:
    return None if moment is None else str(moment.isoformat())


def _stats(queue: Queue, args: argparse.Namespace) -> int:
    counts = queue.counts()
    if args.json:
        print(json.dumps(counts))
    else:
        width = max(len(s) for s in counts)
        for state, n in counts.items():
            print(f"{state:<{width}}  {n}")
        print(f"{'total':<{width}}  {sum(counts.values())}")
        if counts["pending"]:
            waiting = _most_first(queue.pending_per_task())
            print()
            for task, n in waiting.items():
                if task is None:
                    print(f"{n} pending raw payload job(s) (taken by claim(), never by a worker)")
                else:
                    print(f"{n} pending job(s) of task {plain(shown_task(task))}")
    return 0


def _jobs(queue: Queue, args: argparse.Namespace) -> int:
    jobs = queue.jobs(status=args.status, queue=args.queue, limit=args.limit)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": j.id,
                        "status": j.status.value,
                        "queue": j.queue,
                        "task": j.task,
                        "attempt": attempt_text(j),
                        "attempts": j.attempts,
                        "retries": j.retries,
                        "max_retries": j.max_retries,
                        "run_at": j.run_at.isoformat(),
                        "error": j.error,
                        "root_cause": j.root_cause,
                    }
                    for j in jobs
                ]
            )
        )
        return 0
    if not jobs:
        what = f"{args.status} jobs" if args.status else "jobs"
        where = f" in queue {args.queue!r}" if args.queue else ""
        print(f"no {what}{where} in {queue}")
        return 0
    attempts = [attempt_text(j) for j in jobs]
    wide = max(len("attempt"), *map(len, attempts))
    print(
        f"{'id':>6}  {'status':<15}  {'queue':<10}  {'task':<24}  {'attempt':<{wide}}  "
        f"{'run at (UTC)':<19}  error"
    )
    for j, attempt in zip(jobs, attempts, strict=True):
        error = (j.error or "").strip().splitlines()[-1:] or [""]
        print(
            f"{j.id:>6}  {j.status.value:<15}  {plain(j.queue)[:10]:<10}  "
            f"{plain(shown_task(j.task))[:24]:<24}  {attempt:<{wide}}  "
            f"{j.run_at:%Y-%m-%d %H:%M:%S}  {plain(error[0])[:60]}"
        )
    return 0


def _show(queue: Queue, args: argparse.Namespace) -> int:
    job = queue.get(args.id)
    if args.json:
        print(
            json.dumps(
                {
                    "id": job.id,
                    "status": job.status.value,
                    "queue": job.queue,
                    "task": job.task,
                    "attempt": attempt_text(job),
                    "attempts": job.attempts,
                    "retries": job.retries,
                    "max_retries": job.max_retries,
                    "priority": job.priority,
                    "key": job.key,
                    "payload": job.payload,
                    "run_at": job.run_at.isoformat(),
                    "created_at": job.created_at.isoformat(),
                    "updated_at": job.updated_at.isoformat(),
                    "worker_id": job.worker_id,
                    "result": job.value if job.status is State.COMPLETED else None,
                    "error": job.error,
                    "output": job.output,
                    "root_cause": job.root_cause,
                    "waits_for": job.waits_for,
                }
            )
        )
        return 0
    rows = [
        ("status", job.status.value),
        ("task", shown_task(job.task)),
        ("attempt", attempt_text(job)),
        ("queue", job.queue),
        ("priority", str(job.priority)),
        ("key", job.key or "-"),
        ("run at (UTC)", f"{job.run_at:%Y-%m-%d %H:%M:%S}"),
        ("created (UTC)", f"{job.created_at:%Y-%m-%d %H:%M:%S}"),
        ("payload", json.dumps(job.payload)[:500]),
    ]
    if job.worker_id:
        rows.append(("worker", job.worker_id))
    if job.status is State.COMPLETED:
        rows.append(("result", (job.result_json or "null")[:500]))
    if job.root_cause is not None:
        rows.append(("root cause", f"job {job.root_cause}"))
    if job.status is State.WAITING:
        rows.append(("waits for", job.waits_for or "-"))
    print(f"job {job.id}")
    for name, value in rows:
        print(f"  {name:<14} {plain(value)}")
    for name, text in (("error", job.error), ("output", job.output)):
        if text and text.strip():
            print(f"{name}:")
            print("\n".join(f"  {plain(line)}" for line in text.rstrip().split("\n")))
    return 0


def _graph(queue: Queue, args: argparse.Namespace) -> int:
    graph = queue.graph_rows(args.id)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": job.id,
                        "task": job.task,
                        "status": job.status.value,
                        "parents": parents,
                        "root_cause": job.root_cause,
                    }
                    for job, parents in graph
                ]
            )
        )
        return 0
    print(f"{'id':>6}  {'status':<15}  {'task':<24}  parents")
    for job, parents in graph:
        cause = f"  (root cause: job {job.root_cause})" if job.root_cause else ""
        named = ", ".join(map(str, parents)) or "-"
        print(f"{job.id:>6}  {job.status.value:<15}  {plain(shown_task(job.task))[:24]:<24}  {named}{cause}")
    return 0


def _steps(queue: Queue, args: argparse.Namespace) -> int:
    rows = [
        {
            "step": name,
            "status": "completed" if error is None else "failed",
            "attempt": attempt,
            "value": stored_value(value),
            "error": error,
        }
        for name, value, error, attempt, _started, _finished in queue.step_rows(args.id)
    ]
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        queue.get(args.id)  # an unknown job is an error, not an empty list
        print(f"job {args.id} has no recorded steps")
        return 0
    print(f"{'step':<24}  {'status':<9}  {'attempt':>7}  value / error")
    for row in rows:
        shown = json.dumps(row["value"]) if row["error"] is None else str(row["error"]).strip()
        last = plain(shown.splitlines()[-1]) if shown else ""
        print(f"{plain(row['step'])[:24]:<24}  {row['status']:<9}  {row['attempt']:>7}  {last[:70]}")
    return 0


def _waiting(queue: Queue, args: argparse.Namespace) -> int:
    rows = queue.waiting_rows(args.queue)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": job.id,
                        "task": job.task,
                        "queue": job.queue,
                        "waits_for": text,
                        "name": None if wait is None else wait.name,
                        "kind": None if wait is None else wait.kind,
                        "prompt": None if wait is None or wait.kind != "event" else wait.prompt,
                        "choices": None if wait is None else stored_value(wait.choices),
                        "deadline": _iso(from_us(None if wait is None else wait.deadline)),
                        "since": job.updated_at.isoformat(),
                    }
                    for job, wait, text in rows
                ]
            )
        )
        return 0
    if not rows:
        where = f" in queue {args.queue!r}" if args.queue else ""
        print(f"no waiting jobs{where} in {queue}")
        return 0
    print(f"{'id':>6}  {'task':<24}  {'deadline (UTC)':<19}  waits for")
    for job, wait, text in rows:
        deadline = from_us(None if wait is None else wait.deadline)
        due = "-" if deadline is None else f"{deadline:%Y-%m-%d %H:%M:%S}"
        print(f"{job.id:>6}  {plain(shown_task(job.task))[:24]:<24}  {due:<19}  {plain(text)}")
    return 0


def _send(queue: Queue, args: argparse.Namespace) -> int:
    value = sent_value(args.value)
    woke = queue.send(args.id, args.name, value, by=args.by)
    print(sent_text(args.id, args.name, value, woke))
    return 0


def _requeue(queue: Queue, args: argparse.Namespace) -> int:
    n = queue.requeue(None if args.all_dead else args.ids, reload=args.reload)
    print(f"requeued {n} job(s)")
    return 0


def _cancel(queue: Queue, args: argparse.Namespace) -> int:
    for job_id in args.ids:
        queue.cancel(job_id)
    print(f"cancelled {len(args.ids)} job(s)")
    return 0


def _purge(queue: Queue, args: argparse.Namespace) -> int:
    n = queue.purge(status=args.status or ["completed"], older_than=args.older_than)
    print(f"purged {n} job(s)")
    return 0


_COMMANDS = {
    "worker": _worker,
    "notebook": _notebook,
    "schedules": _schedules,
    "stats": _stats,
    "jobs": _jobs,
    "show": _show,
    "graph": _graph,
    "steps": _steps,
    "waiting": _waiting,
    "send": _send,
    "requeue": _requeue,
    "cancel": _cancel,
    "purge": _purge,
}
