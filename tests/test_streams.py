"""Streams, on both backends: what a running job emits (nbqueue.emit), read with job.stream() and
job.astream() (the contract: docs "Streams: what a running job emits").

Real worker threads, real SQLite files and the real PostgreSQL server; the stored rows are read
straight from the database beside nbqueue. Other processes (a follower in a subprocess, process
mode) are in tests/test_streams_processes.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import nbqueue
from nbqueue import Dropped, Queue
from nbqueue.context import running
from nbqueue.streams import Emitter
from tests.helpers import QUICK, QUICK_RETRY, raw_rows, wait_until

# Every kind of JSON value, the awkward strings too (a NUL, a lone surrogate, non-ASCII).
MIXED: list[Any] = [
    "token",
    "",
    "héllo ✓ 日本",
    "nul\x00inside",
    "\ud800",
    0,
    -7,
    2**62,
    0.1,
    -1.5e300,
    True,
    False,
    None,
    [],
    {},
    [1, "two", [3.0, None]],
    {"a": {"b": [True, {"c": "d"}]}, "n": 1},
]


def mixed(n: int) -> list[Any]:
    """n items of mixed JSON types, each telling its place."""
    return [[i, MIXED[i % len(MIXED)]] if i % 3 else MIXED[i % len(MIXED)] for i in range(n)]


def stored(target: str, backend: str, job_id: int) -> tuple[int, int]:
    """(rows, bytes) of a job's stream as stored, every attempt."""
    sql = f"SELECT count(*), coalesce(sum(bytes), 0) FROM nbqueue_stream WHERE job_id = {job_id}"
    [(count, total)] = raw_rows(target, backend, sql)
    return int(count), int(total)


class Follower:
    """A thread reading `job.stream(**options)`: what it read, each with the moment it read it."""

    def __init__(self, job: nbqueue.Job, on_item: Callable[[Any], Any] | None = None, **options: Any) -> None:
        self.seen: list[tuple[float, Any]] = []
        self.on_item = on_item
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(job, options), daemon=True)
        self._thread.start()

    def _run(self, job: nbqueue.Job, options: dict[str, Any]) -> None:
        try:
            for item in job.stream(**options):
                self.seen.append((time.monotonic(), item))
                if self.on_item is not None:
                    self.on_item(item)
        except BaseException as exc:  # reported by join()
            self.error = exc
        finally:
            self.done.set()

    @property
    def items(self) -> list[Any]:
        return [item for _, item in self.seen]

    def join(self, timeout: float = 20) -> list[Any]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the follower still reads after {timeout} s: {self.items}"
        if self.error is not None:
            raise self.error
        return self.items


# -- order, and what is there ------------------------------------------------------------------


def test_a_thousand_mixed_items_come_back_in_order(queue: Queue) -> None:
    expected = mixed(1000)

    @queue.task(name="s.thousand")
    def chatty(n: int) -> int:
        for item in mixed(n):
            nbqueue.emit(item)
        return n

    @queue.task(name="s.silent")
    def silent() -> str:
        return "nothing emitted"

    job, quiet = chatty.enqueue(1000), silent.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == 1000
        quiet.result(timeout=20)
    assert list(job.stream(follow=False)) == expected
    assert list(job.stream()) == expected  # a finished job: what is there, then done
    assert list(job.stream(attempt=1)) == expected
    assert list(queue.get(job.id).stream(follow=False)) == expected  # a Job read afresh
    assert list(quiet.stream()) == []
    assert queue.last_items([job, quiet.id]) == {job.id: expected[-1]}
    assert queue.last_items([]) == {}


def test_stream_without_follow_returns_only_what_is_there(queue: Queue, gate: threading.Event) -> None:
    @queue.task(name="s.partial")
    def partial() -> str:
        nbqueue.emit("a")
        nbqueue.emit({"b": 2})
        assert gate.wait(20)
        nbqueue.emit("c")
        return "done"

    job = partial.enqueue()
    with queue.worker(**QUICK):
        wait_until(lambda: list(job.stream(follow=False)) == ["a", {"b": 2}], 10, "the first two items")
        started = time.monotonic()
        assert list(job.stream(follow=False)) == ["a", {"b": 2}]  # the job runs on: not waited for
        assert time.monotonic() - started < 1.0
        assert queue.get(job.id).status == "running"
        assert queue.last_items([job]) == {job.id: {"b": 2}}
        got: list[Any] = []
        with pytest.raises(nbqueue.WaitTimeout):  # follows, but only for its timeout
            for item in job.stream(timeout=0.3):
                got.append(item)
        assert got == ["a", {"b": 2}]
        gate.set()
        assert job.result(timeout=20) == "done"
    assert list(job.stream(follow=False)) == ["a", {"b": 2}, "c"]


