"""Workflows under faults: durable steps and dependencies with real processes and threads.

A worker SIGKILLed after a step returned (the step is not called again), the one window
the contract admits (the step's effect done, its value never recorded: called again), a
stale worker that tries to record a step (refused with LeaseLost), parents completed while
their children are enqueued at the same moment (no child stranded blocked), two parents of
one child completed at the same moment (counted down twice), a fan-out of 200 with a fan-in
of 1 on four worker threads, and steps in process mode across a retry.
Every test runs on both backends (the `backend` fixture).

Run as ``python test_workflow_faults.py worker TARGET FOLDER LEASE JOB_ID``, this file is
also the child worker process the kill tests start: it prints ``ready`` once its worker
runs, and exits 0 once the job is finished (unless one of the job's steps kills it first).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas
import procs
import pytest

import nbqueue
from nbqueue import Job, Queue, State
from nbqueue.context import JobContext, running
from tests.helpers import QUICK_RETRY, MakeQueue, wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")

HERE = Path(__file__).resolve()
TWO_STEPS = "wf_faults.two_steps"
WINDOW = "wf_faults.window"
CHILD_LEASE = 1.0  # seconds: the killed worker's claim runs out this long after its last heartbeat
#: How many parent/child pairs race; NBQUEUE_SOAK=N races 1,000 times N.
PAIRS = procs.soak(default=100, soaked=1_000)
FAN_OUT = 200


# -- the steps the child workers run (module functions: the child imports this file) -----------


def append_line(path: Path, text: str) -> None:
    """A side effect a test can count: one line per call, on disk before the call returns."""
    with open(path, "a") as file:
        file.write(text + "\n")
        file.flush()
        os.fsync(file.fileno())


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def die_by_sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # (never reached: SIGKILL is delivered at once)


def effect_a(folder: str) -> dict[str, int]:
    append_line(Path(folder) / "a.txt", f"a {os.getpid()}")
    return {"a": os.getpid()}


def kill_the_first_time(folder: str) -> dict[str, int]:
    """Step b: the first process that gets here dies (SIGKILL) before it returns."""
    marker = Path(folder) / "b.killed"
    if not marker.exists():
        marker.touch()
        die_by_sigkill()
    append_line(Path(folder) / "b.txt", f"b {os.getpid()}")
    return {"b": os.getpid()}


def pay_then_die_the_first_time(folder: str) -> dict[str, int]:
    """The one window: the effect happens, then the process dies before the value is recorded."""
    append_line(Path(folder) / "pay.txt", f"pay {os.getpid()}")
    marker = Path(folder) / "pay.killed"
    if not marker.exists():
        marker.touch()
        die_by_sigkill()
    return {"paid_by": os.getpid()}


def define_tasks(q: Queue, folder: Path) -> tuple[nbqueue.Task[..., Any], nbqueue.Task[..., Any]]:
    """The kill tests' tasks, registered alike in the test (to enqueue) and in the child workers."""

    @q.task(name=TWO_STEPS, max_retries=3, backoff=QUICK_RETRY)
    def two_steps(tag: str) -> dict[str, Any]:
        a = nbqueue.step("a", effect_a, str(folder))
        b = nbqueue.step("b", kill_the_first_time, str(folder))
        return {"tag": tag, "a": a, "b": b}

    @q.task(name=WINDOW, max_retries=3, backoff=QUICK_RETRY)
    def window(tag: str) -> dict[str, Any]:
        paid = nbqueue.step("pay", pay_then_die_the_first_time, str(folder))
        return {"tag": tag, "paid": paid}

    return two_steps, window


