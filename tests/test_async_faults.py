"""Async jobs against real clients (aiohttp, httpx) and a real server on 127.0.0.1, on both backends.

A job's own TimeoutError is its own error; a worker leaves nothing behind when it stops
(threads, descriptors, connections, per_loop clients); a client of another event loop is
refused before it sends anything, and the error names the loop it came from; a cancel is
logged as a cancel, and stop() after it is quick. The server runs in a process of its own
(tests/slow_server.py), so the counts of threads and descriptors are this process's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx
import pytest

import nbqueue
from nbqueue import Queue
from tests.helpers import wait_until

SERVER = Path(__file__).resolve().parent / "slow_server.py"

# A client kept in a global, as a notebook cell keeps one (the handlers below read it by name).
NOTEBOOK_CLIENT: Any = None
LAZY_CLIENT: Any = None


@dataclass
class Server:
    url: str

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=5) as answer:
            return dict(json.loads(answer.read()))

    def hits(self) -> int:
        return self.stats()["hits"]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    child = subprocess.Popen(
        [sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        yield Server(f"http://127.0.0.1:{port}")
    finally:
        assert child.stdin is not None
        child.stdin.close()  # the server's signal to end
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)


def drain(queue: Queue, **options: Any) -> None:
    with queue.worker(lease=10, **options) as worker:
        worker.run_until_idle(timeout=30)


# -- finding 4: a TimeoutError the job raises is its own error -------------------------------


@pytest.mark.parametrize("job_timeout", [None, 60])
@pytest.mark.parametrize("how", ["aiohttp ClientTimeout", "asyncio.timeout"])
def test_a_timeout_error_raised_by_a_coroutine_job_is_its_own_error(
    queue: Queue, server: Server, how: str, job_timeout: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Retried by its policy, then dead with its own traceback; never 'timed out after 60 s', never
    left running with its async slot taken (the next job on a one-slot worker runs)."""

    async def ask_slow_server() -> str:
        if how == "asyncio.timeout":
            async with asyncio.timeout(0.2), aiohttp.ClientSession() as session:
                async with session.get(f"{server.url}/slow?s=3") as answer:
                    return await answer.text()
        limit = aiohttp.ClientTimeout(total=0.2)
        async with aiohttp.ClientSession(timeout=limit) as session:
            async with session.get(f"{server.url}/slow?s=3") as answer:
                return await answer.text()

    @queue.task(name="aiof.impatient", timeout=job_timeout, max_retries=1, backoff=nbqueue.Backoff(0, 0, 0))
    async def impatient() -> str:
        return await ask_slow_server()

    @queue.task(name="aiof.next")
    async def after() -> str:
        return "ran"

    job, then = impatient.enqueue(), after.enqueue()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="nbqueue.worker"):
        drain(queue, async_concurrency=1)
    assert time.monotonic() - started < 10
    done = queue.get(job.id)
    assert done.status == "dead" and done.retries == 1, (done.status, done.retries, done.error)
    assert "TimeoutError" in (done.error or "") and "timed out after" not in (done.error or "")
    assert list(queue.attempts(job)["outcome"]) == ["failed", "dead"]  # its own error, not nbqueue's deadline
    assert any(f"job {job.id} failed (dead)" in r.getMessage() for r in caplog.records)
    assert queue.get(then.id).value == "ran"  # the one async slot was given back


@pytest.mark.parametrize("job_timeout", [None, 60])
def test_a_timeout_error_raised_by_a_sync_job_through_run_sync_is_its_own_error(
    queue: Queue, server: Server, job_timeout: int | None
) -> None:
    async def ask_slow_server() -> str:
        limit = aiohttp.ClientTimeout(total=0.2)
        async with aiohttp.ClientSession(timeout=limit) as session:
            async with session.get(f"{server.url}/slow?s=3") as answer:
                return await answer.text()

    @queue.task(name="aiof.sync_impatient", timeout=job_timeout, max_retries=0)
    def sync_impatient() -> str:
        return nbqueue.run_sync(ask_slow_server())

    job = sync_impatient.enqueue()
    drain(queue)
    done = queue.get(job.id)
    assert done.status == "dead"
    assert "TimeoutError" in (done.error or "") and "timed out after" not in (done.error or "")


def test_nbqueues_own_deadline_still_says_timed_out_when_the_job_waits_on_a_client(
    queue: Queue, server: Server
) -> None:
    @queue.task(name="aiof.deadline", timeout=0.3, max_retries=0)
    async def deadline() -> str:
        async with aiohttp.ClientSession() as session:  # no timeout of its own
            async with session.get(f"{server.url}/slow?s=3") as answer:
                return await answer.text()

    job = deadline.enqueue()
    drain(queue)
    done = queue.get(job.id)
    assert done.status == "dead" and "timed out after 0.3 s" in (done.error or "")


