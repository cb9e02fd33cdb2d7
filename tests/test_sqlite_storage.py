"""What only the SQLite backend does: the file itself, its mode, its pragmas, its refusals."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import sqlite3
import stat
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import nbqueue
from nbqueue import Queue
from nbqueue.storage.sqlite import PAGE_SIZE


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make `path` really unwritable, even for root (chmod alone does not stop root)."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], check=False).returncode != 0:
        pytest.xfail("running as root without a working `chattr +i`: cannot make a file read-only")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_new_file_is_created_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with Queue(path) as q:
        q.enqueue({"n": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_path_like_and_str_open_the_same_file(tmp_path: Path) -> None:
    with Queue(tmp_path / "a.db") as q:
        job = q.enqueue({"n": 1})
    with Queue(str(tmp_path / "a.db")) as q:
        assert q.get(job.id).payload == {"n": 1}


def test_wal_mode_is_on(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    with Queue(path) as q:
        q.enqueue({"n": 1})
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_synchronous_full_is_applied(tmp_path: Path) -> None:
    with Queue(tmp_path / "full.db", synchronous="full") as q:
        q.enqueue({"n": 1})
        assert q.counts()["pending"] == 1
        # 2 = FULL; the pragma is per connection, so ask the queue's own ones (the one that
        # writes above all).
        assert synchronous_of(q) == {2}
    with Queue(tmp_path / "normal.db") as q:
        assert synchronous_of(q) == {1}


def synchronous_of(q: Queue) -> set[int]:
    """PRAGMA synchronous on this thread's reading connection and on the writing one."""
    storage = q.manager.storage
    conns = [storage._conn()[0], storage._write_conn()[0]]  # type: ignore[attr-defined]
    return {conn.execute("PRAGMA synchronous").fetchone()[0] for conn in conns}


@pytest.mark.parametrize("value", ["bogus", "FULLY", "off", ""])
def test_bad_synchronous_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(nbqueue.InvalidArgument, match="synchronous"):
        Queue(tmp_path / "x.db", synchronous=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("target", [":memory:", "file::memory:?cache=shared"])
def test_in_memory_database_is_refused(target: str) -> None:
    with pytest.raises(nbqueue.InvalidArgument, match="memory"):
        Queue(target)


def test_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(nbqueue.NbqueueError):
        Queue(tmp_path / "no" / "such" / "folder" / "jobs.db")


def test_garbage_file_is_not_a_queue(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is certainly not a SQLite database\n" * 200)
    with pytest.raises(nbqueue.NotAQueueDatabase):
        Queue(path)
    assert path.read_bytes().startswith(b"this is certainly not")  # left untouched


def test_sqlite_file_of_another_app_is_not_a_queue(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('Ada')")
    conn.commit()
    conn.close()
    with pytest.raises(nbqueue.NotAQueueDatabase):
        Queue(path)
    conn = sqlite3.connect(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"customers"}  # nothing was added to someone else's database
    finally:
        conn.close()


def test_sqlite_file_with_a_foreign_application_id_is_not_a_queue(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 12345")
    conn.commit()
    conn.close()
    with pytest.raises(nbqueue.NotAQueueDatabase):
        Queue(path)


def test_empty_sqlite_file_becomes_a_queue(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    with Queue(path) as q:
        assert q.enqueue({"n": 1}).status == "pending"


def test_schema_too_new(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with Queue(path) as q:
        q.enqueue({"n": 1})
    conn = sqlite3.connect(path)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    assert version >= 1
    conn.execute(f"PRAGMA user_version = {version + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(nbqueue.SchemaTooNew, match="upgrade"):
        Queue(path)


def test_reopening_keeps_the_jobs(tmp_path: Path) -> None:
    path = tmp_path / "again.db"
    with Queue(path) as q:
        ids = q.enqueue_many([{"n": i} for i in range(3)])
    with Queue(path) as q:
        assert [q.get(i).payload for i in ids] == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert q.counts()["pending"] == 3


def test_read_only_file_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    with Queue(path) as q:
        job = q.enqueue({"n": 1})
    with read_only(path):
        q = Queue(path)
        try:
            assert q.get(job.id).payload == {"n": 1}  # reading still works
            with pytest.raises(nbqueue.ReadOnlyDatabase):
                q.enqueue({"n": 2})
            with pytest.raises(nbqueue.ReadOnlyDatabase):
                q.claim()
        finally:
            q.close()
    with Queue(path) as q:
        assert q.counts()["pending"] == 1
        assert q.get(job.id).status == "pending"


def test_closed_queue_refuses_work(tmp_path: Path) -> None:
    q = Queue(tmp_path / "closed.db")
    q.enqueue({"n": 1})
    q.close()
    with pytest.raises(nbqueue.StorageError):
        q.enqueue({"n": 2})


def test_a_new_file_has_small_pages(tmp_path: Path) -> None:
    """2 KiB pages: each commit writes fewer bytes to the WAL. (Files made with 4 KiB pages by
    earlier versions are used as they are: the migration tests open such files.)"""
    with Queue(tmp_path / "new.db") as q:
        q.enqueue({"n": 1})
    assert sqlite3.connect(tmp_path / "new.db").execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 2048
    big = "x" * 100_000  # a payload over many pages still round-trips
    with Queue(tmp_path / "new.db") as q:
        assert q.get(q.enqueue({"big": big}).id).payload == {"big": big}


def test_a_queue_dropped_without_close_closes_its_connections(tmp_path: Path) -> None:
    """A notebook that opens its queue again (q = Queue(path) in a cell run twice) drops the
    old one: once collected, its connections are closed, with no 'unclosed database' warning."""
    q = Queue(tmp_path / "q.db")
    q.enqueue({"n": 1})
    with q.worker() as worker:  # its threads read, then end
        worker.run_until_idle()
    claimed = q.claim()
    assert claimed is not None
    q.complete(claimed, result=2)
    assert q.counts()["completed"] == 1
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del q, worker, claimed
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not unclosed, unclosed
    open_files = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own descriptor is gone by now)
            open_files.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert not [f for f in open_files if f.startswith(str(tmp_path))], open_files
