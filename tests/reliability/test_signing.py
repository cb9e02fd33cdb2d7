"""A notebook's worker runs code only for jobs its own user queued (nbqueue.signing).

The review found that a kernel's worker ran any `%%enqueue` code job and adopted
any notebook function an unfinished row named, whoever wrote the row: on a
shared PostgreSQL queue, anyone with INSERT had code execution in the kernel.
Now what the magics queue is signed (HMAC over task and payload, with a secret
only the user can read), and a forged, altered or unsigned row never runs: it
stays pending, with the reason in its error. Real processes play the other
writers; both backends.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue, signing
from nbqueue.cells import CELL_TASK, register_cell_task
from nbqueue.trust import covered
from tests.helpers import MakeQueue

ROOT = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    """
    import sys
    import nbqueue

    q = nbqueue.Queue(sys.argv[1])
    signed = sys.argv[3] == "signed"
    task = q.task(name=sys.argv[2], signed=signed)(lambda path: open(path, "w").write("ran"))
    print(task.enqueue(sys.argv[4]).id)
    """
)


def write_from_another_process(
    target: str, task: str, path: Path, *, signed: bool, secret: Path | None
) -> int:
    """Queue `task(path)` from a separate Python process, signing with `secret` (None: this run's)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if secret is not None:
        env["NBQUEUE_SECRET_FILE"] = str(secret)
    done = subprocess.run(
        [sys.executable, "-c", WRITER, target, task, "signed" if signed else "plain", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip())


def notebook_task(q: Queue, name: str) -> Any:
    """What `%enqueue` registers for a notebook function: a signed task."""
    return q.task(name=name, signed=True)(lambda path: Path(path).write_text("ran") and "ran")


def test_a_signed_job_of_this_user_runs(queue: Queue, tmp_path: Path) -> None:
    task = notebook_task(queue, "sig.write")
    job = task.enqueue(str(tmp_path / "mine"))
    row = queue.manager.storage.get(job.id)
    assert row is not None and row[4] == json.dumps(
        {"args": [str(tmp_path / "mine")], "kwargs": {}}, separators=(",", ":")
    )
    assert job.signature and signing.verify_job(queue.manager.trust.identity, covered(row), job.signature)
    queue.worker(lease=5).run_until_idle(timeout=20)
    assert queue.get(job.id).value == "ran"
    assert (tmp_path / "mine").read_text() == "ran"


def test_a_job_another_process_wrote_unsigned_never_runs(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """The same task name, written through the public API by another process: stays pending."""
    q = make_queue()
    notebook_task(q, "sig.write")
    target = tmp_path / "theirs"
    job_id = write_from_another_process(queue_target, "sig.write", target, signed=False, secret=None)
    ours = notebook_task(q, "sig.write").enqueue(str(tmp_path / "ours"))
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(ours.id).status == "completed"  # the worker did run the signed one ...
    theirs = q.get(job_id)
    assert theirs.status == "pending" and theirs.attempts == 0  # ... and never claimed this one
    assert not target.exists()


def test_a_job_signed_with_another_users_secret_is_refused_with_a_reason(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    q = make_queue()
    notebook_task(q, "sig.write")
    target = tmp_path / "theirs"
    other_secret = tmp_path / "other-user" / "secret"
    job_id = write_from_another_process(queue_target, "sig.write", target, signed=True, secret=other_secret)
    assert q.get(job_id).signature  # signed, but not by us
    q.worker(lease=5).run_until_idle(timeout=20)
    refused = q.get(job_id)
    assert refused.status == "pending"
    assert "not signed by this notebook's user" in (refused.error or "")
    assert refused.signature is None  # never claimed as signed again
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(job_id).attempts == refused.attempts  # not taken again
    assert not target.exists()


def test_the_same_user_in_another_process_is_trusted_and_approve_signs_a_job(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """A restarted kernel of the same user reads the same secret; approve() lets a person vouch."""
    q = make_queue()
    notebook_task(q, "sig.write")
    same_user = write_from_another_process(
        queue_target, "sig.write", tmp_path / "a", signed=True, secret=None
    )
    stranger = write_from_another_process(
        queue_target, "sig.write", tmp_path / "b", signed=False, secret=None
    )
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(same_user).status == "completed"
    assert q.get(stranger).status == "pending"
    assert q.approve([stranger]) == 1
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(stranger).status == "completed"
    assert (tmp_path / "b").read_text() == "ran"


def test_a_forged_or_altered_row_never_runs(queue_target: str, make_queue: MakeQueue, tmp_path: Path) -> None:
    """Rows written by hand: a code job with a made-up signature, a signed job whose payload changed."""
    q = make_queue()
    cell = register_cell_task(q.manager)
    sentinel = tmp_path / "forged"
    code = f"import pathlib\npathlib.Path({str(sentinel)!r}).write_text('ran')"
    forged = cell.schedule((code, "forged"))
    honest = notebook_task(q, "sig.write").enqueue(str(tmp_path / "honest"))
    altered_to = str(tmp_path / "altered")
    set_columns(queue_target, forged.id, signature="0" * 64)
    set_columns(queue_target, honest.id, payload=json.dumps({"args": [altered_to], "kwargs": {}}))
    q.worker(lease=5, allow=[CELL_TASK]).run_until_idle(timeout=20)
    for job_id in (forged.id, honest.id):
        job = q.get(job_id)
        assert job.status == "pending", job
        assert "not signed" in (job.error or "")
    assert not sentinel.exists()
    assert not Path(altered_to).exists()


def set_columns(target: str, job_id: int, **values: str) -> None:
    """Change a job's columns behind nbqueue's back (what anyone with write access could do)."""
    names = ", ".join(f"{name} = %s" for name in values)
    if "://" in target:
        import psycopg

        server, schema = target.split("?schema=")
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{schema}".nbqueue_jobs SET {names} WHERE id = %s', (*values.values(), job_id)
            )
    else:
        import sqlite3

        with sqlite3.connect(target) as conn:
            conn.execute(
                f"UPDATE nbqueue_jobs SET {names.replace('%s', '?')} WHERE id = ?", (*values.values(), job_id)
            )


def test_the_secret_is_private_and_a_readable_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config" / "secret"
    monkeypatch.setenv("NBQUEUE_SECRET_FILE", str(path))
    first = signing.sign("t", "{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert signing.sign("t", "{}") == first  # the same secret, read again
    assert signing.sign("t", '{"x":1}') != first and signing.sign("u", "{}") != first
    other = tmp_path / "open" / "secret"
    other.parent.mkdir()
    other.write_text("x" * 64)
    other.chmod(0o644)
    monkeypatch.setenv("NBQUEUE_SECRET_FILE", str(other))
    with pytest.raises(signing.SigningError, match="chmod 600"):
        signing.sign("t", "{}")
    assert isinstance(signing.SigningError("x"), nbqueue.NbqueueError)
