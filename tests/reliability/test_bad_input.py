"""Bad input at the Python API and the command line (the magics: tests/jupyter/test_magic_bad_input.py).

Every bad value gets a clear nbqueue error naming what was wrong, and leaves the database exactly as it was:
never a raw sqlite3/json/OverflowError traceback, never a half-written job.
Odd but valid values (quotes, SQL, unicode, long strings) work and round-trip exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Job, Queue
from nbqueue.payload import MAX_BYTES
from tests.helpers import run_cli, snapshot

Call = Callable[[Queue, "Seeded"], Any]


class Seeded:
    """A queue holding a pending, a dead and a running job (with its claim), to aim bad calls at."""

    def __init__(self, q: Queue) -> None:
        self.pending = q.enqueue({"n": "pending"}, key="held-key")
        self.dead = q.enqueue({"n": "dead"}, max_retries=0, priority=2)
        self.running = q.enqueue({"n": "running"}, priority=1)
        dying = q.claim()
        assert dying is not None and dying.id == self.dead.id
        assert q.fail(dying, "boom") == "dead"
        claim = q.claim()
        assert claim is not None and claim.id == self.running.id
        self.claim: Job = claim


def refused(call: Callable[[], Any], match: str, kind: type[Exception] = nbqueue.NbqueueError) -> Exception:
    """`call` raises `kind`, an nbqueue error (never sqlite3, json, OverflowError ...) matching `match`."""
    try:
        call()
    except Exception as exc:
        name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        assert isinstance(exc, nbqueue.NbqueueError), f"raw {name} escaped: {exc}"
        assert type(exc).__module__.startswith("nbqueue"), name
        assert isinstance(exc, kind), f"{name} is not a {kind.__name__}: {exc}"
        assert re.search(match, str(exc), re.IGNORECASE), f"{str(exc)!r} does not mention {match!r}"
        return exc
    pytest.fail(f"accepted; expected an error mentioning {match!r}")


@pytest.fixture
def path(sqlite_queue_file: Path) -> Path:
    """A migrated, empty queue file of the test's own (these tests are not of creation)."""
    return sqlite_queue_file


@pytest.fixture
def seeded(path: Path) -> Iterator[tuple[Queue, Seeded]]:
    with Queue(path) as q:
        yield q, Seeded(q)


def self_referencing() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