def test_stream_checks_its_arguments(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    bad_attempts: tuple[Any, ...] = (0, -1, True, 1.0, "1")
    for attempt in bad_attempts:
        with pytest.raises(nbqueue.InvalidArgument, match="attempt"):
            list(job.stream(attempt=attempt))
    with pytest.raises(nbqueue.InvalidArgument):
        list(job.stream(timeout=-1))
    assert list(job.stream(follow=False)) == []  # pending, nothing emitted: nothing, at once
    with pytest.raises(nbqueue.WaitTimeout):
        list(job.stream(timeout=0.05))
    with pytest.raises(nbqueue.JobNotFound):
        list(queue.manager.stream(job.id + 1000, follow=False))


# -- live ----------------------------------------------------------------------------------------


def test_a_follower_sees_each_item_within_a_second_of_its_emit(queue: Queue) -> None:
    emitted: dict[int, float] = {}
    seen = [threading.Event() for _ in range(4)]

    @queue.task(name="s.live")
    def live() -> str:
        for i in range(4):
            emitted[i] = time.monotonic()
            nbqueue.emit(i)
            seen[i].wait(5)  # the next one only once the follower has this one (the job runs on)
        return "done"

    job = live.enqueue()
    follower = Follower(job, on_item=lambda item: seen[item].set())
    with queue.worker(**QUICK):
        assert job.result(timeout=30) == "done"
    assert follower.join() == [0, 1, 2, 3]
    for at, item in follower.seen:
        late = at - emitted[item]
        assert late < 1.0, f"item {item} was seen {late:.2f} s after its emit"


def test_a_follower_started_before_the_job_runs_sees_everything_then_ends(queue: Queue) -> None:
    @queue.task(name="s.later")
    def later(n: int) -> int:
        for i in range(n):
            nbqueue.emit(i)
            if i % 100 == 0:
                time.sleep(0.01)  # several batches, some of them read while the job runs
        return n

    job = later.enqueue(600)
    follower = Follower(job)
    time.sleep(0.1)  # the follower waits on a pending job with nothing in it
    assert follower.items == [] and not follower.done.is_set()
    with queue.worker(**QUICK):
        assert job.result(timeout=30) == 600
    assert follower.join() == list(range(600))


# -- every item before the completion ----------------------------------------------------------


def test_every_item_is_stored_before_the_completion(queue: Queue) -> None:
    """As soon as result() returns, the stream has every item: the last batch (fewer than the
    256 written at once, and emitted less than 50 ms before the return) included."""

    @queue.task(name="s.before")
    def before(n: int) -> int:
        for i in range(n):
            nbqueue.emit(i)
        return n

    @queue.task(name="s.before_async")
    async def before_async(n: int) -> int:
        for i in range(n):
            nbqueue.emit(i)
            if i % 50 == 0:
                await asyncio.sleep(0)
        return n

    sizes = [1, 2, 255, 256, 257, 300, 513, 7, 90, 1000]
    jobs = [before.enqueue(n) for n in sizes] + [before_async.enqueue(n) for n in sizes]
    with queue.worker(concurrency=4, **QUICK):
        for job, n in zip(jobs, sizes * 2, strict=True):
            assert job.result(timeout=30) == n
            assert list(job.stream(follow=False)) == list(range(n)), f"job {job.id} of {n} items"


# -- retries ------------------------------------------------------------------------------------


def test_a_retry_starts_a_new_stream_and_a_follower_moves_on_to_it(
    queue: Queue, gate: threading.Event
) -> None:
    runs: list[int] = []

    @queue.task(name="s.retry", max_retries=2, backoff=QUICK_RETRY)
    def flaky() -> str:
        runs.append(1)
        if len(runs) == 1:
            nbqueue.emit("a")
            nbqueue.emit("b")
            assert gate.wait(20)
            raise ConnectionError("the first attempt fails after a and b")
        nbqueue.emit("c")
        return "ok"

    job = flaky.enqueue()
    with queue.worker(**QUICK):
        wait_until(lambda: list(job.stream(follow=False)) == ["a", "b"], 10, "attempt 1's items")
        follower = Follower(job)  # started during attempt 1
        wait_until(lambda: follower.items == ["a", "b"], 10, "the follower has a and b")
        gate.set()
        assert job.result(timeout=20) == "ok"
    assert follower.join() == ["a", "b", "c"]  # then attempt 2's, nothing twice
    assert list(job.stream()) == ["c"]
    assert list(job.stream(follow=False)) == ["c"]
    assert list(job.stream(attempt=2)) == ["c"]
    assert list(job.stream(attempt=1)) == ["a", "b"]
    assert list(job.stream(attempt=3, follow=False)) == []
    assert queue.last_items([job]) == {job.id: "c"}
    assert list(queue.attempts(job)["outcome"]) == ["failed", "completed"]


# -- a stale worker ----------------------------------------------------------------------------


def test_a_stale_claims_emits_are_refused_and_raise_lease_lost(
    exact_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    """A claim whose lease ran out, then was recovered and claimed again: what its run emits
    after that is not stored (not in its attempt, not in the new one), and emit raises LeaseLost."""
    q = exact_queue
    q.enqueue({"n": 1})
    old = q.claim(lease=10)
    assert old is not None
    context = q.manager.context_for(old)
    emitter = context.emitter
    assert isinstance(emitter, Emitter)
    try:
        with running(context):
            nbqueue.emit("kept")
            emitter.flush()  # written under the live claim
            assert list(q.get(old.id).stream(follow=False)) == ["kept"]
            clock.advance(11)  # the lease ran out: nothing written any more
            nbqueue.emit("late")  # buffered; its write is refused
            emitter.flush()
            with pytest.raises(nbqueue.LeaseLost):
                nbqueue.emit("later")
            assert q.recover() == 1
            clock.advance(2)  # the retry's backoff
            new = q.claim(lease=10)
            assert new is not None and new.id == old.id and new.attempts == old.attempts + 1
            with pytest.raises(nbqueue.LeaseLost):  # still refused, claimed again or not
                nbqueue.emit("stale")
    finally:
        emitter.close()
    fresh = q.manager.context_for(new)
    assert fresh.emitter is not None
    try:
        with running(fresh):
            nbqueue.emit("fresh")
    finally:
        fresh.emitter.close()
    q.complete(new, "done")
    job = q.get(old.id)
    assert list(job.stream()) == ["fresh"]
    assert list(job.stream(attempt=1)) == ["kept"]  # "late", "later", "stale": none stored


def test_a_handler_that_lost_its_claim_gets_lease_lost_from_emit(
    clocked_queue: Queue, clock: nbqueue.ManualClock, gate: threading.Event
) -> None:
    """A real worker's handler blocked past its lease: recovered (and run again), the stale run
    keeps emitting and is refused: emit raises LeaseLost and nothing of it is stored."""
    q = clocked_queue
    stale: list[str] = []
    runs: list[int] = []

    @q.task(name="s.stale", max_retries=2, backoff=nbqueue.Backoff(base=2, cap=2, jitter=0))
    def slow() -> str:
        runs.append(1)
        if len(runs) > 1:
            nbqueue.emit("fresh")
            return "fresh"
        nbqueue.emit("before")
        assert gate.wait(20)
        try:
            for i in range(200):  # a stale run emits on, for up to ~4 s
                nbqueue.emit(f"stale {i}")
                time.sleep(0.02)
        except nbqueue.LeaseLost as exc:
            stale.append(str(exc))
            raise
        return "stale"

    job = slow.enqueue()
    with q.worker(lease=10, **QUICK):
        wait_until(lambda: list(job.stream(follow=False)) == ["before"], 10, "the first item")
        clock.advance(11)  # its lease ran out (no heartbeat can bring it back)
        wait_until(lambda: q.recover() or q.get(job.id).status == "pending", 10, "the job recovered")
        gate.set()
        wait_until(lambda: stale, 10, "the stale run refused")
        assert "claim is gone" in stale[0]
        assert list(job.stream(follow=False)) == ["before"]  # none of its stale items
        clock.advance(3)  # the retry is due
        assert job.result(timeout=20) == "fresh"
    assert list(job.stream()) == ["fresh"]
    assert list(job.stream(attempt=1)) == ["before"]


# -- the bound ----------------------------------------------------------------------------------


@pytest.mark.slow  # 50 MB through the database
def test_a_flood_of_fifty_megabytes_keeps_the_default_bound_and_the_newest_item(
    queue: Queue, queue_target: str, backend: str
) -> None:
    size = 1_000_000
    bound = 1024 * 1024

    @queue.task(name="s.flood")
    def flood() -> int:
        for i in range(50):
            nbqueue.emit(f"{i:02d}" + "x" * (size - 2))
        return 50

    job = flood.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=120) == 50
    rows, kept = stored(queue_target, backend, job.id)
    assert rows >= 1 and kept <= bound, f"{rows} items, {kept:,} bytes kept"
    items = list(job.stream())
    assert isinstance(items[0], Dropped) and items[0].count == 50 - rows  # the note first
    assert len(items) == rows + 1
    assert items[-1][:2] == "49" and len(items[-1]) == size  # the newest, whole
    assert all(isinstance(i, str) and len(i) == size for i in items[1:])
    assert [int(i[:2]) for i in items[1:]] == list(range(50 - rows, 50))
    assert queue.last_items([job])[job.id][:2] == "49"


def test_a_small_bound_keeps_about_its_bytes_of_the_newest_items(
    queue: Queue, queue_target: str, backend: str
) -> None:
    @queue.task(name="s.bounded", stream_bytes=2000)
    def bounded(n: int) -> int:
        for i in range(n):
            nbqueue.emit(f"{i:08d}")  # 10 bytes of JSON each
        return n

    job = bounded.enqueue(1000)
    with queue.worker(**QUICK):
        assert job.result(timeout=30) == 1000
    rows, kept = stored(queue_target, backend, job.id)
    assert 2000 - 10 < kept <= 2000 and rows == kept // 10
    items = list(job.stream())
    assert items[0] == Dropped(1000 - rows)
    assert items[1:] == [f"{i:08d}" for i in range(1000 - rows, 1000)]
    assert str(Dropped(3)) == "[3 earlier items dropped]"


def test_the_bound_holds_once_the_job_finished_whatever_its_last_write(
    queue: Queue, queue_target: str, backend: str
) -> None:
    """While a job runs its stream may hold an eighth of its bound more (a cut follows each eighth
    written); once it finished, the bound holds: here the run's last items were written by the
    flusher, without a cut, and nothing was left for the final write when the run ended."""

    @queue.task(name="s.last_write", stream_bytes=2000)
    def last_write() -> str:
        for i in range(200):  # 2,000 bytes: written (and cut) by the flusher
            nbqueue.emit(f"{i:08d}")
        time.sleep(0.3)
        for i in range(200, 220):  # 200 more bytes, under an eighth of the bound: written, not cut
            nbqueue.emit(f"{i:08d}")
        time.sleep(0.3)  # written by the flusher before the run ends
        return "ok"

    job = last_write.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=30) == "ok"
    rows, kept = stored(queue_target, backend, job.id)
    assert kept <= 2000, f"{rows} items, {kept:,} bytes kept after the job finished (bound 2,000)"
    assert list(job.stream()) == [Dropped(20)] + [f"{i:08d}" for i in range(20, 220)]


