"""Security: payloads are data (never unpickled), SQL is parameterised, queued code runs only
where it was explicitly allowed, and the database is readable by its owner only."""

from __future__ import annotations

import ast
import os
import re
import select
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue
from nbqueue.cells import CELL_TASK
from tests.helpers import run_cli

PACKAGE = Path(nbqueue.__file__).parent

# A classic pickle that runs a shell command when loaded: it must only ever be text.
EVIL_PICKLE = "cposix\nsystem\n(S'touch {sentinel}'\ntR."


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


# -- payloads are data -------------------------------------------------------------------------


def test_the_package_never_imports_a_deserialiser_that_runs_code() -> None:
    banned = {
        "pickle",
        "cPickle",
        "_pickle",
        "marshal",
        "shelve",
        "dill",
        "cloudpickle",
        "jsonpickle",
        "yaml",
    }
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
                names = [
                    a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
            found += [
                f"{path.relative_to(PACKAGE)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in banned and (path.name, n) not in SHIPS_HANDLERS
            ]
    assert not found, found
    assert len(sources()) > 10  # the scan really read the package


# Process mode sends the handler to its child with cloudpickle: the parent pickles (it trusts
# itself) and only the child unpickles what its parent sent. Nothing else may.
SHIPS_HANDLERS = {("isolation.py", "cloudpickle")}


def test_only_a_process_mode_child_unpickles_and_only_what_its_parent_sent() -> None:
    """No `loads`/`load`/`Unpickler` outside the child's entry point, and no `Connection.recv()`
    (which unpickles) anywhere: the worker reads its children's answers with `recv_bytes` as JSON."""
    unpicklers = {"loads", "load", "Unpickler", "recv"}
    found = []

    def visit(node: ast.AST, where: str, path: Path) -> None:
        call = node.func if isinstance(node, ast.Call) else None
        if isinstance(call, ast.Attribute) and call.attr in unpicklers:
            owner = ast.unparse(call.value)
            if call.attr == "recv" or owner in {"pickle", "cloudpickle", "_pickle", "marshal"}:
                found.append((path.name, where, f"{owner}.{call.attr}"))
        inner = node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else where
        for child in ast.iter_child_nodes(node):
            visit(child, inner, path)

    for path in sources():
        visit(ast.parse(path.read_text(), str(path)), "<module>", path)
    assert set(found) == {("isolation.py", "_child", "cloudpickle.loads")}, found


def test_eval_and_exec_appear_only_where_notebook_code_is_run_on_purpose() -> None:
    """exec/eval live in cells.py (the opt-in code task) and the magics (the user's own line)."""
    allowed = {Path("cells.py"), Path("jupyter/magics.py")}
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"eval", "exec"}:
                found.append(path.relative_to(PACKAGE))
    assert found, "the scan should see cells.py's exec"
    assert set(found) <= allowed, sorted(map(str, set(found) - allowed))


def test_a_pickle_looking_payload_stays_a_string(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    evil = EVIL_PICKLE.format(sentinel=sentinel)
    with Queue(tmp_path / "jobs.db") as q:

        @q.task(name="security.echo")
        def echo(value: Any) -> Any:
            return value

        raw = q.enqueue(evil)
        nested = q.enqueue({"pickle": evil, "bytes": evil.encode("latin-1").hex()})
        task_job = echo.enqueue(evil)
        q.worker(lease=5).run_until_idle(timeout=20)  # the worker takes only the task job
        assert q.get(raw.id).payload == evil
        assert q.get(nested.id).payload["pickle"] == evil
        assert q.get(task_job.id).value == evil
        assert q.get(task_job.id).args == [evil]
        assert all(j.payload for j in q.jobs())
    assert not sentinel.exists()


def test_a_pickle_written_into_the_file_by_hand_is_never_loaded(tmp_path: Path) -> None:
    """Another tool (or an attacker with write access) puts a real pickle in the payload column:
    reading the job must refuse it as not-JSON and run nothing."""
    sentinel = tmp_path / "pwned"
    path = tmp_path / "jobs.db"
    with Queue(path) as q:
        job = q.enqueue({"n": 1})
    conn = sqlite3.connect(path)
    for value in (EVIL_PICKLE.format(sentinel=sentinel), EVIL_PICKLE.format(sentinel=sentinel).encode()):
        conn.execute("UPDATE nbqueue_jobs SET payload = ? WHERE id = ?", (value, job.id))
        conn.commit()
        with Queue(path) as q:
            try:
                q.get(job.id)
            except Exception as exc:  # judged below, after the sentinel check
                error: Exception | None = exc
            else:
                error = None
        assert not sentinel.exists(), "the payload was unpickled"
        assert error is not None, "a payload that is not JSON was read back as something"
        assert isinstance(error, nbqueue.StorageError), f"{type(error).__module__}.{type(error).__name__}"
    conn.close()


# -- SQL is parameterised ----------------------------------------------------------------------

INJECTIONS = [
    "x' OR '1'='1",
    'x" OR "1"="1',
    "'); DELETE FROM nbqueue_jobs; --",
    "x') OR 1=1 --",
    "'; DROP TABLE nbqueue_jobs; --",
]


@pytest.mark.parametrize("evil", INJECTIONS, ids=[f"inj{i}" for i in range(len(INJECTIONS))])
def test_injection_strings_are_values_not_sql(tmp_path: Path, evil: str) -> None:
    """Each filter below would match *every* job if the value were pasted into the SQL."""
    with Queue(tmp_path / "jobs.db") as q:
        others = q.enqueue_many([{"n": i} for i in range(3)], queue="plain")
        q.enqueue({"n": "keyed"}, key="some-key")
        assert q.counts(evil) == {s.value: 0 for s in nbqueue.State}
        assert q.jobs(queue=evil) == []
        assert q.claim(queues=[evil]) is None
        assert q.claim(tasks=[evil]) is None
        fresh = q.enqueue({"n": "evil"}, key=evil, queue=evil)
        assert fresh.id not in others  # the key matched no other job
        assert q.enqueue({"n": "again"}, key=evil).id == fresh.id
        assert q.counts() == {**{s.value: 0 for s in nbqueue.State}, "pending": 5}
        assert q.queues() == sorted(["plain", "default", evil])
        claim = q.claim(queues=[evil], worker_id=evil)
        assert claim is not None and claim.id == fresh.id
        q.fail(claim, evil, output=evil)
        assert (q.get(fresh.id).error, q.get(fresh.id).output) == (evil, evil)
        assert [j.id for j in q.jobs(queue="plain")] == sorted(others, reverse=True)


SQL_WORDS = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE|PRAGMA|WHERE|AND|CREATE|FROM|ORDER BY|LIMIT)\b")