def role_worker(target: str, folder: str, lease: str, job_id: str) -> int:
    """A worker process; ends (0) once the job is finished, unless a step kills it first."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    q = Queue(target)
    define_tasks(q, Path(folder))
    worker = q.worker(lease=float(lease)).start()
    print("ready", flush=True)
    deadline = time.monotonic() + procs.CHILD_DEADLINE
    while not q.get(int(job_id)).finished:
        if time.monotonic() > deadline:
            print(f"job {job_id} never finished: {q.get(int(job_id))!r}", file=sys.stderr)
            return 2
        time.sleep(0.05)
    assert worker.stop(timeout=30), "the worker's threads did not stop"
    q.close()
    return 0


def spawn_worker(target: str, folder: Path, job: Job, stderr: Path) -> subprocess.Popen[str]:
    with open(stderr, "a") as err:
        return subprocess.Popen(
            [sys.executable, str(HERE), "worker", target, str(folder), str(CHILD_LEASE), str(job.id)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=procs.child_env(),
        )


def killed_then_recovered(
    q: Queue, target: str, folder: Path, job: Job, between: Callable[[int], None]
) -> tuple[int, int]:
    """A worker process runs `job` until one of its steps SIGKILLs it; `between(its pid)` checks
    the queue then; a second worker process recovers the job and finishes it. Both pids."""
    started: list[subprocess.Popen[str]] = []
    try:
        first_err = folder / "first.err"
        first = spawn_worker(target, folder, job, first_err)
        started.append(first)
        procs.wait_ready(first, first_err)
        try:
            code = first.wait(120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the first worker never died:\n{first_err.read_text()}") from None
        assert code == -signal.SIGKILL, f"the first worker ended with {code}:\n{first_err.read_text()}"
        stranded = q.get(job.id)
        assert stranded.status is State.RUNNING and stranded.attempts == 1, stranded  # until its lease ends
        between(first.pid)

        second_err = folder / "second.err"
        second = spawn_worker(target, folder, job, second_err)
        started.append(second)
        procs.wait_ready(second, second_err)
        assert procs.finish(second, 120) == 0, second_err.read_text()
    finally:
        procs.reap(started)
    text = second_err.read_text()
    for bad in ("Traceback", "locked", "StorageError", "could not record"):
        assert bad not in text, f"the recovering worker: {bad!r}\n{text}"
    return first.pid, second.pid


def step_rows(q: Queue, job: Job | int) -> dict[str, dict[str, Any]]:
    """q.steps(job) as {step: {status, attempt, value, error}}."""
    rows: list[dict[Any, Any]] = q.steps(job).to_dict("records")
    return {
        str(row["step"]): {
            "status": str(row["status"]),
            "attempt": int(row["attempt"]),
            "value": row["value"],
            "error": None if pandas.isna(row["error"]) else str(row["error"]),
        }
        for row in rows
    }


def claim_one(q: Queue, **options: Any) -> Job:
    """The next due job, claimed (waits for a retry's backoff to pass)."""
    job: Job | None = wait_until(lambda: q.claim(**options), 10, "a job to claim", every=0.02)
    assert job is not None
    return job


# -- 1. killed after a step returned: that step is not called again ---------------------------


@pytest.mark.slow
def test_worker_killed_after_a_step_returned_does_not_repeat_it_on_recovery(
    make_queue: MakeQueue, queue_target: str, tmp_path: Path
) -> None:
    q = make_queue()
    two_steps, _ = define_tasks(q, tmp_path)
    job = two_steps.enqueue("one")

    def between(first_pid: int) -> None:
        # Step a was recorded under the first claim; step b never returned.
        assert lines(tmp_path / "a.txt") == [f"a {first_pid}"]
        assert step_rows(q, job) == {
            "a": {"status": "completed", "attempt": 1, "value": {"a": first_pid}, "error": None}
        }
        assert (tmp_path / "b.killed").exists() and lines(tmp_path / "b.txt") == []

    first_pid, second_pid = killed_then_recovered(q, queue_target, tmp_path, job, between)

    done = q.get(job.id)
    assert done.status is State.COMPLETED, done
    assert done.attempts == 2, done
    # the kill, as recovery saw it: the lease run out, or the killed worker's process gone
    assert "lease expired" in (done.error or "") or "is gone" in (done.error or ""), done.error
    assert done.value == {"tag": "one", "a": {"a": first_pid}, "b": {"b": second_pid}}
    assert lines(tmp_path / "a.txt") == [f"a {first_pid}"], "step a was called again after recovery"
    assert lines(tmp_path / "b.txt") == [f"b {second_pid}"]
    assert step_rows(q, job) == {
        "a": {"status": "completed", "attempt": 1, "value": {"a": first_pid}, "error": None},
        "b": {"status": "completed", "attempt": 2, "value": {"b": second_pid}, "error": None},
    }


# -- 2. the one window: the effect done, the value never recorded --------------------------------


@pytest.mark.slow
def test_the_one_window_a_step_killed_before_it_returned_is_called_again(
    make_queue: MakeQueue, queue_target: str, tmp_path: Path
) -> None:
    """Documented in nbqueue/steps.py: `fn` did its effect, the process died before the value
    was recorded, so the next run calls `fn` again and the effect happens twice."""
    q = make_queue()
    _, window = define_tasks(q, tmp_path)
    job = window.enqueue("pay")

    def between(first_pid: int) -> None:
        assert lines(tmp_path / "pay.txt") == [f"pay {first_pid}"]
        assert step_rows(q, job) == {}  # nothing was recorded: the process died inside the step

    first_pid, second_pid = killed_then_recovered(q, queue_target, tmp_path, job, between)

    done = q.get(job.id)
    assert done.status is State.COMPLETED and done.attempts == 2, done
    assert done.value == {"tag": "pay", "paid": {"paid_by": second_pid}}
    # The window, explicitly: the side effect happened twice, once per process.
    assert lines(tmp_path / "pay.txt") == [f"pay {first_pid}", f"pay {second_pid}"]
    assert step_rows(q, job) == {
        "pay": {"status": "completed", "attempt": 2, "value": {"paid_by": second_pid}, "error": None}
    }


# -- 3. a stale worker cannot record a step -----------------------------------------------------


def test_a_stale_worker_thread_cannot_record_a_step(make_queue: MakeQueue) -> None:
    """A worker thread is inside a step's function while its claim is taken over; when the
    function returns, nbqueue.step raises LeaseLost and the value is not kept.

    The stale worker's queue runs on a clock an hour behind (a worker frozen for an hour,
    as far as the others can tell): its heartbeats keep its lease an hour in the past, so a
    worker on the real clock recovers the job and claims it while the stale handler waits.
    """
    stale_q = make_queue(clock=nbqueue.ManualClock(time.time() - 3600))
    q = make_queue()
    entered = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]
    calls: list[int] = []
    lost: list[BaseException] = []
    returned: list[Any] = []
    guard = threading.Lock()

    @stale_q.task(name="wf_faults.stale", max_retries=3, backoff=QUICK_RETRY)
    def slow(tag: str) -> dict[str, str]:
        with guard:
            n = len(calls)
            calls.append(n)

        def compute() -> dict[str, str]:
            entered[n].set()
            assert release[n].wait(60), "never released"
            return {"by": "stale" if n == 0 else "fresh", "tag": tag}

        try:
            value: dict[str, str] = nbqueue.step("a", compute)
        except nbqueue.LeaseLost as exc:
            lost.append(exc)
            raise
        returned.append(value)
        return value

    job = slow.enqueue("t")  # through the stale queue: due on its clock too
    stale_worker = stale_q.worker(lease=60).start()
    fresh_worker = None
    try:
        assert entered[0].wait(30), "the stale worker never started the step"
        first = q.get(job.id)
        assert first.status is State.RUNNING and first.attempts == 1
        assert q.recover() == 1  # its lease is over an hour old, for everyone but itself
        fresh_worker = q.worker(lease=60).start()
        assert entered[1].wait(30), "no other worker took the job over"
        taken = q.get(job.id)
        assert taken.status is State.RUNNING and taken.attempts == 2, taken

        release[0].set()  # the stale step's function returns now: its value must be refused
        wait_until(lambda: lost, 30, "LeaseLost in the stale handler")
        assert len(lost) == 1 and str(job.id) in str(lost[0]), lost
        assert step_rows(q, job) == {}, "the stale worker's step value was recorded"
        assert returned == []

        release[1].set()
        wait_until(lambda: q.get(job.id).finished, 30, "the job finished by the fresh worker")
    finally:
        for event in release:
            event.set()
        if fresh_worker is not None:
            fresh_worker.stop(timeout=10)
        stale_worker.stop(timeout=10)
    done = q.get(job.id)
    assert done.status is State.COMPLETED and done.attempts == 2, done
    assert done.value == {"by": "fresh", "tag": "t"}
    assert step_rows(q, job) == {
        "a": {"status": "completed", "attempt": 2, "value": {"by": "fresh", "tag": "t"}, "error": None}
    }
    assert calls == [0, 1]