def test_one_item_larger_than_the_bound_is_kept_whole(queue: Queue, queue_target: str, backend: str) -> None:
    @queue.task(name="s.big", stream_bytes=100)
    def big() -> str:
        nbqueue.emit("small")
        nbqueue.emit("y" * 500)
        return "ok"

    job = big.enqueue()
    with queue.worker(**QUICK):
        job.result(timeout=20)
    assert list(job.stream()) == [Dropped(1), "y" * 500]  # the newest always, whole
    assert stored(queue_target, backend, job.id) == (1, 502)


def test_a_reader_behind_the_bound_gets_a_dropped_note_then_the_rest(
    queue: Queue, gate: threading.Event
) -> None:
    @queue.task(name="s.behind", stream_bytes=2000)
    def behind() -> int:
        for i in range(10):
            nbqueue.emit(f"{i:08d}")
        assert gate.wait(20)
        for i in range(10, 1000):
            nbqueue.emit(f"{i:08d}")
        return 1000

    job = behind.enqueue()
    with queue.worker(**QUICK):
        reader = job.stream(timeout=30)
        first = [next(reader) for _ in range(10)]  # read live, while the job waits on the gate
        assert first == [f"{i:08d}" for i in range(10)]
        gate.set()
        assert job.result(timeout=30) == 1000
        rest = list(reader)  # the reader comes back after 790 items were dropped
    assert rest == [Dropped(790)] + [f"{i:08d}" for i in range(800, 1000)]


