"""The nbqueue command against a real queue file: run by nbqueue.cli.main in this process
(tests.helpers.run_cli) where a process adds nothing; a real subprocess where the process is the
point (signals, a running worker's output, `python -m nbqueue` and the console script)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

import nbqueue
from nbqueue import Progress, Queue
from tests.helpers import MakeQueue, run_cli, wait_until


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


def test_stats_counts_every_state(db: str) -> None:
    q = nbqueue.Queue(db)
    q.enqueue({"n": 1})
    q.enqueue({"n": 2})
    done = run_cli("stats", db, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {s.value: 0 for s in nbqueue.State} | {"pending": 2}
    table, by_task = run_cli("stats", db).stdout.split("\n\n")
    rows = dict(line.split() for line in table.splitlines())
    assert rows == {s.value: "0" for s in nbqueue.State} | {"pending": "2", "total": "2"}
    assert by_task.strip() == "2 pending raw payload job(s) (taken by claim(), never by a worker)"


def test_jobs_lists_dead_ones_with_their_error(db: str) -> None:
    q = nbqueue.Queue(db)
    q.enqueue({"n": 1}, max_retries=0)
    q.enqueue({"n": 2})
    job = q.claim()
    assert job is not None
    q.fail(job, "the API said no")
    listed = json.loads(run_cli("jobs", db, "--status", "dead", "--json").stdout)
    assert [(j["id"], j["status"], j["error"]) for j in listed] == [(job.id, "dead", "the API said no")]
    text = run_cli("jobs", db).stdout
    assert "the API said no" in text and "pending" in text


def test_requeue_ids_and_all_dead(db: str) -> None:
    q = nbqueue.Queue(db)
    ids = q.enqueue_many([{"n": i} for i in range(3)], max_retries=0)
    for _ in ids:
        claimed = q.claim()
        assert claimed is not None
        q.fail(claimed, "boom")
    assert run_cli("requeue", db, str(ids[0])).stdout.strip() == "requeued 1 job(s)"
    assert q.get(ids[0]).status == "pending"
    assert run_cli("requeue", db, "--all-dead").stdout.strip() == "requeued 2 job(s)"
    assert q.counts()["pending"] == 3


def test_cancel_and_purge(db: str) -> None:
    q = nbqueue.Queue(db)
    a, b = q.enqueue({"n": 1}), q.enqueue({"n": 2})
    assert run_cli("cancel", db, str(a.id)).returncode == 0
    assert q.get(a.id).status == "cancelled"
    done = run_cli("purge", db, "--status", "cancelled", "--older-than", "7d")
    assert done.stdout.strip() == "purged 0 job(s)"  # too young
    assert run_cli("purge", db, "--status", "cancelled").stdout.strip() == "purged 1 job(s)"
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
        ["send", "DB", "1", "review"],
        ["send", "DB", "one", "review", "approve"],
        ["worker", "DB", "--concurrency", "0"],
    ],
)
def test_bad_arguments_exit_2_with_usage(args: list[str], db: str) -> None:
    done = run_cli(*[db if a == "DB" else a for a in args])
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_queue_errors_exit_1_with_one_line(db: str, tmp_path: Path) -> None:
    nbqueue.Queue(db)
    done = run_cli("cancel", db, "999")
    assert done.returncode == 1
    assert done.stderr.strip() == f"nbqueue: error: {db}: no job with id 999"
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite at all" * 100)
    done = run_cli("stats", str(garbage))
    assert done.returncode == 1 and "not" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow  # real seconds: a worker process is signalled
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
    b = subprocess.run(
        [sys.executable, "-m", "nbqueue", "stats", db, "--json"], capture_output=True, text=True, check=True
    )
    assert a.stdout == b.stdout
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


# -- what a person reads ----------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """main() in this process (fast): its exit status, stdout and stderr."""
    from nbqueue import cli as command_line

    status = command_line.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["stats", "--json"],
        ["jobs"],
        ["jobs", "--status", "dead"],
        ["show", "1"],
        ["graph", "1"],
        ["steps", "1"],
        ["waiting"],
        ["send", "1", "review", "approve"],
        ["schedules"],
        ["schedules", "--remove", "nightly"],
        ["requeue", "--all-dead"],
        ["cancel", "1"],
        ["purge"],
    ],
)
def test_commands_on_a_missing_file_say_so_and_create_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "typo.db"
    status, out, err = cli(capsys, command[0], str(path), *command[1:])
    assert status == 1
    assert err.strip() == f"nbqueue: error: no queue at {path}"
    assert out == ""
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []  # no -wal or -shm either


def test_a_missing_file_from_nbqueue_url_is_refused_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "nowhere.db"
    monkeypatch.setenv("NBQUEUE_URL", str(path))
    status, _, err = cli(capsys, "jobs")
    assert (status, err.strip()) == (1, f"nbqueue: error: no queue at {path}")
    assert not path.exists()


def test_stats_names_the_tasks_that_pending_jobs_wait_for(
    capsys: pytest.CaptureFixture[str], db: str
) -> None:
    with Queue(db) as q:
        download = q.task(name="__main__.download")(lambda url: url)
        resize = q.task(name="images.resize")(lambda path: path)
        for i in range(3):
            download.enqueue(f"u{i}")
        resize.enqueue("a.png")
        q.enqueue({"raw": 1})
        done = resize.enqueue("b.png")
        claimed = q.claim()
        assert claimed is not None and claimed.id != done.id
        q.complete(claimed, None)  # the first download: no longer pending
    status, out, _ = cli(capsys, "stats", db)
    assert status == 0
    assert out.split("\n\n")[1].splitlines() == [
        "2 pending job(s) of task download",  # shown without __main__.
        "2 pending job(s) of task images.resize",
        "1 pending raw payload job(s) (taken by claim(), never by a worker)",
    ]
    status, out, _ = cli(capsys, "stats", db, "--json")
    assert json.loads(out)["pending"] == 5  # the JSON keeps its shape: state -> count


def test_stats_of_an_empty_queue_lists_no_tasks(capsys: pytest.CaptureFixture[str], db: str) -> None:
    Queue(db).close()
    status, out, _ = cli(capsys, "stats", db)
    assert status == 0 and "\n\n" not in out and "total            0" in out


def test_stats_by_task_on_postgres(capsys: pytest.CaptureFixture[str], pg_url: str) -> None:
    with Queue(pg_url) as q:
        fetch = q.task(name="crawler.fetch")(lambda url: url)
        fetch.enqueue("a")
        fetch.enqueue("b")
    status, out, err = cli(capsys, "stats", pg_url)
    assert status == 0, err
    assert out.split("\n\n")[1].strip() == "2 pending job(s) of task crawler.fetch"
    status, out, _ = cli(capsys, "jobs", pg_url, "--status", "dead")
    assert (status, out.strip()) == (0, f"no dead jobs in {nbqueue.Queue(pg_url)}")


def test_jobs_lists_attempts_as_attempt_k_of_n(capsys: pytest.CaptureFixture[str], db: str) -> None:
    with Queue(db) as q:
        download = q.task(name="__main__.download", max_retries=3)(lambda url: url)
        waiting = download.enqueue("a")
        failing = download.enqueue("b")
        claimed = q.claim()
        assert claimed is not None and claimed.id == waiting.id
        q.complete(claimed, "ok")
        claimed = q.claim()
        assert claimed is not None and claimed.id == failing.id
        q.fail(claimed, "the API said no")
        fresh = q.enqueue({"n": 1}, max_retries=0)
    status, out, _ = cli(capsys, "jobs", db)
    assert status == 0
    header, *lines = out.splitlines()
    assert header.split()[:5] == ["id", "status", "queue", "task", "attempt"]
    assert "tries" not in out and "/3" not in out
    rows = {int(line.split()[0]): line for line in lines}
    assert "download" in rows[waiting.id] and "__main__" not in out
    assert "attempt 1 of 4 " in rows[waiting.id]  # completed at its first attempt
    assert "attempt 1 of 4 failed" in rows[failing.id] and rows[failing.id].endswith("the API said no")
    assert "next: attempt 1 of 1" in rows[fresh.id] and "(payload)" in rows[fresh.id]
    status, out, _ = cli(capsys, "jobs", db, "--json")
    listed = {j["id"]: j for j in json.loads(out)}
    assert listed[failing.id]["attempt"] == "attempt 1 of 4 failed"
    assert listed[failing.id]["task"] == "__main__.download"  # JSON keeps the stored name
    assert (listed[failing.id]["retries"], listed[failing.id]["max_retries"]) == (1, 3)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ([], "no jobs in DB"),
        (["--status", "dead"], "no dead jobs in DB"),
        (["--queue", "images"], "no jobs in queue 'images' in DB"),
        (["--status", "failed", "--queue", "images"], "no failed jobs in queue 'images' in DB"),
    ],
)
def test_empty_lists_say_so(
    capsys: pytest.CaptureFixture[str], db: str, options: list[str], said: str
) -> None:
    Queue(db).close()
    status, out, _ = cli(capsys, "jobs", db, *options)
    assert (status, out.strip()) == (0, said.replace("DB", db))
    status, out, _ = cli(capsys, "jobs", db, *options, "--json")
    assert json.loads(out) == []


def test_empty_schedules_and_steps_say_so(capsys: pytest.CaptureFixture[str], db: str) -> None:
    with Queue(db) as q:
        job = q.enqueue({"n": 1})
    assert cli(capsys, "schedules", db)[1].strip() == f"no schedules in {db}"
    assert cli(capsys, "steps", db, str(job.id))[1].strip() == f"job {job.id} has no recorded steps"
    status, _, err = cli(capsys, "steps", db, "999")
    assert status == 1 and "no job with id 999" in err


def test_cancelling_a_finished_job_says_which_jobs_can_be(
    capsys: pytest.CaptureFixture[str], db: str
) -> None:
    with Queue(db) as q:
        job = q.enqueue({"n": 1})
        claimed = q.claim()
        assert claimed is not None
        q.complete(claimed, None)
    status, _, err = cli(capsys, "cancel", db, str(job.id))
    assert status == 1
    assert err.strip() == (
        f"nbqueue: error: {db}: job {job.id} is completed: "
        "only pending, failed, blocked, running or waiting jobs can be cancelled"
    )


def test_worker_says_which_pending_jobs_it_has_no_task_for(db: str, tmp_path: Path) -> None:
    (tmp_path / "cli_other_tasks.py").write_text(
        "import nbqueue\n\nq = nbqueue.Queue(" + repr(db) + ")\n\n@q.task(name='other.thing')\n"
        "def thing():\n    return 1\n"
    )
    with Queue(db) as q:
        download = q.task(name="__main__.download")(lambda url: url)
        for i in range(12):
            download.enqueue(f"u{i}")
        q.task(name="pkg.resize")(lambda: None).enqueue()
        q.task(name="pkg.elsewhere", queue="slow")(lambda: None).enqueue()  # not a queue it serves
        q.enqueue({"raw": 1})  # raw payloads are never a worker's
    command = [sys.executable, "-m", "nbqueue", "worker", db, "--import", "cli_other_tasks"]
    worker = subprocess.Popen(
        [*command, "--queues", "default"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        assert worker.stderr is not None
        first = worker.stderr.readline()
        started = worker.stderr.readline()
        worker.send_signal(signal.SIGINT)
        rest, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert first.strip() == (
        "nbqueue worker: no task here for 13 pending job(s) of: download (12), pkg.resize (1); "
        "start the worker with --import MODULE"
    )
    assert "1 task(s)" in started
    assert worker.returncode == 0, rest
    with Queue(db) as q:
        assert q.counts()["pending"] == 15  # nothing taken, nothing dropped


def test_worker_with_every_task_says_nothing_about_missing_ones(db: str, tmp_path: Path) -> None:
    from nbqueue import cli as command_line

    with Queue(db) as q:
        q.task(name="cli.present")(lambda: None).enqueue()
        assert command_line._unserved(q, ["cli.present"], None) is None
        q.task(name="nbqueue.cell")(lambda code, name="cell": None).enqueue("1")  # code: --allow-code
        said = command_line._unserved(q, ["cli.present"], None)
    assert said is not None and "nbqueue.cell (1)" in said and "--allow-code" in said
    assert "--import" not in said


def test_show_prints_one_job_in_full(capsys: pytest.CaptureFixture[str], db: str) -> None:
    with Queue(db) as q:
        download = q.task(name="__main__.download", max_retries=2)(lambda url: url)
        job = download.schedule(("https://example.org",), key="dl-1", priority=3)
        claimed = q.claim()
        assert claimed is not None
        q.fail(claimed, "Traceback (most recent call last):\nTimeoutError: too slow")
    status, out, _ = cli(capsys, "show", db, str(job.id))
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == f"job {job.id}"
    fields = dict(line.strip().split(None, 1) for line in lines[1:4])
    assert fields == {"status": "failed", "task": "download", "attempt": "attempt 1 of 3 failed"}
    assert "dl-1" in out and '"https://example.org"' in out
    assert out.rstrip().endswith("TimeoutError: too slow")
    status, out, _ = cli(capsys, "show", db, str(job.id), "--json")
    shown = json.loads(out)
    assert (shown["task"], shown["attempt"], shown["retries"]) == (
        "__main__.download",
        "attempt 1 of 3 failed",
        1,
    )
    status, _, err = cli(capsys, "show", db, "999")
    assert status == 1 and err.strip() == f"nbqueue: error: {db}: no job with id 999"


# Clears the screen, sets the title, writes the clipboard (OSC 52), returns to the line's start
# to print a fake line, a C1 CSI and DEL: each must reach a terminal escaped, never raw.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\rjob 1 completed\x9b31m\x7f"
RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # every control but the newline


def test_human_output_escapes_control_characters_from_job_data(
    capsys: pytest.CaptureFixture[str], db: str, tmp_path: Path
) -> None:
    notebook = tmp_path / "report.ipynb"
    notebook.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    with Queue(db) as q:
        q.periodic_notebook(notebook, every=3600, name=f"nightly{HOSTILE}")
        task = q.task(name=f"evil{HOSTILE}")(lambda n: nbqueue.step(f"fetch{HOSTILE}", str, n))
        job = task.schedule((1,), queue=f"q{HOSTILE}", key=f"k{HOSTILE}")
        pending = task.schedule((2,), queue=f"q{HOSTILE}")
        with q.worker(queues=[f"q{HOSTILE}"]):
            job.result(timeout=10)
            pending.result(timeout=10)
        failed = task.schedule((3,), queue=f"q{HOSTILE}", max_retries=0)
        claimed = q.claim(queues=[f"q{HOSTILE}"], worker_id=f"w{HOSTILE}")
        assert claimed is not None and claimed.id == failed.id
        error = f"Traceback (most recent call last):\nRuntimeError: {HOSTILE}"
        q.fail(claimed, error, output=f"out{HOSTILE}\nline 2")
        task.schedule((4,), queue=f"q{HOSTILE}")  # pending: `stats` names its task
    commands = [
        ["stats"],
        ["jobs"],
        ["show", str(failed.id)],
        ["show", str(job.id)],
        ["graph", str(job.id)],
        ["steps", str(job.id)],
        ["schedules"],
    ]
    for command in commands:
        status, out, err = cli(capsys, command[0], db, *command[1:])
        assert status == 0, (command, err)
        assert not RAW.search(out + err), (command, out)
        assert "\\x1b[2J" in out, (command, out)
    status, out, _ = cli(capsys, "show", db, str(failed.id))
    assert "\\rjob 1 completed\\x9b31m\\x7f" in out and "  line 2" in out  # newlines kept in text
    status, out, _ = cli(capsys, "jobs", db, "--json")
    assert {j["task"] for j in json.loads(out)} == {f"evil{HOSTILE}"}  # --json is as it was


def test_the_workers_own_lines_escape_control_characters(db: str, tmp_path: Path) -> None:
    """What the worker says on stderr (tasks it has no code for, each job's failure with -v)."""
    (tmp_path / "hostile.py").write_text(
        "import nbqueue\n"
        f"q = nbqueue.Queue({db!r})\n"
        "@q.task(name='boom', max_retries=0)\n"
        "def boom():\n"
        f"    raise RuntimeError({HOSTILE!r})\n"
    )
    with Queue(db) as q:
        q.task(name=f"absent{HOSTILE}")(lambda: None).enqueue()  # no code for it in the worker
        job = q.task(name="boom", max_retries=0)(lambda: None).enqueue()
    worker = subprocess.Popen(
        [sys.executable, "-m", "nbqueue", "worker", db, "--import", "hostile", "-v"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Queue(db) as q:
            wait_until(lambda: q.get(job.id).status == "dead", 30, "the job died")
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert "no task here for 1 pending job(s) of: absent\\x1b[2J" in err
    failure = [line for line in err.splitlines() if f"job {job.id} failed (dead): " in line]
    assert len(failure) == 1 and failure[0].endswith("completed\\x9b31m\\x7f")
    assert not RAW.search(err), err


# -- jobs that wait: `waiting` and `send` ------------------------------------------------------


def test_waiting_lists_what_jobs_wait_for_and_send_answers_them(
    make_queue: MakeQueue, queue_target: str
) -> None:
    q = make_queue()
    ask = timedelta(days=14)
    review = q.task(name="cli.review")(
        lambda: nbqueue.wait_for("review", timeout=ask, prompt="ok?", choices=["approve", "reject"])
    )
    nap = q.task(name="cli.nap")(lambda: nbqueue.sleep("cool-off", timedelta(hours=1)))
    hostile = q.task(name="cli.hostile")(lambda: nbqueue.wait_for("x", prompt=f"ok{HOSTILE}"))
    asked, napping, odd = review.enqueue(), nap.enqueue(), hostile.enqueue()
    q.worker().run_until_idle(timeout=20)
    assert {q.get(j.id).status for j in (asked, napping, odd)} == {"waiting"}
    later = review.enqueue()  # pending: a value sent now is kept for its wait
    done = run_cli("waiting", queue_target)
    assert done.returncode == 0, done.stderr
    header, *lines = done.stdout.splitlines()
    assert header.split() == ["id", "task", "deadline", "(UTC)", "waits", "for"]
    rows = {int(line.split()[0]): line for line in lines}
    assert list(rows) == [asked.id, napping.id, odd.id]  # oldest first; the pending job is not listed
    assert rows[asked.id].endswith(
        """review: a person is asked 'ok?' ("approve" or "reject"), answer within 14 d"""
    )
    assert "cli.nap" in rows[napping.id] and re.search(
        "sleep cool-off, wakes in (59|60) min$", rows[napping.id]
    )
    assert re.search(r"  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ", rows[asked.id])  # its deadline
    assert "\\x1b[2J" in rows[odd.id] and not RAW.search(done.stdout)
    listed = {j["id"]: j for j in json.loads(run_cli("waiting", queue_target, "--json").stdout)}
    assert listed[asked.id]["choices"] == ["approve", "reject"] and listed[asked.id]["prompt"] == "ok?"
    assert (listed[napping.id]["kind"], listed[napping.id]["prompt"]) == ("sleep", None)
    said = f"no waiting jobs in queue 'other' in {q}"
    assert run_cli("waiting", queue_target, "--queue", "other").stdout.strip() == said
    shown = run_cli("show", queue_target, str(asked.id)).stdout.splitlines()
    assert re.fullmatch(r"  waits for +review: a person is asked 'ok\?'.*", shown[-1])

    def refused(job_id: int, name: str, value: str) -> str:
        done = run_cli("send", queue_target, str(job_id), name, value)
        assert (done.returncode, done.stdout, done.stderr.count("\n")) == (1, "", 1), done
        assert done.stderr.startswith("nbqueue: error: ")
        return done.stderr.strip()

    assert refused(asked.id, "review", "maybe").endswith(
        f"""job {asked.id} waits for one of "approve", "reject" as 'review', not "maybe\""""
    )
    assert refused(999, "review", "approve").endswith("no job with id 999")
    assert refused(napping.id, "cool-off", "1").endswith("is a sleep, not a wait for a value")
    done = run_cli("send", queue_target, str(asked.id), "review", "approve", "--by", "ada")
    assert (done.returncode, done.stdout) == (0, f'job {asked.id}: sent review = "approve"; it runs again\n')
    assert q.get(asked.id).status == "pending"
    done = run_cli("send", queue_target, str(later.id), "review", "reject")
    assert done.stdout == f'job {later.id}: sent review = "reject"; kept for its wait\n'
    assert refused(asked.id, "review", "reject").endswith(
        f"""sent to job {asked.id} as 'review' already: "approve\""""
    )
    q.worker().run_until_idle(timeout=20)
    assert [q.get(j.id).value for j in (asked, later)] == ["approve", "reject"]
    assert [w.sent_by for w in q.waits(asked) if w.name == "review"] == ["ada"]
    assert refused(asked.id, "review", "approve").endswith(
        f"job {asked.id} is completed: a value can be sent only to a job that has not finished"
    )
    still = run_cli("waiting", queue_target).stdout.splitlines()[1:]
    assert [int(line.split()[0]) for line in still] == [napping.id, odd.id]


@pytest.mark.parametrize(
    ("given", "value"),
    [
        ("approve", "approve"),
        ("3", 3),
        ('"3"', "3"),
        ('{"a":1}', {"a": 1}),
        ("true", True),
        ("null", None),
        ("[1, 2]", [1, 2]),
        ("two words", "two words"),
        ("NaN", "NaN"),  # not JSON: the text
        ("", ""),
    ],
)
def test_a_sent_value_reads_as_json_when_it_can(
    capsys: pytest.CaptureFixture[str], db: str, given: str, value: object
) -> None:
    with Queue(db) as q:
        job = q.enqueue({"n": 1})  # pending: the value is kept, as sent
        status, out, err = cli(capsys, "send", db, str(job.id), "answer", given)
        assert status == 0, err
        assert out == f"job {job.id}: sent answer = {json.dumps(value)}; kept for its wait\n"
        [kept] = q.waits(job)
        assert kept.value is not None and json.loads(kept.value) == value