@pytest.mark.slow  # real seconds: a lease runs out
def test_a_stale_claim_cannot_record_a_step_at_any_point_after_its_lease(make_queue: MakeQueue) -> None:
    """The claim's step book, used after its lease ended: not yet recovered, recovered (failed),
    taken by another claim (which records), and after that claim completed. Every record through
    the stale claim is refused; its function is still called (the step cannot know in advance)."""
    q = make_queue(backoff=QUICK_RETRY)
    job = q.enqueue({"stale": True}, max_retries=3)
    stale = claim_one(q, lease=1.0)
    assert stale.id == job.id
    stale_context = JobContext(stale, lambda *_: True, steps=q.manager.journal.step_book(stale))
    called: list[str] = []

    def through(context: JobContext, name: str, value: str) -> Any:
        def fn() -> str:
            called.append(f"{name}={value}")
            return value

        with running(context):
            return nbqueue.step(name, fn)

    assert through(stale_context, "early", "ok") == "ok"  # under the live lease: recorded
    lease_end = stale.lease_until
    assert lease_end is not None
    wait_until(lambda: q.now() > lease_end, 10, "the stale claim's lease in the past", every=0.02)

    # 1. The lease ran out; nobody recovered the job yet (it is still 'running', same attempt).
    with pytest.raises(nbqueue.LeaseLost):
        through(stale_context, "a", "stale-1")
    # 2. Recovered: failed, waiting for its retry.
    assert q.recover() == 1
    assert q.get(job.id).status is State.FAILED
    with pytest.raises(nbqueue.LeaseLost):
        through(stale_context, "a", "stale-2")
    # 3. Claimed again; the new claim records "a", the stale one still cannot (not even a new name).
    fresh = claim_one(q, lease=60)  # once the retry is due
    assert fresh.id == job.id and fresh.attempts == 2
    fresh_context = JobContext(fresh, lambda *_: True, steps=q.manager.journal.step_book(fresh))
    with pytest.raises(nbqueue.LeaseLost):
        through(stale_context, "a", "stale-3")
    assert through(fresh_context, "a", "fresh") == "fresh"
    with pytest.raises(nbqueue.LeaseLost):
        through(stale_context, "a", "stale-4")  # not handed the fresh value either: it is stale
    with pytest.raises(nbqueue.LeaseLost):
        through(stale_context, "b", "stale-5")
    # 4. Completed by the fresh claim: nobody records any more.
    q.complete(fresh, "done")
    with pytest.raises(nbqueue.LeaseLost):
        through(stale_context, "c", "stale-6")
    with pytest.raises(nbqueue.LeaseLost):
        through(fresh_context, "c", "late")

    rows = step_rows(q, job)
    assert rows == {
        "early": {"status": "completed", "attempt": 1, "value": "ok", "error": None},
        "a": {"status": "completed", "attempt": 2, "value": "fresh", "error": None},
    }
    assert called == [
        "early=ok",
        "a=stale-1",
        "a=stale-2",
        "a=stale-3",
        "a=fresh",
        "a=stale-4",
        "b=stale-5",
        "c=stale-6",
        "c=late",
    ]