# -- finding 5: a stopped worker leaves nothing behind ----------------------------------------


def _server_sockets() -> set[str]:
    """The inodes of this machine's TCP sockets to the PostgreSQL server (port 5432)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[2].endswith(":1538"):  # the remote address's port, in hex
                    found.add(fields[9])
    return found


def _descriptors() -> list[str]:
    """What this process's descriptors point at (socket:[inode] for a socket)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed since
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return links


def _counts() -> tuple[int, int]:
    """Threads, and descriptors other than the queue's PostgreSQL connections and its SQLite
    file's: those are checked on their own below. The queue keeps PostgreSQL connections idle
    for its next statements (as many as its threads once needed at one time, however many cycles
    ran); SQLite keeps a closed connection's descriptors open while another connection of the
    process holds a lock on the file (closing one would drop the process's locks), and gives them
    to the next connection it opens, so their number follows the order threads ended in."""
    gc.collect()
    server = _server_sockets()
    outside = [
        link
        for link in _descriptors()
        if link.removeprefix("socket:[")[:-1] not in server and not _queue_file(link)
    ]
    return threading.active_count(), len(outside)


def _queue_file(link: str) -> bool:
    return link.endswith(("/jobs.db", "/jobs.db-wal", "/jobs.db-shm"))


def _queue_files() -> int:
    return sum(1 for link in _descriptors() if _queue_file(link))


def _connections() -> int:
    server = _server_sockets()
    return sum(1 for link in _descriptors() if link.removeprefix("socket:[")[:-1] in server)


@pytest.mark.slow
def test_five_worker_cycles_leave_no_threads_descriptors_or_connections(queue: Queue, server: Server) -> None:
    made: list[str] = []

    def count(kind: str, client: Any) -> Any:
        made.append(kind)
        return client

    @queue.task(name="aiof.fetch")
    async def fetch() -> str:
        # Written inside the job: one client per loop all the same.
        client = nbqueue.per_loop(lambda: count("httpx", httpx.AsyncClient(base_url=server.url)))
        session = nbqueue.per_loop(lambda: count("aiohttp", aiohttp.ClientSession()))
        first = (await client.get("/")).text
        async with session.get(f"{server.url}/") as answer:
            second = await answer.text()
        await asyncio.to_thread(time.sleep, 0.01)  # the loop's executor gets a thread
        return first + second

    @queue.task(name="aiof.sync_fetch")
    def sync_fetch() -> str:
        async def go() -> str:
            client = nbqueue.per_loop(lambda: count("sync httpx", httpx.AsyncClient(base_url=server.url)))
            return (await client.get("/")).text

        return nbqueue.run_sync(go())

    def cycle() -> None:
        jobs = [fetch.enqueue() for _ in range(6)] + [sync_fetch.enqueue() for _ in range(4)]
        drain(queue, concurrency=2)
        assert [queue.get(job.id).status for job in jobs] == ["completed"] * 10

    cycle()  # imports, and the kernel thread's own connections, made once
    start, connected, files = _counts(), _connections(), _queue_files()
    made.clear()
    for _ in range(5):
        cycle()
    # A thread's read connection closes when its ended thread's locals are let go, which may
    # come a moment after the join: settled, not leaked (a leak never settles).
    try:
        wait_until(lambda: _counts() == start, 5, f"(threads, descriptors) back to {start}")
    except AssertionError as exc:  # say what is left over, so a failure in CI can be read
        threads = sorted(t.name for t in threading.enumerate())
        raise AssertionError(
            f"{exc}; now {_counts()}, threads {threads}, descriptors {_descriptors()}"
        ) from None
    # The queue's idle connections are bounded by its threads at one time (a busier cycle may
    # leave a few more), not by the cycles run: one per cycle would be five more.
    assert _connections() < connected + 5, f"connections went from {connected} to {_connections()}"
    assert _queue_files() < files + 5, f"the queue file's descriptors went from {files} to {_queue_files()}"
    assert made.count("httpx") == made.count("aiohttp") == 5  # once per cycle: one loop each
    assert 5 <= made.count("sync httpx") <= 10  # one per runner thread that ran a sync job
    wait_until(lambda: server.stats()["open"] == 0, 5, "every connection to the server closed")