def test_stream_bytes_is_checked_at_the_task(queue: Queue) -> None:
    bad_bounds: tuple[Any, ...] = (0, -1, True, 1.5, "10")
    for bad in bad_bounds:
        with pytest.raises(nbqueue.InvalidArgument, match="stream_bytes"):
            queue.task(name=f"s.bad_{bad!r}", stream_bytes=bad)(lambda: None)


# -- waits: a resumed run emits again ----------------------------------------------------------


def test_a_run_resumed_after_a_wait_does_not_store_its_items_twice(
    queue: Queue, queue_target: str, backend: str
) -> None:
    runs: list[int] = []

    @queue.task(name="s.resume")
    def resume() -> Any:
        runs.append(1)
        nbqueue.emit("x")
        nbqueue.emit("y")
        value = nbqueue.wait_for("go")
        nbqueue.emit("z")
        return value

    job = resume.enqueue()
    with queue.worker(**QUICK):
        wait_until(lambda: queue.get(job.id).status == "waiting", 10, "the job waiting")
        assert list(job.stream(follow=False)) == ["x", "y"]
        follower = Follower(job)  # follows across the wait
        wait_until(lambda: follower.items == ["x", "y"], 10, "the follower has x and y")
        time.sleep(0.2)
        assert not follower.done.is_set()  # a waiting job has not finished: it follows on
        assert queue.send(job, "go", "now") is True
        assert job.result(timeout=20) == "now"
    assert len(runs) == 2
    assert list(job.stream(follow=False)) == ["x", "y", "z"]
    assert follower.join() == ["x", "y", "z"]
    assert stored(queue_target, backend, job.id)[0] == 3
    assert list(queue.attempts(job)["outcome"]) == ["suspended", "completed"]