# -- 4. parents completed while their children are enqueued -------------------------------------


@pytest.mark.slow
def test_racing_parent_completion_and_child_enqueue_never_strand_a_child(make_queue: MakeQueue) -> None:
    """PAIRS parents are claimed up front. Then, pair by pair, two threads on two connections
    meet at a barrier: one completes parent i while the other enqueues a child after it. A
    quarter of the pairs are skewed each way (so both orders surely happen); the rest race.
    Whichever commits first, the child must end up pending, never blocked for good."""
    setup = make_queue()
    parents = setup.enqueue_many([{"parent": i} for i in range(PAIRS)], queue="parents")
    claimed = {}
    for _ in range(PAIRS):
        job = setup.claim(queues="parents", lease=3600)
        assert job is not None
        claimed[job.id] = job
    assert sorted(claimed) == sorted(parents)
    completer, enqueuer = make_queue(), make_queue()
    barrier = threading.Barrier(2, timeout=60)
    children: list[Job | None] = [None] * PAIRS
    errors: list[BaseException] = []

    def complete_parents() -> None:
        rng = random.Random(procs.SEED)
        try:
            for i, parent in enumerate(parents):
                barrier.wait()
                if i % 4 == 1:
                    time.sleep(0.03)  # the child surely comes first: blocked, then freed by this
                elif i % 4 == 3:
                    time.sleep(rng.uniform(0, 0.002))
                completer.complete(claimed[parent], {"i": i})
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    def enqueue_children() -> None:
        rng = random.Random(procs.SEED + 1)
        try:
            for i, parent in enumerate(parents):
                barrier.wait()
                if i % 4 == 2:
                    time.sleep(0.03)  # the parent surely completed first: pending at once
                elif i % 4 == 3:
                    time.sleep(rng.uniform(0, 0.002))
                children[i] = enqueuer.enqueue({"child": i}, queue="children", after=[parent])
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=complete_parents), threading.Thread(target=enqueue_children)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
        assert not thread.is_alive(), "a racing thread is stuck"
    assert errors == [], errors

    made = [child for child in children if child is not None]
    assert len(made) == PAIRS
    at_enqueue = Counter(child.status for child in made)
    assert set(at_enqueue) <= {State.BLOCKED, State.PENDING}, at_enqueue
    assert at_enqueue[State.BLOCKED] > 0 and at_enqueue[State.PENDING] > 0, (
        f"the race never went both ways: {at_enqueue}"
    )

    check = make_queue()
    now = check.get_many([child.id for child in made])
    stranded = [(c.id, c.status.value, c.parents_left) for c in now if c.status is not State.PENDING]
    assert stranded == [], f"children left behind by their completed parents: {stranded[:10]}"
    assert all(c.parents_left == 0 for c in now)
    assert check.counts("parents")["completed"] == PAIRS
    assert check.counts("children") == {**check.counts("children"), "pending": PAIRS, "blocked": 0}
    # ... and each one is really claimable.
    taken = []
    while (job := check.claim(queues="children", lease=60)) is not None:
        taken.append(job.id)
        check.complete(job)
    assert sorted(taken) == sorted(c.id for c in made)
    print(f"\n{PAIRS} racing pairs: at enqueue {dict((s.value, n) for s, n in at_enqueue.items())}")