def test_per_loop_closes_what_it_made_with_its_loop_and_knows_a_lambda_by_its_code(queue: Queue) -> None:
    made: list[Closable] = []

    class Closable:
        def __init__(self, tag: str) -> None:
            self.tag, self.closed = tag, False
            made.append(self)

        async def aclose(self) -> None:
            self.closed = True

    def shared() -> Closable:
        return nbqueue.per_loop(lambda: Closable("shared"))  # a new lambda object at each call

    @queue.task(name="aiof.tagged")
    async def tagged(tag: str) -> str:
        own = nbqueue.per_loop(lambda: Closable(tag))  # captures its tag: one per tag
        assert shared() is shared()
        return f"{shared().tag}/{own.tag}"

    jobs = [tagged.enqueue(tag) for tag in ["a", "b", "a", "b", "a"]]
    drain(queue, concurrency=1)
    assert [queue.get(job.id).value for job in jobs] == ["shared/a", "shared/b"] * 2 + ["shared/a"]
    assert sorted(c.tag for c in made) == ["a", "b", "shared"]
    assert all(c.closed for c in made), [(c.tag, c.closed) for c in made]


# -- finding 9: a client of another event loop ------------------------------------------------


async def _get(client: Any, url: str) -> str:
    if isinstance(client, httpx.AsyncClient):
        return (await client.get(url)).text
    async with client.get(url) as answer:
        return str(await answer.text())


def _make(kind: str) -> Any:
    return httpx.AsyncClient() if kind == "httpx" else aiohttp.ClientSession()


@pytest.mark.parametrize("kind", ["httpx", "aiohttp"])
@pytest.mark.parametrize("held", ["global", "closure"])
def test_a_client_of_the_notebooks_loop_is_refused_before_the_request_is_sent(
    queue: Queue, server: Server, kind: str, held: str
) -> None:
    """As a notebook does: a client made and used on the kernel's loop (here asyncio.run in the main
    thread), then used in a job. The job is dead at once (a retry cannot help), nothing reached the
    server, and the notebook's own client still works."""
    global NOTEBOOK_CLIENT
    url = f"{server.url}/"

    async def notebook() -> tuple[str, str, str]:
        global NOTEBOOK_CLIENT
        client = NOTEBOOK_CLIENT = _make(kind)
        try:
            first = await _get(client, url)
            before = server.hits()

            @queue.task(name="aiof.uses_global", max_retries=3)
            async def uses_global() -> str:
                return await _get(NOTEBOOK_CLIENT, url)

            @queue.task(name="aiof.uses_closure", max_retries=3)
            async def uses_closure() -> str:
                return await _get(client, url)

            job = (uses_global if held == "global" else uses_closure).enqueue()
            with pytest.raises(nbqueue.JobFailed):
                await job
            assert server.hits() == before, "the job's request reached the server"
            error = queue.get(job.id).error or ""
            assert queue.get(job.id).retries == 0
            return first, error, await _get(client, url)
        finally:
            await client.close() if kind == "aiohttp" else await client.aclose()

    try:
        with queue.worker(lease=10):
            first, error, after = asyncio.run(notebook())
    finally:
        NOTEBOOK_CLIENT = None
    assert first == after == "ok"  # the notebook's client still works
    assert "ForeignLoopError" in error and "the notebook's event loop" in error, error
    assert "nothing was sent" in error and "per_loop" in error


def test_a_sync_job_using_a_client_of_the_notebooks_loop_through_run_sync_is_refused(
    queue: Queue, server: Server
) -> None:
    async def notebook() -> str:
        client = httpx.AsyncClient()
        try:
            await client.get(f"{server.url}/")
            before = server.hits()

            @queue.task(name="aiof.sync_uses_notebook_client")
            def sync_job() -> str:
                async def go() -> str:
                    return (await client.get(f"{server.url}/")).text

                return nbqueue.run_sync(go())

            job = sync_job.enqueue()
            with pytest.raises(nbqueue.JobFailed):
                await job
            assert server.hits() == before
            return queue.get(job.id).error or ""
        finally:
            await client.aclose()

    with queue.worker(lease=10):
        error = asyncio.run(notebook())
    assert "ForeignLoopError" in error and "the notebook's event loop" in error
    assert "run_sync event loop" in error


@pytest.mark.parametrize("kind", ["httpx", "aiohttp"])
def test_after_a_worker_restart_a_client_kept_from_the_old_loop_names_that_workers_loop(
    queue: Queue, server: Server, kind: str
) -> None:
    """A job keeps the client it made in a global; the next worker's loop cannot use it. The error
    says it came from the stopped worker (not from the notebook), before anything is sent."""
    global LAZY_CLIENT

    @queue.task(name="aiof.lazy", max_retries=2)
    async def lazy() -> str:
        global LAZY_CLIENT
        if LAZY_CLIENT is None:
            LAZY_CLIENT = _make(kind)
        return await _get(LAZY_CLIENT, f"{server.url}/")

    try:
        first = lazy.enqueue()
        with queue.worker(lease=10) as old:
            assert first.result(timeout=10) == "ok"
        before = server.hits()
        second = lazy.enqueue()
        with queue.worker(lease=10):
            with pytest.raises(nbqueue.JobFailed):
                second.result(timeout=10)
        assert server.hits() == before
    finally:
        LAZY_CLIENT = None
    done = queue.get(second.id)
    error = done.error or ""
    assert done.retries == 0 and "ForeignLoopError" in error
    assert f"the event loop of worker {old.worker_id}, which has stopped" in error, error
    assert "notebook" not in error


