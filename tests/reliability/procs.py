"""Child processes of the reliability suite, and the helpers that drive them.

Run as ``python procs.py ROLE ARG...``; the tests import it for the helpers.
Every role prints ``ready`` on stdout once it is set up; roles that start
together then wait for a line on stdin. Whatever goes wrong in a child is
written to its stderr (a traceback) and ends it with a non-zero status, so a
test can assert that stderr is empty and, above all, free of "locked".
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import json
import logging
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
if str(ROOT) not in sys.path:  # the checkout's nbqueue, also when run as a script
    sys.path.insert(0, str(ROOT))

import nbqueue  # noqa: E402

#: 0 for the default run (`make test`); N >= 1 for `make soak` (N scales the soak).
SOAK = int(os.environ.get("NBQUEUE_SOAK") or 0)
#: Seeds every random choice of a run; set NBQUEUE_SEED to replay one.
SEED = int(os.environ.get("NBQUEUE_SEED") or 20_240_611)

TASK = "reliability.work"
TASK_BACKOFF = nbqueue.Backoff(base=2, cap=0.05, jitter=0)
LEASE = 1.0  # seconds: the crash test's worker lease
#: Timeouts grow with the soak: how many times longer than in the default run.
SLACK = 5 * SOAK if SOAK else 1
CHILD_DEADLINE = 300.0 * SLACK  # a child still waiting after this many seconds gives up (and says so)


# -- driving children (used by the tests) ---------------------------------------------


def child_env() -> dict[str, str]:
    """A child Python that imports this checkout of nbqueue."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(role: str, *args: object, stderr: Path) -> subprocess.Popen[str]:
    """Start `python procs.py role args...`; stderr goes to a file (killed children keep it)."""
    with open(stderr, "a") as err:
        return subprocess.Popen(
            [sys.executable, str(HERE), role, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=child_env(),
        )


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The child's next stdout line ('' if it ended), or AssertionError after `timeout` s."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"child {proc.args} printed nothing for {timeout} s"
    return proc.stdout.readline()


def wait_ready(proc: subprocess.Popen[str], stderr: Path, timeout: float = 60) -> None:
    line = read_line(proc, timeout)
    assert line == "ready\n", f"child {proc.args} did not start: {line!r}\n{stderr.read_text()}"


def go(procs: list[subprocess.Popen[str]], at: float | None = None) -> None:
    """Release children waiting on stdin, all at once (`at`: a wall time they may use)."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"go {at or time.time()}\n")
        proc.stdin.flush()


def sigkill(proc: subprocess.Popen[str]) -> int:
    """SIGKILL the child (if it still runs) and reap it; its return code."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    code = proc.wait(30)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):  # a broken pipe to a dead child
                stream.close()
    return code


def reap(procs: list[subprocess.Popen[str]]) -> None:
    """For finally blocks: nothing a test started outlives it."""
    for proc in procs:
        sigkill(proc)


def finish(proc: subprocess.Popen[str], timeout: float) -> int:
    """Wait for a child to end by itself; past `timeout`, have it dump its stacks, kill it, fail."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack to its stderr
        time.sleep(0.5)
        sigkill(proc)
        raise AssertionError(f"child {proc.args} ran over {timeout} s (stacks in its stderr)") from None


def soak(default: int, soaked: int) -> int:
    """`default` in the normal run, `soaked` times NBQUEUE_SOAK in a soak run."""
    return soaked * SOAK if SOAK else default


def create_effects(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(
            "CREATE TABLE effects (job INTEGER, attempt INTEGER, n INTEGER, phase TEXT, "
            "pid INTEGER, worker TEXT, t REAL)"
        )
    conn.close()


def read_effects(path: Path) -> list[tuple[int, int, int, str, int, str, float]]:
    conn = sqlite3.connect(path, timeout=60)
    try:
        return conn.execute("SELECT job, attempt, n, phase, pid, worker, t FROM effects").fetchall()
    finally:
        conn.close()


# -- the task the crash test's workers run -----------------------------------------------


def define_work(q: nbqueue.Queue, effects: Path | None = None, worker_id: str = "") -> Any:
    """Register the crash test's task on `q`.

    A run finds its own claim in the queue (job id and attempt: the fencing
    token), writes a "start" effect, does some real CPU work, writes a "done"
    effect and returns its attempt, so the test can tell which claim completed.
    Producers register it too (without effects): they only enqueue it.
    """
    local = threading.local()

    def effect(job: nbqueue.Job, n: int, phase: str) -> None:
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is None:
            assert effects is not None
            conn = local.conn = sqlite3.connect(effects, timeout=60, isolation_level=None)
            conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(
            "INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job.id, job.attempts, n, phase, os.getpid(), worker_id, time.time()),
        )

    @q.task(name=TASK, max_retries=3, backoff=TASK_BACKOFF)
    def work(n: int) -> dict[str, Any]:
        if effects is None:
            raise RuntimeError("this process only enqueues")
        mine = [j for j in q.jobs(status="running", limit=100_000) if j.task == TASK and j.args == [n]]
        if len(mine) != 1 or mine[0].worker_id != worker_id:
            raise RuntimeError(f"job n={n} runs but is not this worker's claim: {mine!r}")
        job = mine[0]
        effect(job, n, "start")
        digest = hashlib.sha256(str(n).encode()).digest()
        for _ in range(1_000 + n % 4_000):  # about 1-4 ms of real work
            digest = hashlib.sha256(digest).digest()
        effect(job, n, "done")
        return {"n": n, "attempt": job.attempts, "digest": digest.hex()[:16]}

    return work


# -- roles ---------------------------------------------------------------------------


def role_worker(db: str, effects: str, mode: str) -> int:
    """A worker process (concurrency 2). `kill`: runs until killed; `drain`: until nothing is left."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    q = nbqueue.Queue(db)
    worker_id = f"worker-{os.getpid()}"
    define_work(q, Path(effects), worker_id)
    w = q.worker(concurrency=2, lease=LEASE, worker_id=worker_id)
    w.start()
    print("ready", flush=True)
    if mode == "kill":
        time.sleep(CHILD_DEADLINE)
        print("never killed", file=sys.stderr)
        return 2
    deadline = time.monotonic() + CHILD_DEADLINE
    while True:
        counts = q.counts()
        if counts["pending"] + counts["failed"] + counts["running"] == 0:
            break
        if time.monotonic() > deadline:
            print(f"drain gave up: {counts}", file=sys.stderr)
            return 2
        time.sleep(0.05)
    assert w.stop(timeout=30), "the worker's threads did not stop"
    q.close()
    return 0


def role_producer(db: str, ids_path: str, stop_path: str, backlog: str, seed: str) -> int:
    """Enqueues task jobs, one transaction each, until `stop_path` exists; logs 'n id' per job."""
    q = nbqueue.Queue(db)
    work = define_work(q)
    rng = random.Random(int(seed))
    n = 0
    with open(ids_path, "a") as out:

        def one() -> None:
            nonlocal n
            job = work.schedule(args=(n,), max_retries=n % 4)  # 0..3 retries: some jobs may die
            out.write(f"{n} {job.id}\n")  # only after enqueue returned: the job is durable
            out.flush()
            n += 1

        for _ in range(int(backlog)):
            one()
        print("ready", flush=True)
        deadline = time.monotonic() + CHILD_DEADLINE
        while not os.path.exists(stop_path):
            if time.monotonic() > deadline:
                print("producer was never stopped", file=sys.stderr)
                return 2
            one()
            time.sleep(rng.uniform(0.001, 0.004))
    q.close()
    return 0


def role_enqueue_many(db: str, queue: str, count: str) -> int:
    """One big enqueue_many (killed in the middle by the test)."""
    q = nbqueue.Queue(db)
    payloads = [{"i": i, "pad": "x" * 40} for i in range(int(count))]
    print("ready", flush=True)
    ids = q.enqueue_many(payloads, queue=queue)
    print(f"done {len(ids)}", flush=True)
    q.close()
    return 0


def role_claim_loop(db: str, queue: str, lease: str) -> int:
    """Claim and complete as fast as it can, a little work in between (killed by the test)."""
    q = nbqueue.Queue(db)
    print("ready", flush=True)
    while (job := q.claim(queues=queue, lease=float(lease))) is not None:
        digest = hashlib.sha256(json.dumps(job.payload).encode()).digest()
        for _ in range(200):
            digest = hashlib.sha256(digest).digest()
        q.complete(job, {"digest": digest.hex()[:8]})
    print("ran out of jobs", flush=True)
    return 0


CONTENTION_QUEUE = "contention"


def planned_failures(i: int) -> int:
    """How many times the contention consumers fail job number i before completing it."""
    return 2 if i % 50 == 0 else 1 if i % 10 == 0 else 0


def role_contention_producer(db: str, ids_path: str, index: str, count: str, seed: str) -> int:
    """Enqueue `count` jobs, mixing enqueue (one each) and enqueue_many (random batches)."""
    q = nbqueue.Queue(db)
    rng = random.Random(int(seed))
    total, p = int(count), int(index)
    print("ready", flush=True)
    sys.stdin.readline()
    i = 0
    with open(ids_path, "w") as out:
        while i < total:
            if rng.random() < 0.3:
                payloads = [{"p": p, "i": i, "fails": planned_failures(i)}]
                ids = [q.enqueue(payloads[0], queue=CONTENTION_QUEUE).id]
            else:
                size = min(total - i, rng.randint(2, 300))
                payloads = [{"p": p, "i": j, "fails": planned_failures(j)} for j in range(i, i + size)]
                ids = q.enqueue_many(payloads, queue=CONTENTION_QUEUE)
            assert len(ids) == len(payloads), (len(ids), len(payloads))
            out.writelines(f"{pl['i']} {job_id}\n" for pl, job_id in zip(payloads, ids, strict=True))
            i += len(payloads)
    q.close()
    return 0


def role_contention_consumer(db: str, log_path: str, done_path: str, index: str) -> int:
    """Claim + complete (or fail, as planned) until the producers are done and nothing is left."""
    q = nbqueue.Queue(db, backoff=nbqueue.Backoff(base=2, cap=0.01, jitter=0))
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + CHILD_DEADLINE
    with open(log_path, "w") as log:
        while True:
            job = q.claim(queues=CONTENTION_QUEUE, lease=120, worker_id=f"consumer-{index}")
            if job is None:
                if os.path.exists(done_path):
                    counts = q.counts(CONTENTION_QUEUE)
                    if counts["pending"] + counts["failed"] + counts["running"] == 0:
                        break
                if time.monotonic() > deadline:
                    print(f"consumer gave up: {q.counts()}", file=sys.stderr)
                    return 2
                time.sleep(0.002)
                continue
            log.write(f"{job.id} {job.attempts}\n")
            if job.attempts <= job.payload["fails"]:
                verdict = q.fail(job, f"planned failure {job.attempts}")
                assert verdict == "retry", (job, verdict)
            else:
                q.complete(job, {"by": int(index)})
    q.close()
    return 0


OPEN_SLOT = 0.025  # seconds between two files in role_opener


def role_opener(folder: str, index: str, files: str, threads: str, seed: str) -> int:
    """Open brand-new queue files (0.db, 1.db, ...) at the same moments as other openers.

    Each of `threads` threads opens file k at t0 + k * OPEN_SLOT (plus a few ms of
    seeded jitter), t0 being the wall time the test sends on stdin, so that the
    threads of every opener process meet on each file while it is being created.
    Each opener then uses the file (enqueue, claim, complete its own job). Errors
    are written to stderr, one line each, and the walk goes on.
    """
    print("ready", flush=True)
    t0 = float(sys.stdin.readline().split()[1])
    errors: list[str] = []

    def walk(thread: int) -> None:
        rng = random.Random(int(seed) * 1000 + int(index) * 100 + thread)
        mine = f"open-{index}-{thread}"
        for k in range(int(files)):
            time.sleep(max(0.0, t0 + k * OPEN_SLOT + rng.uniform(0.0, 0.004) - time.time()))
            try:
                with nbqueue.Queue(Path(folder) / f"{k}.db") as q:
                    job = q.enqueue({"opener": mine}, queue=mine)
                    claimed = q.claim(queues=mine, lease=60)
                    assert claimed is not None and claimed.id == job.id, (job, claimed)
                    q.complete(claimed)
            except Exception as exc:
                errors.append(f"{k}.db: {type(exc).__module__}.{type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=walk, args=(t,)) for t in range(int(threads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0


ROLES = {
    "worker": role_worker,
    "producer": role_producer,
    "enqueue_many": role_enqueue_many,
    "claim_loop": role_claim_loop,
    "contention_producer": role_contention_producer,
    "contention_consumer": role_contention_consumer,
    "opener": role_opener,
}


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.exit(ROLES[sys.argv[1]](*sys.argv[2:]))