def test_sibling_parents_completed_at_the_same_moment_release_their_child(make_queue: MakeQueue) -> None:
    """Two parents of one child, completed at the same moment on two connections, round after
    round: each completion counts the child down once, so the child is pending after both.

    (A countdown read and written back as an absolute value, without a row lock, loses one of
    the two decrements, and the child stays blocked for good with parents_left = 1.)"""
    rounds = PAIRS // 2
    setup = make_queue()
    completers = [make_queue(), make_queue()]
    barrier = threading.Barrier(3, timeout=60)
    held: list[Job] = []
    errors: list[BaseException] = []

    def complete(k: int) -> None:
        try:
            for _ in range(rounds):
                barrier.wait()  # this round's parents are claimed
                barrier.wait()  # both complete at once
                completers[k].complete(held[k], {"k": k})
                barrier.wait()  # round over
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=complete, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    children = []
    try:
        for round_no in range(rounds):
            first, second = setup.enqueue({"p": 0}), setup.enqueue({"p": 1})
            children.append(setup.enqueue({"child": round_no}, queue="children", after=[first, second]))
            held[:] = [claim_one(setup, queues="default", lease=3600) for _ in range(2)]
            assert {j.id for j in held} == {first.id, second.id}
            for _ in range(3):
                barrier.wait()
    except threading.BrokenBarrierError:
        pass  # a completer failed: its error is asserted below
    except BaseException:
        barrier.abort()  # no completer is left waiting for this thread
        raise
    finally:
        for thread in threads:
            thread.join(60)
    assert errors == [], errors
    assert setup.counts("default")["completed"] == 2 * rounds
    now = setup.get_many([c.id for c in children])
    stranded = [(c.id, c.status.value, c.parents_left) for c in now if c.status is not State.PENDING]
    assert stranded == [], (
        f"{len(stranded)} of {rounds} children stranded although both their parents completed "
        f"(id, status, parents_left): {stranded[:5]}"
    )


# -- 5. fan-out 200, fan-in 1 -------------------------------------------------------------------