# -- the stream goes with its job, and starts anew ------------------------------------------------


def test_delete_and_purge_remove_the_stream(queue: Queue, queue_target: str, backend: str) -> None:
    @queue.task(name="s.gone")
    def gone(n: int) -> int:
        for i in range(n):
            nbqueue.emit(i)
        return n

    a, b, c = gone.enqueue(3), gone.enqueue(4), gone.enqueue(5)
    with queue.worker(**QUICK):
        for job in (a, b, c):
            job.result(timeout=20)
    assert [stored(queue_target, backend, j.id)[0] for j in (a, b, c)] == [3, 4, 5]
    assert queue.delete(a) == 1
    assert stored(queue_target, backend, a.id) == (0, 0)
    assert [stored(queue_target, backend, j.id)[0] for j in (b, c)] == [4, 5]  # the others' stay
    time.sleep(0.01)
    assert queue.purge("completed", older_than=timedelta(0)) == 2
    assert raw_rows(queue_target, backend, "SELECT count(*) FROM nbqueue_stream") == [(0,)]


def test_requeue_and_replay_begin_the_stream_anew(queue: Queue, queue_target: str, backend: str) -> None:
    runs: list[int] = []

    @queue.task(name="s.again", max_retries=0)
    def again() -> str:
        runs.append(1)
        nbqueue.emit(f"run {len(runs)}")
        if len(runs) == 1:
            raise ValueError("dead on the first run")
        return f"run {len(runs)}"

    job = again.enqueue()
    with queue.worker(**QUICK):
        with pytest.raises(nbqueue.JobFailed):
            job.result(timeout=20)
    assert list(job.stream()) == ["run 1"]
    assert queue.requeue(job) == 1
    assert list(job.stream(follow=False)) == []  # begun anew
    assert stored(queue_target, backend, job.id) == (0, 0)
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == "run 2"
    assert list(job.stream()) == ["run 2"]
    assert list(job.stream(attempt=1)) == ["run 2"]
    queue.replay(job)
    assert list(job.stream(follow=False)) == []
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == "run 3"
    assert list(job.stream()) == ["run 3"]
    assert stored(queue_target, backend, job.id)[0] == 1


