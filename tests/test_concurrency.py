"""Many claimers on one file: every job exactly once, none lost, even when a worker is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from nbqueue import Backoff, Queue

MakeQueue = Callable[..., Queue]
JOBS = 5_000
ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """A child Python that imports this checkout of nbqueue."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


CLAIMER = textwrap.dedent(
    """
    import json, sys
    import nbqueue

    q = nbqueue.Queue(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    ids = []
    while (job := q.claim(queues="bulk", lease=300)) is not None:
        q.complete(job, {"by": sys.argv[2]})
        ids.append(job.id)
    q.close()
    print(json.dumps(ids))
    """
)


@pytest.mark.slow
def test_threads_claim_every_job_exactly_once(make_queue: MakeQueue) -> None:
    queue = make_queue()
    ids = queue.enqueue_many([{"n": i} for i in range(JOBS)], queue="bulk")
    claimed: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def claimer(slot: int) -> None:
        try:
            q = make_queue() if slot % 2 else queue  # shared Queue object and separate ones
            start.wait()
            while (job := q.claim(queues="bulk", lease=300)) is not None:
                q.complete(job, slot)
                claimed[slot].append(job.id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    every = [i for ids_of_one in claimed for i in ids_of_one]
    duplicates = [i for i, n in Counter(every).items() if n > 1]
    assert duplicates == []
    assert sorted(every) == sorted(ids)
    assert queue.counts()["completed"] == JOBS
    assert sum(queue.counts().values()) == JOBS


@pytest.mark.slow
def test_processes_claim_every_job_exactly_once(queue_target: str, make_queue: MakeQueue) -> None:
    queue = make_queue()
    ids = queue.enqueue_many([{"n": i} for i in range(JOBS)], queue="bulk")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, queue_target, str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for i in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline() == "ready\n", p.communicate(timeout=30)[1]
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert err == ""
    per_process = [json.loads(out) for out, _ in outputs]
    every = [i for one in per_process for i in one]
    assert [i for i, n in Counter(every).items() if n > 1] == []
    assert sorted(every) == sorted(ids)
    assert sum(1 for one in per_process if one) >= 2  # the work really was shared
    assert queue.counts()["completed"] == JOBS
    assert queue.counts()["running"] == 0


CRASHER = textwrap.dedent(
    """
    import sys, time
    import nbqueue

    q = nbqueue.Queue(sys.argv[1])

    @q.task(name="crash.sleepy")
    def sleepy(n):
        time.sleep(300)  # killed long before this ends

    nbqueue.Worker(q, lease=1).start()
    time.sleep(300)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_killed_worker_process_loses_nothing(queue_target: str, make_queue: MakeQueue) -> None:
    queue = make_queue()

    # The same task name as in the child; here it finishes at once.
    @queue.task(name="crash.sleepy", max_retries=3, backoff=Backoff(base=2, cap=0.5, jitter=0))
    def sleepy(n: int) -> str:
        return f"done {n}"

    jobs = [sleepy.enqueue(i) for i in range(3)]
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHER, queue_target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    try:
        deadline = time.monotonic() + 30
        while queue.counts()["running"] == 0:
            assert child.poll() is None, child.communicate()[1].decode()
            assert time.monotonic() < deadline, "the child worker never claimed a job"
            time.sleep(0.02)
        victim = next(j for j in jobs if queue.get(j.id).status == "running")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    assert queue.get(victim.id).status == "running"  # its lease outlives the process

    with queue.worker(lease=1):
        results = [job.result(timeout=30) for job in jobs]
    assert results == ["done 0", "done 1", "done 2"]
    recovered = queue.get(victim.id)
    assert recovered.attempts >= 2
    # Recovered as soon as a worker of this host saw the process gone (or, had its lease run out
    # first, as an expired lease).
    why = recovered.error or ""
    assert f"lost: worker process {child.pid} on " in why or "lease expired" in why, why
    assert queue.counts()["completed"] == 3
    assert sum(queue.counts().values()) == 3


CLOSER = textwrap.dedent(
    """
    import sys, threading, time
    import nbqueue

    for i in range(40):
        q = nbqueue.Queue(sys.argv[1])
        q.enqueue_many([{"n": n} for n in range(50)])
        closed = threading.Event()
        def read():
            try:
                for _ in range(20):
                    late = closed.is_set()
                    q.history(limit=300)
                    q.activity(60)
                    if late:
                        break  # a whole read begun after close() returned: the rest repeat it
            except nbqueue.NbqueueError:
                pass  # "the queue is closed": the one acceptable end
        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.005 * (i % 5))
        q.close()
        closed.set()
        reader.join()
    print("survived", flush=True)
    """
)


@pytest.mark.slow  # a race, so 40 rounds of it in a process of its own: seconds
def test_closing_a_queue_while_another_thread_reads_it_is_safe(queue_target: str) -> None:
    """A board's chart thread may be mid-query when the notebook closes the queue: closing
    another thread's connection under a running statement crashed the process (SIGSEGV)."""
    run = subprocess.run(
        [sys.executable, "-c", CLOSER, queue_target],
        check=False,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert run.stdout.strip() == "survived"