def wait_for_join(q: Queue, join: Job, timeout: float) -> None:
    """Until `join` finished; fails early (not after `timeout`) once nothing else can move and
    it is still blocked: every other job finished, for two seconds in a row."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while not (now := q.get(join.id)).finished:
        counts = q.counts()
        if now.status is State.BLOCKED and counts["pending"] + counts["running"] + counts["failed"] == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 2:
                raise AssertionError(
                    f"the join is stranded blocked with parents_left={now.parents_left} although every "
                    f"other job finished: {counts}"
                )
        else:
            quiet_since = None
        assert time.monotonic() < deadline, f"the join did not finish within {timeout} s: {counts}"
        time.sleep(0.05)


def test_fan_out_200_and_fan_in_1_on_four_worker_threads(queue: Queue) -> None:
    guard = threading.Lock()
    root_calls: list[int] = []
    child_calls: Counter[int] = Counter()
    early: list[tuple[int, str]] = []  # children that saw their root unfinished
    join_calls: list[tuple[list[int], list[int]]] = []
    ids: dict[str, Any] = {}

    @queue.task(name="wf_faults.root")
    def root() -> dict[str, int]:
        with guard:
            root_calls.append(1)
        return {"factor": 3}

    @queue.task(name="wf_faults.child")
    def child(i: int, seed: dict[str, int]) -> int:
        state = queue.get(ids["root"]).status
        with guard:
            child_calls[i] += 1
            if state is not State.COMPLETED:
                early.append((i, state.value))
        return i * seed["factor"]

    @queue.task(name="wf_faults.join")
    def join(values: list[int]) -> int:
        unfinished = [j.id for j in queue.get_many(ids["children"]) if j.status is not State.COMPLETED]
        with guard:
            join_calls.append((values, unfinished))
        return sum(values)

    top = root.enqueue()
    ids["root"] = top.id
    kids = [child.schedule(args=(i, nbqueue.result_of(top)), after=[top]) for i in range(FAN_OUT)]
    ids["children"] = [k.id for k in kids]
    assert all(k.status is State.BLOCKED and k.parents_left == 1 for k in kids)
    last = join.schedule(args=(nbqueue.results_of(kids),), after=kids)
    assert last.status is State.BLOCKED and last.parents_left == FAN_OUT

    worker = queue.worker(concurrency=4, lease=60).start()
    try:
        wait_for_join(queue, last, 180)
    finally:
        assert worker.stop(timeout=30)

    expected = [i * 3 for i in range(FAN_OUT)]
    assert root_calls == [1]
    assert child_calls == Counter(range(FAN_OUT)), "a child ran twice, or never"
    assert early == [], f"children ran before their root completed: {early[:10]}"
    assert len(join_calls) == 1, f"the join ran {len(join_calls)} times"
    assert join_calls[0] == (expected, []), "the join got the wrong values, or ran too early"
    jobs = queue.get_many([top.id, *ids["children"], last.id])
    assert [(j.status, j.attempts) for j in jobs] == [(State.COMPLETED, 1)] * (FAN_OUT + 2)
    assert queue.get(last.id).value == sum(expected)
    assert [queue.get(k).value for k in ids["children"][:3]] == expected[:3]


# -- 6. steps in process mode survive a retry ---------------------------------------------------


def test_steps_in_process_mode_survive_a_retry(queue: Queue, tmp_path: Path) -> None:
    effects, marker = tmp_path / "a.txt", tmp_path / "failed-once"

    @queue.task(name="wf_faults.in_process", max_retries=2, backoff=QUICK_RETRY)
    def in_process(folder: str) -> dict[str, Any]:
        def do_a() -> dict[str, int]:
            with open(os.path.join(folder, "a.txt"), "a") as file:
                file.write(f"{os.getpid()}\n")
            return {"pid": os.getpid()}

        a = nbqueue.step("a", do_a)
        flag = os.path.join(folder, "failed-once")
        if not os.path.exists(flag):
            open(flag, "w").close()
            raise RuntimeError("the first attempt fails after step a")
        return {"a": a, "pid": os.getpid()}

    job = in_process.enqueue(str(tmp_path))
    worker = queue.worker(lease=10, mode="process").start()
    try:
        wait_until(lambda: queue.get(job.id).finished, 60, "the job finished", every=0.05)
    finally:
        assert worker.stop(timeout=30)

    done = queue.get(job.id)
    assert done.status is State.COMPLETED and done.attempts == 2, done
    assert "the first attempt fails after step a" in (done.error or ""), done.error
    assert marker.exists()
    [first_pid] = [int(line) for line in lines(effects)]  # one line: step a ran once, in a child
    assert first_pid != os.getpid()
    assert done.value["a"] == {"pid": first_pid}
    assert done.value["pid"] not in (first_pid, os.getpid())  # the retry ran in a new child
    assert step_rows(queue, job) == {
        "a": {"status": "completed", "attempt": 1, "value": {"pid": first_pid}, "error": None}
    }


# -- 7. cascades walk the children, not the state index ----------------------------------------

#: The statements a cascade runs per level: each must start from the parents' edges.
CASCADE_STATEMENTS = (
    "CHILDREN_BLOCKED",
    "CHILDREN_COUNTED",
    "CHILD_GROUPS",
    "CHILDREN_WAITING",
    "DOOMED_BY",
)


def chain(q: Queue, length: int) -> list[Job]:
    """`length` jobs, each waiting for the one before, written as one workflow."""
    with q.workflow("chain") as wf:
        last = q.enqueue({"level": 0})
        for level in range(1, length):
            last = q.enqueue({"level": level}, after=[last])
    return wf.jobs


def cascade_plans(q: Queue, parent: int, root: int) -> dict[str, str]:
    """Each cascade statement's plan (EXPLAIN QUERY PLAN / EXPLAIN), for the children of `parent`."""
    storage: Any = q.manager.storage
    if q.target.startswith("postgresql"):
        import psycopg

        from nbqueue.storage import postgres_queries as pg_sql

        params = {"ids": [parent], "id": parent, "root": root}
        with psycopg.connect(storage.conninfo) as conn:
            # A table this small is read whole by any plan: seq scans off, the plan among indexes shows.
            conn.execute(f'SET search_path TO "{storage.schema}"; SET enable_seqscan = off')
            return {
                name: "\n".join(
                    str(r[0]) for r in conn.execute("EXPLAIN " + getattr(pg_sql.SQL, name), params)
                )
                for name in CASCADE_STATEMENTS
            }
    from nbqueue.storage import sqlite_queries as lite_sql

    conn, _ = storage._write_conn()
    params = {"ids": f"[{parent}]", "id": parent, "root": root}
    return {
        name: "\n".join(
            str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + getattr(lite_sql.SQL, name), params)
        )
        for name in CASCADE_STATEMENTS
    }


