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
from nbqueue.cells import CELL_TASK
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


def test_the_same_user_in_another_process_is_trusted_and_trust_signs_a_job(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """A restarted kernel of the same user reads the same secret; trust() lets a person vouch."""
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
    assert q.trust([stranger]) == 1
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(stranger).status == "completed"
    assert (tmp_path / "b").read_text() == "ran"


def test_a_forged_or_altered_row_never_runs(queue_target: str, make_queue: MakeQueue, tmp_path: Path) -> None:
    """Rows written by hand: a code job with a made-up signature, a signed job whose payload changed."""
    q = make_queue()
    cell = q.cell_task()
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


# -- issue 23: a signature binds one job, in one database, for its own run -------------------------

RAN = "ran.log"


def counting_task(q: Queue, name: str = "sig.count") -> Any:
    """A signed task that appends a line to a file each time it runs (how often did it run?)."""

    def count(path: str, tag: str = "x") -> str:
        with open(path, "a") as out:
            out.write(tag + "\n")
        return tag

    return q.task(name=name, signed=True)(count)


def runs(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def execute(target: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run `statement` on the queue's database behind nbqueue's back ({t}: the jobs table)."""
    if "://" in target:
        import psycopg

        server, schema = target.split("?schema=")
        with psycopg.connect(server, autocommit=True) as conn:
            cur = conn.execute(statement.format(t=f'"{schema}".nbqueue_jobs'), params)
            return cur.fetchall() if cur.description else []
    import sqlite3

    with sqlite3.connect(target) as conn:
        return conn.execute(statement.format(t="nbqueue_jobs").replace("%s", "?"), params).fetchall()


def job_columns(target: str) -> list[str]:
    """The jobs table's columns but id: what a copy of a row carries."""
    if "://" in target:
        schema = target.split("?schema=")[1]
        rows = execute(
            target,
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'nbqueue_jobs' ORDER BY ordinal_position",
            (schema,),
        )
    else:
        rows = [(r[1],) for r in execute(target, "SELECT * FROM pragma_table_info('nbqueue_jobs')")]
    return [str(r[0]) for r in rows if r[0] != "id"]


def copy_row(source: str, job_id: int, times: int = 1, into: str | None = None) -> list[int]:
    """Insert copies of a job's row, as anyone with write access could (into another queue too)."""
    names = job_columns(source)
    [values] = execute(source, f"SELECT {', '.join(names)} FROM {{t}} WHERE id = %s", (job_id,))
    marks = ", ".join(["%s"] * len(names))
    made = []
    for _ in range(times):
        execute(into or source, f"INSERT INTO {{t}} ({', '.join(names)}) VALUES ({marks})", values)
        made.append(int(execute(into or source, "SELECT max(id) FROM {t}")[0][0]))
    return made


def test_a_signed_row_copied_three_times_runs_once(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """The review's signed "transfer" ran 6 times for 1 enqueue; now the copies are refused."""
    q = make_queue()
    task = counting_task(q)
    log = tmp_path / RAN
    job = task.enqueue(str(log))
    copies = copy_row(queue_target, job.id, times=3)
    q.worker(lease=5).run_until_idle(timeout=20)
    assert runs(log) == ["x"]  # one run for one enqueue
    states = {j.id: j for j in q.get_many([job.id, *copies])}
    ran = [i for i, j in states.items() if j.status == "completed"]
    assert len(ran) == 1
    for refused in (j for i, j in states.items() if i not in ran):
        assert refused.status == "pending" and refused.signature is None
        assert "this row is a copy" in (refused.error or "")


def test_a_finished_signed_row_set_back_to_pending_never_runs_again(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """Completed, dead or cancelled: its signed run ended; only nbqueue's own verbs start it afresh."""
    q = make_queue()
    task = counting_task(q)
    log = tmp_path / RAN
    done = task.enqueue(str(log), "done")
    dead = task.schedule((str(tmp_path / "nowhere" / "x"), "dead"), max_retries=0)  # no such folder: dead
    cancelled = task.enqueue(str(log), "cancelled")
    q.cancel(cancelled)
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(done.id).status == "completed" and q.get(dead.id).status == "dead"
    for job in (done, dead, cancelled):
        execute(
            queue_target, "UPDATE {t} SET status = 'pending', finished_at = NULL WHERE id = %s", (job.id,)
        )
    q.worker(lease=5).run_until_idle(timeout=20)
    assert runs(log) == ["done"]
    for job in (done, dead, cancelled):
        back = q.get(job.id)
        assert back.status == "pending" and back.signature is None
        assert "run already ended" in (back.error or "")


def test_requeue_and_replay_of_a_signed_job_give_it_a_fresh_signed_run(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """nbqueue's own fresh starts still run (each with a new nonce), by id or every dead job."""
    q = make_queue()
    task = counting_task(q)
    log = tmp_path / RAN
    folder = tmp_path / "later"
    first = task.schedule((str(folder / "a"), "a"), max_retries=0)
    second = task.schedule((str(folder / "b"), "b"), max_retries=0)
    done = task.enqueue(str(log), "again")
    q.worker(lease=5).run_until_idle(timeout=20)
    assert [q.get(j.id).status for j in (first, second)] == ["dead", "dead"]
    folder.mkdir()
    before = q.get(first.id).signature
    assert q.requeue(first) == 1 and q.requeue() == 1  # by id, then every dead job
    assert q.get(first.id).signature != before
    q.replay(done)
    q.worker(lease=5).run_until_idle(timeout=20)
    assert [q.get(j.id).status for j in (first, second, done)] == ["completed"] * 3, [
        q.get(j.id).error for j in (first, second)
    ]
    assert runs(folder / "a") == ["a"] and runs(folder / "b") == ["b"] and runs(log) == ["again", "again"]


def test_requeue_never_signs_again_a_row_changed_while_it_was_dead(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """A fresh signature goes only to a row whose signature verifies: an altered one stays refused."""
    q = make_queue()
    task = counting_task(q)
    folder = tmp_path / "later"
    job = task.schedule((str(folder / "mine"), "x"), max_retries=0)
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(job.id).status == "dead"
    folder.mkdir()
    theirs = folder / "theirs"
    set_columns(queue_target, job.id, payload=json.dumps({"args": [str(theirs), "x"], "kwargs": {}}))
    assert q.requeue(job) == 1
    q.worker(lease=5).run_until_idle(timeout=20)
    refused = q.get(job.id)
    assert refused.status == "pending" and "not signed by this notebook's user" in (refused.error or "")
    assert not theirs.exists()


def test_a_signed_row_copied_into_another_queue_database_never_runs(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Another SQLite file, or another PostgreSQL schema: the signature names the database it was made for."""
    q = make_queue()
    task = counting_task(q)
    log = tmp_path / RAN
    job = task.enqueue(str(log))
    other_target = f"{queue_target}_b" if "://" in queue_target else str(tmp_path / "other.db")
    if "://" in queue_target:  # a second schema in the same database, dropped afterwards
        schema = other_target.split("?schema=")[1]
        request.addfinalizer(lambda: execute(other_target, f'DROP SCHEMA "{schema}" CASCADE'))
    other = Queue(other_target)
    request.addfinalizer(other.close)
    counting_task(other)
    if "://" in queue_target:  # even with the first schema's identity copied over: the name differs
        first = queue_target.split("?schema=")[1]
        execute(
            other_target,
            f'UPDATE "{schema}".nbqueue_info SET value = (SELECT value FROM "{first}".nbqueue_info)',
        )
    [copy] = copy_row(queue_target, job.id, into=other_target)
    other.worker(lease=5).run_until_idle(timeout=20)
    assert runs(log) == []
    refused = other.get(copy)
    assert refused.status == "pending" and "not signed by this notebook's user" in (refused.error or "")
    q.worker(lease=5).run_until_idle(timeout=20)
    assert runs(log) == ["x"]  # the original still runs where it was queued


@pytest.mark.parametrize(
    ("column", "value"), [("max_retries", 50), ("timeout", 9999.0), ("queue", "elsewhere"), ("limits", None)]
)
def test_a_signed_rows_queue_and_options_cannot_be_changed(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path, column: str, value: Any
) -> None:
    q = make_queue()
    task = counting_task(q)
    log = tmp_path / RAN
    job = task.schedule((str(log),), timeout=30, limits={"k": 1})
    execute(queue_target, f"UPDATE {{t}} SET {column} = %s WHERE id = %s", (value, job.id))
    if column == "limits":
        execute(queue_target, "UPDATE {t} SET gate = '' WHERE id = %s", (job.id,))
    q.worker(lease=5, queues=["default", "elsewhere"]).run_until_idle(timeout=20)
    refused = q.get(job.id)
    assert runs(log) == []
    assert refused.status == "pending" and "not signed by this notebook's user" in (refused.error or "")


def test_a_signature_of_the_first_form_is_refused_until_trusted(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """Rows signed before signatures bound a job to its database and run: refused with the reason."""
    q = make_queue()
    task = counting_task(q)
    log = tmp_path / RAN
    job = task.enqueue(str(log))
    [(payload,)] = execute(queue_target, "SELECT payload FROM {t} WHERE id = %s", (job.id,))
    execute(
        queue_target,
        "UPDATE {t} SET signature = %s WHERE id = %s",
        (signing.sign("sig.count", payload), job.id),
    )
    q.worker(lease=5).run_until_idle(timeout=20)
    refused = q.get(job.id)
    assert refused.status == "pending" and "signed by an older nbqueue" in (refused.error or "")
    assert q.trust(refused) == 1
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(job.id).status == "completed" and runs(log) == ["x"]


def test_trust_signs_the_job_it_was_handed_never_a_row_changed_since(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    q = make_queue()
    notebook_task(q, "sig.write")
    meant, swapped = tmp_path / "meant", tmp_path / "swapped"
    job_id = write_from_another_process(queue_target, "sig.write", meant, signed=False, secret=None)
    read = q.get(job_id)  # what the person reads and trusts
    set_columns(queue_target, job_id, payload=json.dumps({"args": [str(swapped)], "kwargs": {}}))
    with pytest.raises(
        nbqueue.InvalidTransition, match=f"job {job_id} changed since it was read \\(payload\\)"
    ):
        q.trust(read)
    assert q.get(job_id).signature is None  # nothing was signed
    execute(queue_target, "UPDATE {t} SET max_retries = 7 WHERE id = %s", (job_id,))
    with pytest.raises(nbqueue.InvalidTransition, match="payload, max_retries"):
        q.trust([read])
    assert q.trust(q.get(job_id)) == 1  # read again: what is trusted is what was read
    q.worker(lease=5).run_until_idle(timeout=20)
    assert swapped.read_text() == "ran" and not meant.exists()


def test_approve_still_signs_but_warns_that_it_is_now_trust(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """q.approve was renamed q.trust ('approve' now answers a waiting job: q.send); old code works."""
    q = make_queue()
    notebook_task(q, "sig.write")
    job_id = write_from_another_process(queue_target, "sig.write", tmp_path / "b", signed=False, secret=None)
    assert q.get(job_id).signature is None
    with pytest.warns(DeprecationWarning, match=r"q\.approve\(jobs\) is now q\.trust\(jobs\)") as caught:
        assert q.approve(q.get(job_id)) == 1
    assert [w.filename for w in caught] == [__file__]  # it points at the caller's line
    assert q.get(job_id).signature is not None
    q.worker(lease=5).run_until_idle(timeout=20)
    assert q.get(job_id).status == "completed" and (tmp_path / "b").read_text() == "ran"


def test_an_edited_parent_result_never_reaches_a_signed_child(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """result_of in a signed job takes only results its user's signed runs recorded (a MAC each)."""
    q = make_queue()
    parent_task = q.task(name="sig.parent", signed=True)(lambda value: value)
    plain_task = q.task(name="sig.plain")(lambda value: value)
    child_task = counting_task(q, "sig.child")
    log = tmp_path / RAN
    honest = parent_task.enqueue(str(log))
    edited = parent_task.enqueue(str(log))
    plain = plain_task.enqueue(str(log))
    children = [
        child_task.enqueue(nbqueue.result_of(p), tag)
        for p, tag in ((honest, "a"), (edited, "b"), (plain, "c"))
    ]
    q.worker(lease=5, tasks=["sig.parent", "sig.plain"]).run_until_idle(timeout=20)
    assert [q.get(p.id).status for p in (honest, edited, plain)] == ["completed"] * 3
    planted = tmp_path / "planted"
    execute(queue_target, "UPDATE {t} SET result = %s WHERE id = %s", (json.dumps(str(planted)), edited.id))
    q.worker(lease=5).run_until_idle(timeout=20)
    assert runs(log) == ["a"] and not planted.exists()  # the honest child ran, with its parent's value
    assert q.get(children[0].id).status == "completed"
    for child, why in ((children[1], "did not record"), (children[2], "is not a signed job")):
        refused = q.get(child.id)
        assert refused.status == "pending" and why in (refused.error or ""), refused.error
        assert f"the result of job {child.id - 3}" in (refused.error or "")


def test_plain_children_still_take_any_parents_result(queue: Queue, tmp_path: Path) -> None:
    """Unsigned jobs pay nothing and keep working as before (tutorials 04 and 07)."""
    double = queue.task(name="sig.double")(lambda x: 2 * x)
    first = double.enqueue(21)
    then = double.enqueue(nbqueue.result_of(first))
    queue.worker(lease=5).run_until_idle(timeout=20)
    assert then.result(timeout=5) == 84


def test_reload_signs_only_a_notebook_row_whose_signature_verifies(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    """requeue(reload=True) of a row whose source another process rewrote: refused, nothing written."""
    import nbformat

    q = make_queue()
    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell("x = 1"))
    mine, theirs = tmp_path / "mine.ipynb", tmp_path / "theirs.ipynb"
    nbformat.write(notebook, mine)
    nbformat.write(notebook, theirs)
    kept, rewritten = q.enqueue_notebook(mine), q.enqueue_notebook(mine)
    q.cancel(kept)
    q.cancel(rewritten)
    [(payload,)] = execute(queue_target, "SELECT payload FROM {t} WHERE id = %s", (rewritten.id,))
    body = json.loads(payload)
    body["kwargs"]["source"] = str(theirs)
    set_columns(queue_target, rewritten.id, payload=json.dumps(body))
    with pytest.raises(nbqueue.InvalidTransition, match=f"job {rewritten.id} does not carry your signature"):
        q.requeue([kept, rewritten], reload=True)
    assert [q.get(j.id).status for j in (kept, rewritten)] == ["cancelled", "cancelled"]  # nothing moved
    assert q.get(rewritten.id).payload == body
    assert q.requeue(kept, reload=True) == 1
    row = q.manager.storage.get(kept.id)
    assert row is not None and signing.verify_job(q.manager.trust.identity, covered(row), row[25])


@pytest.mark.parametrize("kind", ["folder", "not utf-8", "symlink"])
def test_a_broken_secret_file_is_a_signing_error_at_enqueue(
    queue: Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    path = tmp_path / "config" / kind.replace(" ", "-")
    path.parent.mkdir(mode=0o700)
    if kind == "folder":
        path.mkdir(mode=0o700)
    elif kind == "not utf-8":
        path.write_bytes(b"\xff\xfe" * 40)
        path.chmod(0o600)
    else:
        other = tmp_path / "config" / "another-private-file"
        other.write_text("y" * 64)
        other.chmod(0o600)
        path.symlink_to(other)
    monkeypatch.setenv("NBQUEUE_SECRET_FILE", str(path))
    task = counting_task(queue)
    with pytest.raises(signing.SigningError, match=str(path)):
        task.enqueue(str(tmp_path / RAN))
    assert queue.counts()["pending"] == 0  # nothing written


def test_the_sql_nonce_is_the_signatures_nonce() -> None:
    """The triggers cut the nonce out of the signature text: the same place as nonce_of."""
    from nbqueue.storage.rules import signed_run

    signature = signing.sign_job("db", signing.Covered("t", "{}", "q", 3, None, "{}", None))
    condition, nonce = signed_run("new")
    assert condition == f"substr(new.signature, 1, 2) = '{signature[:2]}'"
    assert nonce == f"substr(new.signature, 3, {signing.NONCE_CHARS})"
    assert signature[2 : 2 + signing.NONCE_CHARS] == signing.nonce_of(signature)