# -- what emit refuses, and where it does nothing -------------------------------------------------


def test_a_value_that_is_not_json_is_refused_at_the_call_and_the_job_goes_on(queue: Queue) -> None:
    refused: list[str] = []

    @queue.task(name="s.refused", max_retries=0)
    def careful() -> str:
        nbqueue.emit("before")
        for bad in ({1, 2}, object(), float("nan"), {1: "int key"}, b"bytes", ["ok", {"x": {3}}]):
            try:
                nbqueue.emit(bad)
            except nbqueue.PayloadError as exc:
                refused.append(type(bad).__name__ + ": " + str(exc))
        nbqueue.emit("after")
        return "went on"

    job = careful.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == "went on"
    assert len(refused) == 6, refused
    assert all("emitted" in why for why in refused), refused  # the message names the value emitted
    assert list(job.stream()) == ["before", "after"]  # nothing of the refused ones


def test_emit_outside_a_job_is_a_no_op_and_refused_in_a_notebook_jobs_kernel(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NBQUEUE_NOTEBOOK_JOB", raising=False)
    nbqueue.emit("nowhere")  # nothing raised, nothing stored
    nbqueue.emit({"any": [1, 2]})
    with pytest.raises(nbqueue.PayloadError):  # still checked
        nbqueue.emit({1, 2})
    job = queue.enqueue({"n": 1})
    assert list(job.stream(follow=False)) == []
    monkeypatch.setenv("NBQUEUE_NOTEBOOK_JOB", "17")
    with pytest.raises(nbqueue.NbqueueError, match="notebook job"):
        nbqueue.emit("in a notebook job's kernel")


def test_emit_from_a_thread_the_job_started_with_its_context(queue: Queue) -> None:
    import contextvars

    @queue.task(name="s.thread")
    def threaded() -> str:
        nbqueue.emit("main")
        ctx = contextvars.copy_context()
        t = threading.Thread(target=ctx.run, args=(nbqueue.emit, "from a thread"))
        t.start()
        t.join()
        nbqueue.emit("main again")
        return "ok"

    job = threaded.enqueue()
    with queue.worker(**QUICK):
        job.result(timeout=20)
    assert list(job.stream()) == ["main", "from a thread", "main again"]


# -- async --------------------------------------------------------------------------------------


def test_an_async_handler_emits_across_awaits_and_jobs_keep_their_own_streams(queue: Queue) -> None:
    @queue.task(name="s.async")
    async def tokens(name: str, n: int) -> str:
        text = ""
        for i in range(n):
            token = f"{name}{i} "
            nbqueue.emit(token)
            text += token
            await asyncio.sleep(0.001)
        return text

    jobs = [tokens.enqueue(name, 40) for name in "abcde"]
    with queue.worker(concurrency=5, **QUICK):  # five coroutines interleave on one loop
        results = [job.result(timeout=30) for job in jobs]
    for name, job, text in zip("abcde", jobs, results, strict=True):
        items = list(job.stream())
        assert items == [f"{name}{i} " for i in range(40)]
        assert "".join(items) == text


def test_astream_follows_a_running_job_and_leaves_the_loop_free(queue: Queue, gate: threading.Event) -> None:
    @queue.task(name="s.astream")
    def slow(n: int) -> int:
        for i in range(n):
            nbqueue.emit(i)
            if i == n // 2:
                assert gate.wait(20)
        return n

    job = slow.enqueue(20)

    async def follow() -> tuple[list[Any], int, bool]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        tick = asyncio.create_task(ticker())
        got: list[Any] = []
        running_when_half = False
        async for item in job.astream(timeout=30):
            got.append(item)
            if item == 10:  # the job holds at the gate: it is still running
                running_when_half = queue.get(job.id).status == "running"
                before = ticks
                await asyncio.sleep(0.2)
                assert ticks > before  # the loop ran on while the reader waited
                gate.set()
        stop.set()
        await tick
        after = [item async for item in job.astream(follow=False)]
        assert after == got
        return got, ticks, running_when_half

    with queue.worker(**QUICK):
        got, ticks, running_when_half = asyncio.run(follow())
    assert got == list(range(20))
    assert running_when_half
    assert ticks > 5
