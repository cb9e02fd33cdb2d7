"""Files a job keeps (a notebook job's executed notebook) on both backends: written only under
the job's live claim, replaced by name, listed for the board, and deleted with the job."""

from __future__ import annotations

from typing import Any

import pytest

import nbqueue
from nbqueue import Job, Queue
from tests.helpers import wait_until

NOTEBOOK = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def _claimed(q: Queue, **options: Any) -> Job:
    job = q.enqueue({"work": True}, **options)
    claim = q.claim(lease=60)
    assert claim is not None and claim.id == job.id
    return claim


def _finished_with_file(q: Queue, name: str = "out.ipynb") -> int:
    """A job completed after keeping a file."""
    claim = _claimed(q)
    assert q.manager.journal.save_file(claim, name, NOTEBOOK)
    q.complete(claim, "ok")
    return claim.id


def test_a_file_saved_under_the_claim_is_read_back_and_replaced_by_name(queue: Queue) -> None:
    claim = _claimed(queue)
    assert queue.manager.journal.load_file(claim.id, "out.ipynb") is None
    assert queue.manager.journal.save_file(claim, "out.ipynb", NOTEBOOK)
    assert queue.manager.journal.load_file(claim.id, "out.ipynb") == NOTEBOOK
    assert queue.manager.journal.save_file(claim, "out.ipynb", "second")  # an upsert, not a second file
    assert queue.manager.journal.save_file(claim, "log.txt", "héllo ✓\n" * 1000)
    assert queue.manager.journal.load_file(claim.id, "out.ipynb") == "second"
    assert queue.manager.journal.load_file(claim.id, "log.txt") == "héllo ✓\n" * 1000
    assert queue.manager.journal.file_names([claim.id]) == {claim.id: ["log.txt", "out.ipynb"]}
    queue.complete(claim, "ok")
    assert queue.manager.journal.load_file(claim.id, "out.ipynb") == "second"  # kept after the job finished


def test_a_job_not_running_under_that_claim_gets_nothing_written(queue: Queue) -> None:
    first = _claimed(queue)
    assert queue.release(first)
    second = queue.claim(lease=60)
    assert second is not None and second.id == first.id and second.attempts == first.attempts + 1
    assert queue.manager.journal.save_file(second, "out.ipynb", "live")
    assert not queue.manager.journal.save_file(first, "out.ipynb", "stale")  # a stale worker writes nothing
    assert not queue.manager.journal.save_file(first, "other.ipynb", "stale")
    assert queue.manager.journal.load_file(first.id, "out.ipynb") == "live"
    queue.complete(second, "ok")
    assert not queue.manager.journal.save_file(second, "out.ipynb", "late")  # finished: the claim is gone
    cancelled = _claimed(queue)
    queue.cancel(cancelled.id)
    pending = queue.enqueue({"waiting": True})
    assert not queue.manager.journal.save_file(pending, "out.ipynb", NOTEBOOK)  # never claimed
    assert not queue.manager.journal.save_file(cancelled, "out.ipynb", "cancelled")
    assert queue.manager.journal.file_names([pending.id, first.id, cancelled.id]) == {first.id: ["out.ipynb"]}
    assert queue.manager.journal.load_file(first.id, "out.ipynb") == "live"
    assert queue.manager.journal.load_file(first.id, "other.ipynb") is None


def test_an_expired_lease_writes_nothing(clocked_queue: Queue, clock: Any) -> None:
    job = clocked_queue.enqueue({"work": True})
    claim = clocked_queue.claim(lease=5)
    assert claim is not None and claim.id == job.id
    clock.advance(10)
    assert not clocked_queue.manager.journal.save_file(claim, "out.ipynb", NOTEBOOK)
    assert clocked_queue.manager.journal.load_file(claim.id, "out.ipynb") is None


def test_file_names_lists_each_jobs_files_for_the_board(queue: Queue) -> None:
    with_files = _claimed(queue)
    for name in ("b.txt", "a.ipynb", "c.html"):
        assert queue.manager.journal.save_file(with_files, name, name)
    without = queue.enqueue({"plain": True})
    assert queue.manager.journal.file_names([]) == {}
    assert queue.manager.journal.file_names([without.id]) == {}
    assert queue.manager.journal.file_names([with_files.id, without.id, 10_000]) == {
        with_files.id: ["a.ipynb", "b.txt", "c.html"]
    }
    with pytest.raises(nbqueue.JobNotFound):
        queue.manager.journal.file_names([0])
    with pytest.raises(nbqueue.JobNotFound):
        queue.manager.journal.load_file(-1, "out.ipynb")
    with pytest.raises(nbqueue.InvalidArgument):
        queue.manager.journal.save_file(with_files, "", "empty name")
    with pytest.raises(nbqueue.InvalidArgument):
        queue.manager.journal.save_file(with_files, "bytes", b"not text")  # type: ignore[arg-type]


def test_delete_takes_a_jobs_files_with_it(queue: Queue) -> None:
    gone = _finished_with_file(queue)
    kept = _finished_with_file(queue)
    assert queue.delete(gone) == 1
    assert queue.manager.journal.load_file(gone, "out.ipynb") is None
    assert queue.manager.journal.file_names([gone, kept]) == {kept: ["out.ipynb"]}
    assert queue.manager.journal.load_file(kept, "out.ipynb") == NOTEBOOK


def test_purge_takes_the_purged_jobs_files_with_them(clocked_queue: Queue, clock: Any) -> None:
    q = clocked_queue
    old = _finished_with_file(q)
    clock.advance(10)
    young = _finished_with_file(q)
    assert q.purge("completed", older_than=5) == 1
    assert q.manager.journal.file_names([old, young]) == {young: ["out.ipynb"]}
    assert q.purge("completed", older_than=0) == 1
    assert q.manager.journal.file_names([old, young]) == {}


def test_retention_prunes_old_jobs_with_their_files(clocked_queue: Queue, clock: Any) -> None:
    q = clocked_queue
    old = _finished_with_file(q)
    clock.advance(10)
    young = _finished_with_file(q)
    worker = q.worker(lease=5, retention=5).start()
    try:
        wait_until(lambda: q.counts()["completed"] == 1, 10, "the old job pruned")
    finally:
        worker.stop(timeout=10)
    assert q.manager.journal.load_file(old, "out.ipynb") is None
    assert q.manager.journal.file_names([old, young]) == {young: ["out.ipynb"]}
