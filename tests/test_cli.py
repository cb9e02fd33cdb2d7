"""The nbqueue command, run as a real subprocess against a real queue file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import nbqueue
from nbqueue import Progress, Queue
from tests.helpers import wait_until


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nbqueue", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


def test_stats_counts_every_state(db: str) -> None:
    q = nbqueue.Queue(db)
    q.enqueue({"n": 1})
    q.enqueue({"n": 2})
    done = run("stats", db, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {s.value: 0 for s in nbqueue.State} | {"pending": 2}
    table = run("stats", db).stdout
    rows = dict(line.split() for line in table.splitlines())
    assert rows == {s.value: "0" for s in nbqueue.State} | {"pending": "2", "total": "2"}


def test_jobs_lists_dead_ones_with_their_error(db: str) -> None:
    q = nbqueue.Queue(db)
    q.enqueue({"n": 1}, max_retries=0)
    q.enqueue({"n": 2})
    job = q.claim()
    assert job is not None
    q.fail(job, "the API said no")
    listed = json.loads(run("jobs", db, "--status", "dead", "--json").stdout)
    assert [(j["id"], j["status"], j["error"]) for j in listed] == [(job.id, "dead", "the API said no")]
    text = run("jobs", db).stdout
    assert "the API said no" in text and "pending" in text


def test_requeue_ids_and_all_dead(db: str) -> None:
    q = nbqueue.Queue(db)
    ids = q.enqueue_many([{"n": i} for i in range(3)], max_retries=0)
    for _ in ids:
        claimed = q.claim()
        assert claimed is not None
        q.fail(claimed, "boom")
    assert run("requeue", db, str(ids[0])).stdout.strip() == "requeued 1 job(s)"
    assert q.get(ids[0]).status == "pending"
    assert run("requeue", db, "--all-dead").stdout.strip() == "requeued 2 job(s)"
    assert q.counts()["pending"] == 3


def test_cancel_and_purge(db: str) -> None:
    q = nbqueue.Queue(db)
    a, b = q.enqueue({"n": 1}), q.enqueue({"n": 2})
    assert run("cancel", db, str(a.id)).returncode == 0
    assert q.get(a.id).status == "cancelled"
    done = run("purge", db, "--status", "cancelled", "--older-than", "7d")
    assert done.stdout.strip() == "purged 0 job(s)"  # too young
    assert run("purge", db, "--status", "cancelled").stdout.strip() == "purged 1 job(s)"
    assert q.get(b.id).status == "pending"
    with pytest.raises(nbqueue.JobNotFound):
        q.get(a.id)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["bogus", "x.db"],
        ["stats"],
        ["requeue", "DB"],
        ["requeue", "DB", "1", "--all-dead"],
        ["requeue", "DB", "one"],
        ["purge", "DB", "--older-than", "soon"],
        ["purge", "DB", "--status", "running"],
        ["jobs", "DB", "--status", "weird"],
        ["worker", "DB", "--concurrency", "0"],
    ],
)
def test_bad_arguments_exit_2_with_usage(args: list[str], db: str) -> None:
    done = run(*[db if a == "DB" else a for a in args])
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_queue_errors_exit_1_with_one_line(db: str, tmp_path: Path) -> None:
    nbqueue.Queue(db)
    done = run("cancel", db, "999")
    assert done.returncode == 1
    assert done.stderr.strip() == f"nbqueue: error: {db}: no job with id 999"
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite at all" * 100)
    done = run("stats", str(garbage))
    assert done.returncode == 1 and "not" in done.stderr and "Traceback" not in done.stderr


def test_worker_runs_imported_tasks_and_stops_gracefully_on_sigterm(db: str, tmp_path: Path) -> None:
    (tmp_path / "mytasks.py").write_text(
        textwrap.dedent(
            """
            import time
            import nbqueue

            q = nbqueue.Queue(DB)

            @q.task(name="double")
            def double(x):
                return 2 * x

            @q.task(name="slow")
            def slow():
                time.sleep(1.0)
                return "finished"
            """
        ).replace("DB", repr(db))
    )
    q = nbqueue.Queue(db)
    doubles = [q.enqueue({"args": [i], "kwargs": {}}) for i in range(3)]  # raw: not for the worker
    q.cancel(doubles[0].id)

    sys.path.insert(0, str(tmp_path))
    try:
        import mytasks  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    jobs = [mytasks.double.enqueue(i) for i in range(5)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "nbqueue", "worker", db, "--import", "mytasks", "--concurrency", "2"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert [j.result(timeout=30) for j in jobs] == [0, 2, 4, 6, 8]
        slow = mytasks.slow.enqueue()
        deadline = time.monotonic() + 30
        while q.get(slow.id).status != "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        worker.send_signal(signal.SIGTERM)  # the running job finishes before the worker exits
        _, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, err
    assert q.get(slow.id).status == "completed"
    assert q.get(slow.id).value == "finished"
    assert q.counts()["pending"] == 2  # the raw payload jobs were never taken by the worker
    assert "stopped: 6 completed" in err


def test_python_dash_m_and_console_script_agree(db: str) -> None:
    nbqueue.Queue(db)
    script = Path(sys.executable).parent / "nbqueue"
    if not script.exists():
        pytest.fail(f"the console script is not installed next to {sys.executable}")
    a = subprocess.run([str(script), "stats", db, "--json"], capture_output=True, text=True, check=True)
    assert a.stdout == run("stats", db, "--json").stdout
    assert os.access(script, os.X_OK)


# -- command line -----------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_worker_in_process_mode_with_retention(tmp_path: Path) -> None:
    db = str(tmp_path / "jobs.db")
    (tmp_path / "lr_cli_tasks.py").write_text(
        textwrap.dedent(
            f"""
            import os

            import nbqueue

            q = nbqueue.Queue({db!r})


            @q.task(name="lr.cli.whoami", timeout=20)
            def whoami(tag):
                print(f"child says {{tag}}")
                nbqueue.progress(1, 1, "done")
                return {{"pid": os.getpid(), "tag": tag}}
            """
        )
    )
    q = Queue(db)
    stub = q.task(name="lr.cli.whoami")(lambda tag: None)  # the worker process has the real one
    job = stub.enqueue("x")
    command = [sys.executable, "-m", "nbqueue", "worker", db, "--import", "lr_cli_tasks"]
    options = ["--mode", "process", "--retention", "1s", "--lease", "5"]
    log = tmp_path / "worker.log"
    with open(log, "w") as stderr:  # a file, not a pipe: a job's child process may outlive the worker
        worker = subprocess.Popen(
            [*command, *options], cwd=tmp_path, stdout=stderr, stderr=stderr, start_new_session=True
        )
    try:
        result = job.result(timeout=30)
        assert result["tag"] == "x"
        assert result["pid"] not in (worker.pid, os.getpid())  # a child of the worker process
        done = q.get(job.id)
        assert "child says x" in (done.output or "")
        assert done.progress == Progress(1, 1, "done")

        def pruned() -> bool:
            try:
                q.get(job.id)
            except nbqueue.JobNotFound:
                return True
            return False

        wait_until(pruned, 15, "the completed job pruned by --retention 1s")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)  # the worker and any child of a job it ran
        worker.wait(timeout=30)
        q.close()
    assert "nbqueue worker stopped: 1 completed, 0 failed" in log.read_text()


@pytest.mark.parametrize("bad", [["--mode", "fork"], ["--retention", "7x"], ["--retention", "soon"]])
def test_cli_refuses_bad_long_running_options(tmp_path: Path, bad: list[str]) -> None:
    from nbqueue import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["worker", str(tmp_path / "jobs.db"), *bad])
    assert exit_info.value.code == 2


def test_cli_parses_retention_durations() -> None:
    from nbqueue import cli

    args = cli.parser().parse_args(["worker", "x.db", "--mode", "process", "--retention", "7d"])
    assert (args.mode, args.retention) == ("process", 7 * 86400)
    assert cli.duration("1d12h") == 36 * 3600