def deep(n: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(n):
        value = [value]
    return value


NAIVE = datetime(2030, 1, 1, 12, 0)  # no tzinfo
BIG = "x" * (17 * 1024 * 1024)  # 17 MiB of JSON, over the 16 MiB limit
E = nbqueue.PayloadError
A = nbqueue.InvalidArgument

API_CASES: list[tuple[str, Call, str, type[Exception]]] = [
    # -- payloads JSON cannot hold ------------------------------------------------------------
    ("set", lambda q, s: q.enqueue({1, 2}), "payload", E),
    ("bytes", lambda q, s: q.enqueue(b"raw"), "payload", E),
    ("object", lambda q, s: q.enqueue(object()), "payload", E),
    ("decimal", lambda q, s: q.enqueue({"price": Decimal("1.10")}), r"payload\['price'\]", E),
    ("datetime", lambda q, s: q.enqueue({"when": datetime.now(UTC)}), r"payload\['when'\]", E),
    ("nan", lambda q, s: q.enqueue(math.nan), "payload.*nan", E),
    ("inf", lambda q, s: q.enqueue({"x": [1, math.inf]}), r"payload\['x'\]\[1\].*inf", E),
    ("-inf", lambda q, s: q.enqueue(-math.inf), "payload", E),
    ("int key", lambda q, s: q.enqueue({1: "a"}), "key 1", E),
    ("tuple key", lambda q, s: q.enqueue({(1, 2): "a"}), r"key \(1, 2\)", E),
    ("self-referencing list", lambda q, s: q.enqueue(self_referencing()), "payload", E),
    ("nested set", lambda q, s: q.enqueue({"a": [1, {"b": {3}}]}), r"payload\['a'\]\[1\]\['b'\]", E),
    ("too deep", lambda q, s: q.enqueue(deep(100_000)), "payload.*deep", E),
    ("17 MiB", lambda q, s: q.enqueue({"blob": BIG}), "limit", E),
    ("17 MiB in many", lambda q, s: q.enqueue_many([{"ok": 1}, BIG]), r"payloads\[1\].*limit", E),
    ("many: set at 2", lambda q, s: q.enqueue_many([{"a": 1}, {"b": 2}, {3}]), r"payloads\[2\]", E),
    ("many: nan at 1", lambda q, s: q.enqueue_many([1, math.nan]), r"payloads\[1\]", E),
    ("many: a str", lambda q, s: q.enqueue_many("abc"), "iterable", A),
    ("many: an int", lambda q, s: q.enqueue_many(5), "iterable", A),  # type: ignore[arg-type]
    ("many: None", lambda q, s: q.enqueue_many(None), "iterable", A),  # type: ignore[arg-type]
    ("result set", lambda q, s: q.complete(s.claim, result={1}), "result", E),
    ("result nan", lambda q, s: q.complete(s.claim, result=[math.nan]), "result", E),
    ("result 17 MiB", lambda q, s: q.complete(s.claim, result=BIG), "result.*limit", E),
    # -- delays, times and durations ------------------------------------------------------------
    ("delay -1", lambda q, s: q.enqueue(1, delay=-1), "delay.*negative", A),
    ("delay -timedelta", lambda q, s: q.enqueue(1, delay=timedelta(seconds=-1)), "delay", A),
    ("delay nan", lambda q, s: q.enqueue(1, delay=math.nan), "delay.*finite", A),
    ("delay inf", lambda q, s: q.enqueue(1, delay=math.inf), "delay.*finite", A),
    ("delay str", lambda q, s: q.enqueue(1, delay="5"), "delay", A),  # type: ignore[arg-type]
    ("delay bool", lambda q, s: q.enqueue(1, delay=True), "delay", A),
    ("delay list", lambda q, s: q.enqueue(1, delay=[5]), "delay", A),  # type: ignore[arg-type]
    ("delay 1e15 s", lambda q, s: q.enqueue(1, delay=1e15), "delay", A),
    ("delay past year 9999", lambda q, s: q.enqueue(1, delay=1e12), "delay", A),
    ("many: delay -5", lambda q, s: q.enqueue_many([1, 2], delay=-5), "delay", A),
    ("run_at naive", lambda q, s: q.enqueue(1, run_at=NAIVE), "naive|timezone", A),
    ("run_at str", lambda q, s: q.enqueue(1, run_at="2030-01-01"), "run_at", A),  # type: ignore[arg-type]
    ("run_at and delay", lambda q, s: q.enqueue(1, delay=1, run_at=datetime.now(UTC)), "not both", A),
    ("run_at year 9999", lambda q, s: q.enqueue(1, run_at=datetime.max.replace(tzinfo=UTC)), "run_at", A),
    ("timeout -1", lambda q, s: q.enqueue(1, timeout=-1), "timeout", A),
    ("timeout 0", lambda q, s: q.enqueue(1, timeout=0), "timeout", A),
    ("timeout nan", lambda q, s: q.enqueue(1, timeout=math.nan), "timeout", A),
    ("lease 0", lambda q, s: q.claim(lease=0), "lease", A),
    ("lease -1", lambda q, s: q.claim(lease=-1), "lease", A),
    ("lease nan", lambda q, s: q.claim(lease=math.nan), "lease", A),
    ("lease str", lambda q, s: q.claim(lease="60"), "lease", A),  # type: ignore[arg-type]
    ("lease None", lambda q, s: q.claim(lease=None), "lease", A),  # type: ignore[arg-type]
    ("lease 1e300", lambda q, s: q.claim(lease=1e300), "lease", A),
    ("heartbeat lease 0", lambda q, s: q.heartbeat(s.claim, lease=0), "lease", A),
    ("heartbeat lease -1", lambda q, s: q.heartbeat(s.claim, lease=-1), "lease", A),
    ("heartbeat lease inf", lambda q, s: q.heartbeat(s.claim, lease=math.inf), "lease", A),
    ("heartbeat lease 1e300", lambda q, s: q.heartbeat(s.claim, lease=1e300), "lease", A),
    ("purge older -1", lambda q, s: q.purge(older_than=-1), "older_than", A),
    ("purge older str", lambda q, s: q.purge(older_than="7d"), "older_than", A),  # type: ignore[arg-type]
    ("purge older nan", lambda q, s: q.purge(older_than=math.nan), "older_than", A),
    ("purge older 1e300", lambda q, s: q.purge(older_than=1e300), "older_than", A),
    # -- retries and priorities -------------------------------------------------------------------
    ("max_retries -1", lambda q, s: q.enqueue(1, max_retries=-1), "max_retries", A),
    ("max_retries 1.5", lambda q, s: q.enqueue(1, max_retries=1.5), "max_retries", A),  # type: ignore[arg-type]
    ("max_retries True", lambda q, s: q.enqueue(1, max_retries=True), "max_retries", A),
    ("max_retries str", lambda q, s: q.enqueue(1, max_retries="3"), "max_retries", A),  # type: ignore[arg-type]
    ("max_retries None", lambda q, s: q.enqueue(1, max_retries=None), "max_retries", A),  # type: ignore[arg-type]
    ("max_retries 10**6", lambda q, s: q.enqueue(1, max_retries=10**6), "max_retries", A),
    ("many: max_retries -1", lambda q, s: q.enqueue_many([1], max_retries=-1), "max_retries", A),
    ("priority str", lambda q, s: q.enqueue(1, priority="high"), "priority", A),  # type: ignore[arg-type]
    ("priority 1.5", lambda q, s: q.enqueue(1, priority=1.5), "priority", A),  # type: ignore[arg-type]
    ("priority True", lambda q, s: q.enqueue(1, priority=True), "priority", A),
    ("priority 2**63", lambda q, s: q.enqueue(1, priority=2**63), "priority", A),
    # -- names, keys and filters --------------------------------------------------------------------
    ("queue empty", lambda q, s: q.enqueue(1, queue=""), "queue", A),
    ("queue blank", lambda q, s: q.enqueue(1, queue="   "), "queue", A),
    ("queue None", lambda q, s: q.enqueue(1, queue=None), "queue", A),  # type: ignore[arg-type]
    ("queue int", lambda q, s: q.enqueue(1, queue=5), "queue", A),  # type: ignore[arg-type]
    ("queue NUL", lambda q, s: q.enqueue(1, queue="a\x00b"), "queue", A),
    ("queue 1001 chars", lambda q, s: q.enqueue(1, queue="q" * 1001), "queue", A),
    ("key empty", lambda q, s: q.enqueue(1, key=""), "key", A),
    ("key int", lambda q, s: q.enqueue(1, key=5), "key", A),  # type: ignore[arg-type]
    ("key NUL", lambda q, s: q.enqueue(1, key="k\x00"), "key", A),
    ("claim queue int", lambda q, s: q.claim(queues=[5]), "queue", A),  # type: ignore[list-item]
    ("claim queue empty", lambda q, s: q.claim(queues=""), "queue", A),
    ("counts queue int", lambda q, s: q.counts(queue=5), "queue", A),  # type: ignore[arg-type]
    ("counts queue empty", lambda q, s: q.counts(queue=""), "queue", A),
    ("jobs status unknown", lambda q, s: q.jobs(status="done"), "unknown status 'done'", A),
    ("jobs status list", lambda q, s: q.jobs(status=["dead", "zombie"]), "zombie", A),
    ("jobs status int", lambda q, s: q.jobs(status=5), "status", A),  # type: ignore[arg-type]
    ("jobs queue int", lambda q, s: q.jobs(queue=5), "queue", A),  # type: ignore[arg-type]
    ("jobs limit -1", lambda q, s: q.jobs(limit=-1), "limit", A),
    ("jobs limit str", lambda q, s: q.jobs(limit="10"), "limit", A),  # type: ignore[arg-type]
    ("jobs limit 2**63", lambda q, s: q.jobs(limit=2**63), "limit", A),
    ("jobs offset -1", lambda q, s: q.jobs(offset=-1), "offset", A),
    ("history status unknown", lambda q, s: q.history(status="finished"), "unknown status", A),
    ("history queue empty", lambda q, s: q.history(queue=""), "queue", A),
    ("history limit -5", lambda q, s: q.history(limit=-5), "limit", A),
    ("purge status unknown", lambda q, s: q.purge(status="old"), "unknown status", A),
    ("purge status running", lambda q, s: q.purge(status="running"), "finished", A),
    ("purge status None", lambda q, s: q.purge(status=None), "status", A),  # type: ignore[arg-type]
    ("dead_letters queue int", lambda q, s: q.dead_letters(queue=5), "queue", A),  # type: ignore[arg-type]
    # -- ids and claims --------------------------------------------------------------------------
    ("get str", lambda q, s: q.get("1"), "integer", A),  # type: ignore[arg-type]
    ("get float", lambda q, s: q.get(1.0), "integer", A),  # type: ignore[arg-type]
    ("get None", lambda q, s: q.get(None), "integer", A),  # type: ignore[arg-type]
    ("get True", lambda q, s: q.get(True), "integer", A),
    ("get unknown", lambda q, s: q.get(10**6), "no job with id 1000000", nbqueue.JobNotFound),
    ("get -1", lambda q, s: q.get(-1), "no job|-1", nbqueue.NbqueueError),
    ("get 2**63", lambda q, s: q.get(2**63), "no job|integer|range", nbqueue.NbqueueError),
    ("cancel str", lambda q, s: q.cancel("1"), "integer", A),  # type: ignore[arg-type]
    ("cancel unknown", lambda q, s: q.cancel(10**6), "no job", nbqueue.JobNotFound),
    ("cancel 2**64", lambda q, s: q.cancel(2**64), "no job|integer|range", nbqueue.NbqueueError),
    ("cancel dead", lambda q, s: q.cancel(s.dead.id), "dead", nbqueue.InvalidTransition),
    ("requeue str", lambda q, s: q.requeue("1"), "integer|id", A),  # type: ignore[arg-type]
    ("requeue float", lambda q, s: q.requeue(1.5), "integer|id", A),  # type: ignore[arg-type]
    ("requeue [None]", lambda q, s: q.requeue([None]), "integer", A),  # type: ignore[list-item]
    ("requeue True", lambda q, s: q.requeue(True), "integer", A),
    ("requeue unknown", lambda q, s: q.requeue([s.dead.id, 10**6]), "no job", nbqueue.JobNotFound),
    ("requeue 2**64", lambda q, s: q.requeue([2**64]), "no job|integer|range", nbqueue.NbqueueError),
    (
        "requeue pending",
        lambda q, s: q.requeue([s.dead.id, s.pending.id]),
        "pending",
        nbqueue.InvalidTransition,
    ),
    ("heartbeat an int", lambda q, s: q.heartbeat(s.running.id), "Job", A),  # type: ignore[arg-type]
    ("heartbeat a pending job", lambda q, s: q.heartbeat(s.pending), "pending", nbqueue.InvalidTransition),
    ("fail an int", lambda q, s: q.fail(s.running.id, "x"), "Job", A),  # type: ignore[arg-type]
    ("fail error int", lambda q, s: q.fail(s.claim, 5), "error", A),  # type: ignore[arg-type]
    ("fail error None", lambda q, s: q.fail(s.claim, None), "error", A),  # type: ignore[arg-type]
    ("fail output object", lambda q, s: q.fail(s.claim, "x", output=object()), "output", A),  # type: ignore[arg-type]
    ("complete a dict", lambda q, s: q.complete({"id": s.running.id}), "Job", A),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("call", "match", "kind"), [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_api_refuses_bad_input_and_writes_nothing(
    seeded: tuple[Queue, Seeded], path: Path, call: Call, match: str, kind: type[Exception]
) -> None:
    q, s = seeded
    before = snapshot(path)
    counts = q.counts()
    refused(lambda: call(q, s), match, kind)
    assert q.counts() == counts
    assert snapshot(path) == before, "the refused call changed the database"
    # The queue still works after the refusal, and the held claim is intact.
    assert q.get(s.claim.id).status == "running"
    assert q.jobs(limit=10)  # every stored row still reads back


TASK_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("name empty", {"name": ""}, "task name"),
    ("name int", {"name": 5}, "task name"),
    ("name NUL", {"name": "t\x00"}, "task name"),
    ("queue empty", {"queue": ""}, "queue"),
    ("max_retries -1", {"max_retries": -1}, "max_retries"),
    ("priority str", {"priority": "high"}, "priority"),
    ("timeout -1", {"timeout": -1}, "timeout"),
    ("timeout 0", {"timeout": 0}, "timeout"),
    ("timeout nan", {"timeout": math.nan}, "timeout"),
    ("backoff dict", {"backoff": {"base": 2}}, "backoff"),
]


@pytest.mark.parametrize(("options", "match"), [c[1:] for c in TASK_CASES], ids=[c[0] for c in TASK_CASES])
def test_task_decorator_refuses_bad_options(path: Path, options: dict[str, Any], match: str) -> None:
    with Queue(path) as q:

        def work() -> None:
            return None

        refused(lambda: q.task(**options)(work), match)
        assert q.counts() == {s.value: 0 for s in nbqueue.State}


SCHEDULE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("args str", {"args": "abc"}, "args"),
    ("args int", {"args": 5}, "args"),
    ("args set", {"args": ({1},)}, r"args\[0\]"),
    ("kwargs list", {"kwargs": [1]}, "kwargs"),
    ("kwargs int key", {"kwargs": {1: 2}}, "keyword argument names"),
    ("kwargs nan", {"kwargs": {"x": math.nan}}, r"kwargs\['x'\]"),
    ("kwargs 17 MiB", {"kwargs": {"blob": BIG}}, "limit"),
    ("delay -1", {"delay": -1}, "delay"),
    ("run_at naive", {"run_at": NAIVE}, "naive|timezone"),
    ("max_retries -1", {"max_retries": -1}, "max_retries"),
    ("priority 1.5", {"priority": 1.5}, "priority"),
    ("queue NUL", {"queue": "\x00"}, "queue"),
    ("key empty", {"key": ""}, "key"),
    ("timeout inf", {"timeout": math.inf}, "timeout"),
]


@pytest.mark.parametrize(
    ("options", "match"), [c[1:] for c in SCHEDULE_CASES], ids=[c[0] for c in SCHEDULE_CASES]
)
def test_schedule_refuses_bad_input_and_writes_nothing(
    path: Path, options: dict[str, Any], match: str
) -> None:
    with Queue(path) as q:

        @q.task(name="bad_input.work")
        def work(*args: Any, **kwargs: Any) -> None:
            return None

        work.enqueue(1)
        before = snapshot(path)
        refused(lambda: work.schedule(**options), match)
        assert snapshot(path) == before


@pytest.mark.parametrize(
    ("target", "options", "match"),
    [
        ("", {}, "path"),
        (5, {}, "path"),
        (None, {}, "path"),
        ("DIR", {}, "DIR"),
        ("DIR/no/such/folder/jobs.db", {}, "folder"),
        (":memory:", {}, "memory"),
        ("FILE", {"backoff": {"base": 2}}, "backoff"),
        ("FILE", {"synchronous": "extra"}, "synchronous"),
        ("FILE", {"backoff": "fast"}, "backoff"),
    ],
    ids=[
        "empty",
        "int",
        "None",
        "a folder",
        "missing folder",
        "memory",
        "backoff dict",
        "synchronous",
        "backoff str",
    ],
)
def test_queue_constructor_refuses_bad_targets(
    tmp_path: Path, target: Any, options: dict[str, Any], match: str
) -> None:
    if isinstance(target, str):
        target = target.replace("FILE", str(tmp_path / "jobs.db")).replace("DIR", str(tmp_path))
        match = match.replace("DIR", re.escape(str(tmp_path)))
    refused(lambda: Queue(target, **options), match)
    assert not (tmp_path / "jobs.db").exists()


# -- odd but valid values round-trip exactly ---------------------------------------------------------

ODD = [
    "it's",
    'say "hi"',
    "back\\slash",
    "'; DROP TABLE nbqueue_jobs; --",
    "Robert'); DROP TABLE nbqueue_counts;--",
    "x' OR '1'='1",
    '" OR ""="',
    "%_*?[]^$.|(){}",
    "😀🚀 👩‍👩‍👧‍👦",
    "שלום עולם",
    "مرحبا بالعالم",
    "\u202eevil.exe\u202c",
    "tab\there\nnewline\rcr",
    "  padded  ",
    "Ω" * 999,
    "q" * 999,
]


@pytest.mark.parametrize("name", ODD, ids=[f"odd{i}" for i in range(len(ODD))])
def test_odd_names_and_keys_round_trip_exactly(path: Path, name: str) -> None:
    with Queue(path) as q:
        q.enqueue({"other": True}, queue="other")
        job = q.enqueue({name: [name]}, queue=name, key=name, priority=1)
        assert q.enqueue({"again": 1}, queue=name, key=name).id == job.id  # the key holds
        stored = q.get(job.id)
        assert (stored.queue, stored.key, stored.payload) == (name, name, {name: [name]})
        assert q.counts(name)["pending"] == 1
        assert name in q.queues()
        assert [j.id for j in q.jobs(queue=name)] == [job.id]
        claim = q.claim(queues=[name], worker_id=name)
        assert claim is not None and claim.id == job.id and claim.worker_id == name
        assert q.fail(claim, name) == "retry"
        assert q.get(job.id).error == name
        q.cancel(job.id)
        q.requeue(job.id)
        claim = q.claim(queues=[name])
        assert claim is not None
        q.complete(claim, result={name: name}, output=name)
        done = q.get(job.id)
        assert (done.value, done.output) == ({name: name}, name)
        assert q.counts() == {**{s.value: 0 for s in nbqueue.State}, "pending": 1, "completed": 1}
        assert q.purge(status="completed") == 1
        assert q.get_many([j.id for j in q.jobs()])[0].queue == "other"  # the tables survived


@pytest.mark.parametrize("name", ODD[:10], ids=[f"odd{i}" for i in range(10)])
def test_odd_task_names_run_in_a_worker(path: Path, name: str) -> None:
    with Queue(path) as q:

        @q.task(name=name, queue=name)
        def echo(value: str) -> dict[str, str]:
            return {name: value}

        job = echo.schedule(args=(name,), key=name)
        q.worker(queues=[name], lease=5).run_until_idle(timeout=20)
        done = q.get(job.id)
        assert (done.status, done.task, done.value) == ("completed", name, {name: name})


SURROGATES: list[tuple[str, Callable[[Queue], Job], Callable[[Job], Any], Any, str]] = [
    ("payload", lambda q: q.enqueue("bad \ud800 text"), lambda j: j.payload, "bad \ud800 text", "payload"),
    ("payload key", lambda q: q.enqueue({"\udcff": 1}), lambda j: j.payload, {"\udcff": 1}, "payload"),
    ("queue", lambda q: q.enqueue(1, queue="q\ud800"), lambda j: j.queue, "q\ud800", "queue"),
    ("key", lambda q: q.enqueue(1, key="k\udcff"), lambda j: j.key, "k\udcff", "key"),
]


@pytest.mark.parametrize(
    ("enqueue", "read", "value", "field"), [c[1:] for c in SURROGATES], ids=[c[0] for c in SURROGATES]
)
def test_lone_surrogates_are_refused_or_round_trip(
    path: Path, enqueue: Callable[[Queue], Job], read: Callable[[Job], Any], value: Any, field: str
) -> None:
    """A str that is not valid unicode (a lone surrogate, e.g. from a bad decode) either gets a
    clear error naming the field, or is stored and read back exactly; never UnicodeEncodeError."""
    with Queue(path) as q:
        before = snapshot(path)
        try:
            job = enqueue(q)
        except nbqueue.NbqueueError as exc:  # anything else (UnicodeEncodeError ...) fails the test
            assert type(exc).__module__.startswith("nbqueue")
            assert field in str(exc), str(exc)
            assert snapshot(path) == before
            return
        assert read(q.get(job.id)) == value
        assert [read(j) for j in q.jobs()] == [value]


def test_payload_limit_is_exact_and_counts_bytes(path: Path) -> None:
    """The limit is MAX_BYTES bytes of JSON: ASCII at the limit fits, one more byte does not,
    and 4-byte characters count as the bytes they take, not as one."""
    with Queue(path) as q:
        fits = "a" * (MAX_BYTES - 2)  # the JSON text adds two quotes
        job = q.enqueue(fits)
        assert q.get(job.id).payload == fits
        refused(lambda: q.enqueue(fits + "a"), "limit", nbqueue.PayloadError)
        emoji = "😀" * (MAX_BYTES // 4 + 16)  # about 4.2 M characters, over 16 MiB in UTF-8
        refused(lambda: q.enqueue(emoji), "limit", nbqueue.PayloadError)
        assert q.counts()["pending"] == 1


def test_a_job_with_a_far_future_run_at_does_not_poison_the_queue(path: Path) -> None:
    """Whatever enqueue does with a date near the end of the calendar, listing must keep working."""
    with Queue(path) as q:
        q.enqueue({"n": 1})
        far = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
        with contextlib.suppress(nbqueue.NbqueueError):
            q.enqueue({"n": 2}, run_at=far)
        with contextlib.suppress(nbqueue.NbqueueError):
            q.enqueue({"n": 3}, delay=timedelta(days=3_000_000))
        listed = q.jobs()  # neither may leave a row that cannot be read back
        assert len(listed) == sum(q.counts().values())
        for job in listed:
            assert q.get(job.id).id == job.id


# -- the command line ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real queue (one job in each useful state) and a few files that are not queues."""
    root = tmp_path_factory.mktemp("cli")
    db = root / "jobs.db"
    with Queue(db) as q:
        done = q.enqueue({"n": "done"})
        claim = q.claim()
        assert claim is not None
        q.complete(claim)
        q.enqueue({"n": "pending"})
        q.enqueue({"n": "sql"}, queue="'; DROP TABLE nbqueue_jobs; --")
        q.enqueue({"n": "emoji"}, queue="😀 q")
        assert done.id == 1
    garbage = root / "garbage.db"
    garbage.write_bytes(b"\x00\xff not a database " * 512)
    truncated = root / "truncated.db"
    data = db.read_bytes()
    truncated.write_bytes(data[: len(data) // 3])
    notjson = root / "notjson.db"
    with Queue(notjson) as q:
        q.enqueue({"who": "CORRUPT-ME"})
    raw = notjson.read_bytes()
    assert raw.count(b'{"who":"CORRUPT-ME"}') == 1
    notjson.write_bytes(raw.replace(b'{"who":"CORRUPT-ME"}', b'!"who":"CORRUPT-ME"}'))
    folder = root / "a-folder"
    folder.mkdir()
    return {"DB": db, "GARBAGE": garbage, "TRUNCATED": truncated, "NOTJSON": notjson, "DIR": folder}


def expand(args: list[str], files: dict[str, Path]) -> list[str]:
    return [str(files[a]) if a in files else a for a in args]


CLI_USAGE = [
    ["cancel", "DB"],
    ["cancel", "DB", "abc"],
    ["requeue", "DB", "1.5"],
    ["jobs", "DB", "--limit", "-1"],
    ["jobs", "DB", "--limit", "ten"],
    ["jobs", "DB", "--status", "'; DROP TABLE nbqueue_jobs; --"],
    ["purge", "DB", "--older-than", "1x"],
    ["purge", "DB", "--older-than", ""],
    ["purge", "DB", "--older-than", "-7d"],
    ["worker", "DB", "--lease", "soon"],
    ["worker", "DB", "--lease", "-5"],
    ["worker", "DB", "--concurrency", "-1"],
    ["worker", "DB", "--concurrency", "1.5"],
    ["worker", "DB", "--queues", ","],
    ["stats", "DB", "--bogus"],
    ["stats", "DB", "extra"],
]


@pytest.mark.parametrize("args", CLI_USAGE, ids=[" ".join(a) for a in CLI_USAGE])
def test_cli_bad_arguments_exit_2_with_usage(cli_files: dict[str, Path], args: list[str]) -> None:
    before = snapshot(cli_files["DB"])
    done = run_cli(*expand(args, cli_files))
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "usage:" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("nbqueue")
    assert "Traceback" not in done.stderr
    assert snapshot(cli_files["DB"]) == before


CLI_ERRORS = [
    (["cancel", "DB", "1"], "completed"),
    (["cancel", "DB", "999"], "no job with id 999"),
    (["cancel", "DB", "-1"], "-1"),
    (["requeue", "DB", "2"], "pending"),
    (["requeue", "DB", "99999999999999999999"], "99999999999999999999"),
    (["cancel", "DB", "99999999999999999999"], "99999999999999999999"),
    (["jobs", "DB", "--limit", "99999999999999999999"], "limit"),
    (["purge", "DB", "--older-than", "999999999999999d"], "older"),
    (["worker", "DB", "--lease", "0"], "lease"),
    (["worker", "DB", "--import", "no_such_module_for_nbqueue"], "no_such_module_for_nbqueue"),
    (["stats", "GARBAGE"], "not"),
    (["jobs", "TRUNCATED"], "not"),
    (["stats", "DIR"], "a-folder"),
    (["stats", "DIR/missing/jobs.db"], "missing"),
]


@pytest.mark.parametrize(("args", "match"), CLI_ERRORS, ids=[" ".join(a) for a, _ in CLI_ERRORS])
def test_cli_errors_exit_1_with_one_clear_line(
    cli_files: dict[str, Path], args: list[str], match: str
) -> None:
    before = snapshot(cli_files["DB"])
    args = [a.replace("DIR/", f"{cli_files['DIR']}/") for a in expand(args, cli_files)]
    done = run_cli(*args)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode in (1, 2), (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("nbqueue: error:"), lines
    assert re.search(match, lines[0]), lines
    assert snapshot(cli_files["DB"]) == before


def test_cli_odd_queue_names_work(cli_files: dict[str, Path]) -> None:
    for name in ("'; DROP TABLE nbqueue_jobs; --", "😀 q"):
        done = run_cli("jobs", str(cli_files["DB"]), "--queue", name, "--json")
        assert done.returncode == 0, done.stderr
        listed = json.loads(done.stdout)
        assert [j["queue"] for j in listed] == [name]
    assert run_cli("stats", str(cli_files["DB"]), "--json").returncode == 0
    with Queue(cli_files["DB"]) as q:
        assert sum(q.counts().values()) == 4


def test_cli_lists_a_damaged_row_with_its_damage(cli_files: dict[str, Path]) -> None:
    """One damaged row does not stop `nbqueue jobs`: it is listed, its damage in the error column."""
    done = run_cli("jobs", str(cli_files["NOTJSON"]))
    assert done.returncode == 0, done.stderr
    assert "cannot be read" in done.stdout
    assert "Traceback" not in done.stderr
