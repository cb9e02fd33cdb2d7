"""`make demo`: a short, real scenario on the embedded SQLite default.

Twelve "page fetches" run through a background worker. Some fail once or twice
and succeed on retry; some fail every time and end in the dead-letter queue.
Then the cause is "fixed", the dead letters are requeued, and everything completes.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import nbqueue

FLAKY = {"/blog": 1, "/docs": 2, "/pricing": 1}  # page -> failures before it works
BROKEN = {"/legacy", "/old-api"}  # fail until the cause is fixed
fixed = False
calls: Counter[str] = Counter()


def main(path: str | None = None) -> int:
    """Run the scenario and print what happened; returns an exit status."""
    folder = tempfile.mkdtemp(prefix="nbqueue-demo-")
    db = path or str(Path(folder) / "demo.db")
    # A short backoff cap keeps the demo brisk; the default is base 2, cap 3600 s.
    q = nbqueue.Queue(db, backoff=nbqueue.Backoff(base=2, cap=0.2, jitter=0.1))

    @q.task(name="fetch", max_retries=2)
    def fetch(page: str) -> dict[str, object]:
        calls[page] += 1
        if page in BROKEN and not fixed:
            raise ConnectionError(f"{page}: 502 Bad Gateway from the origin")
        if calls[page] <= FLAKY.get(page, 0):
            raise TimeoutError(f"{page}: read timed out (attempt {calls[page]})")
        return {"page": page, "bytes": 1000 + 37 * len(page)}

    pages = [
        "/",
        "/about",
        "/blog",
        "/docs",
        "/pricing",
        "/careers",
        "/legacy",
        "/contact",
        "/old-api",
        "/status",
        "/terms",
        "/privacy",
    ]
    print(f"nbqueue demo: queue file {db}")
    jobs = [fetch.enqueue(page) for page in pages]
    print(f"enqueued {len(jobs)} fetches; a worker with 3 threads runs them, retrying failures")
    with q.worker(concurrency=3, lease=10) as worker:
        worker.run_until_idle()
        while q.counts()["failed"]:  # retries scheduled a moment later
            time.sleep(0.05)
            worker.run_until_idle()
    _summary(q, "after the first pass")

    dead = q.dead_letters()  # a DataFrame: one row per dead job, with its traceback
    print(f"\n{len(dead)} dead letter(s) wait for a person: jobs {sorted(dead['id'])}")

    global fixed
    fixed = True
    print("\nthe origin is fixed; requeueing the dead letters")
    print(f"requeued {q.requeue()} job(s)")
    q.worker(concurrency=3).run_until_idle()
    _summary(q, "after the requeue")

    results = [job.result(timeout=10) for job in jobs]
    total = sum(int(r["bytes"]) for r in results)
    print(
        f"\nall {len(results)} pages fetched, {total:,} bytes; calls per page: "
        f"{dict(sorted(calls.items(), key=lambda kv: -kv[1])[:5])} ..."
    )
    ok = q.counts()["completed"] == len(pages)
    q.close()
    return 0 if ok else 1


def _summary(q: nbqueue.Queue, when: str) -> None:
    counts = {state: n for state, n in q.counts().items() if n}
    print(f"\n{when}: " + ", ".join(f"{n} {state}" for state, n in counts.items()))
    print(f"  {'job':>3}  {'page':<10} {'status':<10} {'runs':>4}  last error")
    for job in reversed(q.jobs(limit=100)):
        error = (job.error or "").strip().splitlines()[-1:] or ["-"]
        print(f"  {job.id:>3}  {job.args[0]:<10} {job.status.value:<10} {job.attempts:>4}  {error[0][:60]}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