def sql_interpolations(tree: ast.AST) -> dict[str, int]:
    """Every expression interpolated into an f-string that looks like SQL: {expression: line}."""
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(p.value for p in node.values if isinstance(p, ast.Constant))
            if SQL_WORDS.search(text):
                for part in node.values:
                    value = part.value if isinstance(part, ast.FormattedValue) else None
                    if value is None or (isinstance(value, ast.Call) and ast.unparse(value.func) == "int"):
                        continue  # an int() cannot carry SQL
                    found.setdefault(ast.unparse(value), node.lineno)
    return found


def test_backends_never_edit_statement_text() -> None:
    """A review gate, not a proof: statements are fixed text made once when the query modules
    load (from constants and `storage.rules`); the backends only run them, values travel as
    bound parameters. What the backends still paste into SQL is a short reviewed list."""
    reviewed = {
        "BUSY_TIMEOUT_MS",  # a constant
        "self.synchronous.upper()",  # checked to be "normal" or "full" in __init__
        "sql.APPLICATION_ID",  # a constant
        "PAGE_SIZE",  # a constant
    }
    for backend in ("sqlite.py", "postgres.py", "sql.py"):
        source = (PACKAGE / "storage" / backend).read_text()
        found = sql_interpolations(ast.parse(source))
        unknown = {name: line for name, line in found.items() if name not in reviewed}
        assert not unknown, f"values pasted into SQL in storage/{backend} (name: line): {unknown}"
        edits = {
            ast.unparse(node.func.value)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "replace"
        }
        assert edits <= {"os", "text", "parts"}, f"storage/{backend} edits text with .replace: {edits}"
    # The query modules build their text only from constants, at import.
    for module in ("sqlite_queries.py", "postgres_queries.py", "statements.py", "rules.py"):
        tree = ast.parse((PACKAGE / "storage" / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in ("replace", "execute"), f"{module}:{node.lineno}"


# -- queued code runs only where allowed ---------------------------------------------------------


def code_job(q: Queue, sentinel: Path) -> nbqueue.Job:
    """The job %%enqueue writes: task nbqueue.cell, the cell's source as its argument."""
    task = q.cell_task()
    return task.schedule(
        (f"import pathlib\npathlib.Path({str(sentinel)!r}).write_text('ran')\n6 * 7", "cell")
    )


def test_code_jobs_are_skipped_by_a_plain_worker_and_run_with_the_opt_in(tmp_path: Path) -> None:
    sentinel = tmp_path / "ran"
    with Queue(tmp_path / "jobs.db") as q:

        @q.task(name="security.plain")
        def plain() -> str:
            return "plain"

        job = code_job(q, sentinel)
        assert job.task == CELL_TASK
        other = plain.enqueue()
        q.worker(lease=5).run_until_idle(timeout=20)
        assert q.get(other.id).value == "plain"  # the worker did work ...
        assert q.get(job.id).status == "pending"  # ... but not the code job
        assert not sentinel.exists()
        q.worker(lease=5, tasks=["security.plain"]).run_until_idle(timeout=20)
        assert q.get(job.id).status == "pending"
        q.worker(lease=5, allow=[CELL_TASK]).run_until_idle(timeout=20)
        assert q.get(job.id).value == 42
        assert sentinel.read_text() == "ran"


@pytest.fixture
def cli_worker(tmp_path: Path) -> Iterator[Any]:
    """Start `python -m nbqueue worker ...`; every process is stopped (SIGTERM, then SIGKILL)."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nbqueue", "worker", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            cwd=tmp_path,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


def wait_for_banner(proc: subprocess.Popen[str]) -> str:
    """The worker prints one line on stderr once it works the queue."""
    assert proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], 30)
    assert ready, "the worker printed nothing within 30 s"
    line = proc.stderr.readline()
    assert "nbqueue worker" in line, line
    return line


@pytest.mark.slow
def test_cli_worker_without_allow_code_leaves_code_jobs_alone(tmp_path: Path, cli_worker: Any) -> None:
    sentinel = tmp_path / "ran"
    db = tmp_path / "jobs.db"
    with Queue(db) as q:
        job = code_job(q, sentinel)
        proc = cli_worker(str(db))
        wait_for_banner(proc)
        time.sleep(2.0)  # ample time to claim a due job
        assert proc.poll() is None
        assert q.get(job.id).status == "pending"
        assert q.get(job.id).attempts == 0
    assert not sentinel.exists()


@pytest.mark.slow
def test_cli_worker_with_allow_code_runs_code_jobs(tmp_path: Path, cli_worker: Any) -> None:
    sentinel = tmp_path / "ran"
    db = tmp_path / "jobs.db"
    with Queue(db) as q:
        job = code_job(q, sentinel)
        proc = cli_worker(str(db), "--allow-code")
        wait_for_banner(proc)
        try:
            done = q.wait([job], timeout=15, progress=False)[0]
        except nbqueue.WaitTimeout:
            done = q.get(job.id)
        assert (done.status, done.value) == ("completed", 42), f"the code job is {done.status}"
    assert sentinel.read_text() == "ran"


# -- the file is the owner's -----------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_database_and_wal_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    old = os.umask(0)  # the most permissive umask: files would be 0o666 unless made otherwise
    try:
        q = Queue(path)
        try:
            q.enqueue({"secret": "token"})
            wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
            assert wal.exists() and shm.exists()
            assert (mode(path), mode(wal), mode(shm)) == (0o600, 0o600, 0o600)
        finally:
            q.close()
    finally:
        os.umask(old)


def test_a_database_created_by_the_cli_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "cli.db"
    notebook = tmp_path / "report.ipynb"  # queueing a notebook run creates the queue file
    notebook.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    done = run_cli("notebook", str(path), str(notebook))
    assert done.returncode == 0, done.stderr
    assert mode(path) == 0o600


def test_a_planted_world_writable_queue_file_is_made_owner_only_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "jobs.db"
    with Queue(path) as q:
        q.enqueue({"n": 1})
    planted = [path, Path(f"{path}-wal")]
    planted[1].touch()  # a -wal file planted beside it, as open to anyone
    for file in planted:
        file.chmod(0o666)
    with caplog.at_level("WARNING", logger="nbqueue.storage"), Queue(path) as q:
        assert q.counts()["pending"] == 1
        assert [mode(file) for file in planted] == [0o600, 0o600]
    said = [r.getMessage() for r in caplog.records if r.name == "nbqueue.storage"]
    assert said == [f"{file} was writable by anyone (mode 666): made owner-only (0600)" for file in planted]
    path.chmod(0o660)  # shared with the group on purpose: left as it is, nothing said
    caplog.clear()
    with caplog.at_level("WARNING", logger="nbqueue.storage"), Queue(path) as q:
        assert q.counts()["pending"] == 1
    assert mode(path) == 0o660 and not caplog.records


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a file of another user takes root")
def test_a_world_writable_queue_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    Queue(path).close()
    os.chown(path, 65534, 65534)  # nobody's: they may loosen it again at any time
    path.chmod(0o666)
    with pytest.raises(nbqueue.StorageError, match="writable by anyone and owned by another user"):
        Queue(path)
    assert mode(path) == 0o666


@pytest.mark.slow
def test_executed_notebooks_and_their_folder_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    from tests.test_notebook_jobs import write_notebook

    notebook = write_notebook(tmp_path / "report.ipynb", "secret = 'token'")
    fresh = tmp_path / "fresh"
    old = os.umask(0o022)  # the usual umask: files 0644, folders 0755 unless made otherwise
    try:
        with Queue(tmp_path / "queue.db") as q:
            new = q.enqueue_notebook(notebook, outputs=("ipynb", "html"), output_dir=fresh)
            again = q.enqueue_notebook(notebook)
            earlier = tmp_path / "nbqueue-notebooks" / f"report-{again.id}.ipynb"
            earlier.parent.mkdir()  # an earlier run's notebook, as open as the umask made it
            earlier.write_text("{}")
            with q.worker(allow_code=True):
                made, rewritten = new.result(timeout=120), again.result(timeout=120)
    finally:
        os.umask(old)
    assert Path(rewritten["notebook"]) == earlier and "token" in earlier.read_text()
    assert mode(fresh) == 0o700
    assert [mode(Path(p)) for p in (made["notebook"], made["html"], earlier)] == [0o600] * 3