def test_a_cascade_walks_the_edges_of_its_parents_not_every_blocked_job(queue: Queue) -> None:
    """A cascade (a parent finished, cancelled or requeued) reads each level's children from the
    edges by parent, then each child by its id: the plan never starts from the state index (which
    made each level of a 5,000-level chain read every blocked or upstream_failed job: requeue of
    its root held SQLite's write lock 12-17 s). Checked on a chain's plans, statement by statement."""
    jobs = chain(queue, 300)
    queue.cancel(jobs[0])  # 299 upstream_failed jobs, then (requeued) 299 blocked ones
    for moment in ("doomed", "requeued"):
        assert queue.counts()["upstream_failed" if moment == "doomed" else "blocked"] == 299
        for name, plan in cascade_plans(queue, jobs[5].id, jobs[0].id).items():
            assert "nbqueue_status" not in plan, f"{name} ({moment}) starts from the state index:\n{plan}"
            if queue.target.startswith("postgresql"):
                assert "nbqueue_edges_pkey" in plan and "nbqueue_jobs_pkey" in plan, f"{name}:\n{plan}"
            else:
                assert "SEARCH e USING PRIMARY KEY (parent=?)" in plan, f"{name}:\n{plan}"
                assert "SEARCH c USING INTEGER PRIMARY KEY (rowid=?)" in plan, f"{name}:\n{plan}"
        if moment == "doomed":
            queue.requeue(jobs[0])


@pytest.mark.slow
def test_cancel_and_requeue_of_a_5000_level_chain_root_move_the_whole_chain(queue: Queue) -> None:
    """Cancelling a 5,000-level chain's root dooms every level (each naming the root); requeueing
    it blocks them all again, each waiting for its one parent; twice over. (Timed by hand, see
    RELIABILITY.md: each is well under a second on SQLite, where it held the lock 5-17 s.)"""
    jobs = chain(queue, 5_000)
    root, rest = jobs[0], [j.id for j in jobs[1:]]
    for _ in range(2):
        assert queue.cancel(root).status is State.CANCELLED
        doomed = queue.get_many(rest)
        assert {(j.status, j.root_cause) for j in doomed} == {(State.UPSTREAM_FAILED, root.id)}
        assert f"job {root.id} ended cancelled" in (doomed[-1].error or "")
        assert queue.requeue(root) == 1
        again = queue.get_many(rest)
        assert {(j.status, j.parents_left, j.error) for j in again} == {(State.BLOCKED, 1, None)}
        assert queue.get(root.id).status is State.PENDING
    assert queue.counts() == {**{s.value: 0 for s in State}, "pending": 1, "blocked": 4_999}


# -- 8. families: what a running job makes --------------------------------------------------------