def test_event_loop_is_closed_is_explained_with_the_loop_it_came_from(queue: Queue, server: Server) -> None:
    """A client reached through another object cannot be seen before the job runs: its error
    ("Event loop is closed") is explained afterwards, naming the stopped worker's loop."""
    holder = SimpleNamespace(client=None)

    @queue.task(name="aiof.held", max_retries=0)
    async def held() -> str:
        if holder.client is None:
            holder.client = httpx.AsyncClient()
        return (await holder.client.get(f"{server.url}/")).text

    first = held.enqueue()
    with queue.worker(lease=10) as old:
        assert first.result(timeout=10) == "ok"
    second = held.enqueue()
    with queue.worker(lease=10):
        with pytest.raises(nbqueue.JobFailed):
            second.result(timeout=10)
    error = queue.get(second.id).error or ""
    assert "ForeignLoopError" in error and "Event loop is closed" in error, error
    assert f"the event loop of worker {old.worker_id}, which has stopped" in error


def test_an_object_of_the_notebooks_running_loop_reached_through_another_is_explained(
    queue: Queue,
) -> None:
    holder = SimpleNamespace(event=None)

    async def notebook() -> str:
        holder.event = asyncio.Event()
        waiter = asyncio.create_task(holder.event.wait())  # binds it to this (the notebook's) loop
        await asyncio.sleep(0)

        @queue.task(name="aiof.waits", max_retries=0)
        async def waits() -> None:
            await holder.event.wait()  # type: ignore[union-attr]

        job = waits.enqueue()
        with pytest.raises(nbqueue.JobFailed):
            await job
        waiter.cancel()
        return queue.get(job.id).error or ""

    with queue.worker(lease=10):
        error = asyncio.run(notebook())
    assert "ForeignLoopError" in error and "the notebook's event loop" in error, error


def test_a_cancel_is_logged_as_a_cancel_and_stop_after_it_is_quick(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """One async slot: one job awaits, two wait for the slot. All three cancelled, then stop()."""
    started: list[int] = []

    @queue.task(name="aiof.long")
    async def long(i: int) -> None:
        started.append(i)
        await asyncio.sleep(30)

    jobs = [long.enqueue(i) for i in range(3)]
    worker = queue.worker(lease=10, concurrency=1, async_concurrency=1).start()
    with caplog.at_level(logging.INFO, logger="nbqueue.worker"):
        try:
            wait_until(lambda: started, 10, "the first job running")
            for job in jobs:
                queue.cancel(job.id)
            began = time.monotonic()
            assert worker.stop()
            took = time.monotonic() - began
        finally:
            worker.stop()
    assert took < 1.0, f"stop() took {took:.1f} s after the cancels"
    assert [queue.get(job.id).status for job in jobs] == ["cancelled"] * 3
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "released back to pending" in m], messages
    assert any(f"job {jobs[0].id} cancelled" in m for m in messages), messages


def test_stop_gives_back_at_once_a_coroutine_job_waiting_for_an_async_slot(queue: Queue) -> None:
    """The runner waiting for the one slot no longer holds stop() until its timeout: the job it
    holds goes back to pending unrun (no attempt counted), the running one is released."""
    started: list[int] = []

    @queue.task(name="aiof.occupies")
    async def occupies(i: int) -> None:
        started.append(i)
        await asyncio.sleep(30)

    jobs = [occupies.enqueue(i) for i in range(3)]
    worker = queue.worker(lease=10, concurrency=1, async_concurrency=1).start()
    try:
        wait_until(lambda: started, 10, "the first job running")
        wait_until(lambda: len(worker.status()["in_flight"]) == 2, 10, "a second job waiting for the slot")
        began = time.monotonic()
        assert worker.stop()
        took = time.monotonic() - began
    finally:
        worker.stop()
    assert took < 1.0, f"stop() took {took:.1f} s"
    assert started == [0]
    assert [queue.get(job.id).status for job in jobs] == ["pending"] * 3
    assert [queue.get(job.id).attempts for job in jobs[1:]] == [0, 0]  # never started: no attempt spent