def test_a_job_that_enqueues_two_of_itself_stops_at_the_family_limit(make_queue: MakeQueue) -> None:
    """A job that enqueues two copies of itself doubles each generation (19,022 jobs in 10 s, with
    nothing to stop them). Its family (the first job, what it made, what those made...) holds at
    most `family_limit` jobs: the enqueue past it raises FamilyTooLarge, nothing is written, and
    the job that tried is dead with that error. Jobs outside the family are not held back."""
    queue = make_queue(family_limit=30)

    @queue.task(name="family.doubling", max_retries=0)
    def doubling(generation: int) -> int:
        doubling.enqueue(generation + 1)
        doubling.enqueue(generation + 1)
        return generation

    first = doubling.enqueue(0)
    worker = queue.worker(concurrency=2, lease=30).start()
    try:
        wait_until(
            lambda: queue.counts()["pending"] + queue.counts()["running"] == 0, 60, "the family stopped"
        )
    finally:
        assert worker.stop(timeout=30)
    jobs = queue.jobs(limit=1_000)
    assert len(jobs) == 1 + 30, f"{len(jobs)} jobs: the family was not held at 30 made jobs"
    refused = [j for j in jobs if j.status is State.DEAD]
    assert refused, "no job was refused its child"
    assert all(
        "FamilyTooLarge" in (j.error or "") and "family_limit (30)" in (j.error or "") for j in refused
    )
    assert {j.status for j in jobs} == {State.COMPLETED, State.DEAD}
    # A tree, not a chain: a completed job of generation g made two children, and so did each of
    # its g ancestors, so the family of 31 holds at least 2g + 3 jobs: g <= 14 (a chain reaches
    # 30). Two runners do not take the jobs breadth first, so g is 3 to 6 from run to run.
    assert max(j.value for j in jobs if j.status is State.COMPLETED) <= 14
    outsider = queue.enqueue({"not": "family"})  # the test's own enqueue is in no family
    assert queue.get(outsider.id).status is State.PENDING
    assert queue.get(first.id).status is State.COMPLETED
    with pytest.raises(nbqueue.InvalidArgument, match="family_limit"):
        make_queue(family_limit=0)


def test_cancelling_a_job_cancels_what_it_made_and_what_those_made(queue: Queue) -> None:
    """A running job makes two children (they run and each makes a grandchild) and one child that
    waits. Cancelling it cancels, in the same transaction, every unfinished job in its line: the
    waiting child and both grandchildren (found through the finished children); finished jobs stay
    as they are, a job outside the family that waited for a grandchild is upstream_failed, and an
    unrelated job stays pending. The cancelled job's code, still running, cannot make more."""
    ids: dict[str, Any] = {}
    let_go = threading.Event()

    @queue.task(name="family.grandchild")
    def grandchild() -> int:
        return 1

    @queue.task(name="family.child")
    def child(i: int) -> int:
        return grandchild.schedule(queue="idle").id

    @queue.task(name="family.parent")
    def parent() -> None:
        ids["kids"] = [child.schedule(args=(i,), queue="kids").id for i in range(2)]
        ids["waiting"] = child.schedule(args=(99,), queue="idle").id
        let_go.wait(60)
        try:  # cancelled, its code still runs: it makes nothing more
            child.schedule(args=(100,), queue="idle")
        except nbqueue.NbqueueError as exc:
            ids["late"] = exc

    top = parent.enqueue()
    unrelated = queue.enqueue({"unrelated": True}, queue="idle")
    worker = queue.worker(queues=["default", "kids"], concurrency=3, lease=30).start()
    try:
        wait_until(lambda: len(ids) == 2 and queue.counts("kids")["completed"] == 2, 30, "the children ran")
        grandchildren = sorted(queue.get(k).value for k in ids["kids"])
        waits_for_one = queue.enqueue({"outside": "the family"}, queue="idle", after=[grandchildren[0]])
        assert queue.get(top.id).status is State.RUNNING
        assert queue.cancel(top).status is State.CANCELLED
        let_go.set()
        wait_until(lambda: "late" in ids, 10, "the cancelled job tried to make one more")
    finally:
        let_go.set()
        assert worker.stop(timeout=30)
    assert isinstance(ids["late"], nbqueue.InvalidTransition) and "was cancelled" in str(ids["late"])
    assert len(queue.jobs(limit=100)) == 8, "a job was made after its maker was cancelled"
    states = {j.id: j.status for j in queue.get_many([*ids["kids"], ids["waiting"], *grandchildren])}
    assert states == {
        **dict.fromkeys(ids["kids"], State.COMPLETED),
        ids["waiting"]: State.CANCELLED,
        **dict.fromkeys(grandchildren, State.CANCELLED),
    }
    outside = queue.get(waits_for_one.id)
    assert (outside.status, outside.root_cause) == (State.UPSTREAM_FAILED, grandchildren[0])
    assert queue.get(unrelated.id).status is State.PENDING
    assert queue.get(top.id).status is State.CANCELLED


ROLES = {"worker": role_worker}

if __name__ == "__main__":
    sys.exit(ROLES[sys.argv[1]](*sys.argv[2:]))
