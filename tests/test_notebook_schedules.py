"""Notebook schedules kept in the database, and requeue with the current notebook; both backends."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime

import pytest

import nbqueue
from nbqueue import notebooks, signing
from nbqueue.storage import StoredSchedule
from nbqueue.trust import covered
from tests.helpers import MakeQueue
from tests.test_notebook_jobs import write_notebook
from tests.test_periodic import keys, tick_together

NOTEBOOK = [notebooks.NOTEBOOK_TASK]


@pytest.mark.slow
def test_a_stored_notebook_schedule_is_kept_by_other_processes_once_per_slot_across_dst(
    make_queue: MakeQueue, tmp_path
) -> None:
    """One queue declares a 02:30 Berlin schedule and closes; three others (the workers of
    other processes, which never saw the declaration) tick through the autumn change."""
    path = write_notebook(tmp_path / "nightly.ipynb", "print(region)")
    start = datetime(2024, 10, 25, 22, 0, tzinfo=UTC)
    clock = nbqueue.ManualClock(start.timestamp())
    declarer = make_queue(clock=clock)
    name = declarer.periodic_notebook(
        path, cron="30 2 * * *", tz="Europe/Berlin", parameters={"region": "eu"}
    )
    assert name == "nightly"
    declarer.close()
    path.unlink()  # pinned: the file is not needed any more
    queues = [make_queue(clock=clock) for _ in range(3)]
    queues[0].notebook_task()  # what Worker(allow_code=True) registers
    for _ in range(3 * 24 * 6):
        for result in tick_together(queues, NOTEBOOK):
            assert result in ([], ["schedule:nightly"])
        clock.advance(600)
    found = [key.split(":", 3)[3] for key in keys(queues[0])]
    assert found == [
        "2024-10-26T00:30:00+00:00",  # 02:30 CEST
        "2024-10-27T00:30:00+00:00",  # the first 02:30 only
        "2024-10-28T01:30:00+00:00",  # 02:30 CET
    ]
    job = queues[0].jobs()[0]
    assert job.task == notebooks.NOTEBOOK_TASK and job.kwargs["parameters"] == {"region": "eu"}
    row = queues[0].manager.storage.get(job.id)
    assert row is not None and signing.verify_job(
        queues[0].manager.trust.identity, covered(row), job.signature
    )


def test_a_schedule_row_not_signed_by_this_user_is_not_run(
    make_queue: MakeQueue, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = nbqueue.ManualClock()
    q = make_queue(clock=clock)
    q.notebook_task()
    body = '{"args": [], "kwargs": {"notebook": {}, "parameters": {}}}'
    forged = StoredSchedule("forged", notebooks.NOTEBOOK_TASK, body, '{"every": 60}', "{}", "0" * 64)
    q.manager.storage.save_schedule(forged)
    with caplog.at_level(logging.WARNING, logger="nbqueue"):
        for _ in range(5):
            assert q.manager.periodic.tick(NOTEBOOK) == []
            clock.advance(60)
    assert sum(q.counts().values()) == 0
    assert "schedule 'forged' is not signed by this user" in caplog.text


def test_schedules_lists_stored_and_declared_ones_with_the_next_run_in_their_zone(
    make_queue: MakeQueue, tmp_path
) -> None:
    clock = nbqueue.ManualClock(datetime(2024, 3, 29, 12, 0, tzinfo=UTC).timestamp())  # a Friday
    q = make_queue(clock=clock)
    path = write_notebook(tmp_path / "report.ipynb", "1")
    q.periodic_notebook(
        path, cron="0 6 * * MON-FRI", tz="Europe/Berlin", parameters={"region": "eu"}, name="eu"
    )
    q.periodic(every=3600)(lambda: None)
    frame = q.schedules()
    assert list(frame["stored"]) == [False, True]  # soonest first: the hourly one at 13:00 UTC
    assert frame["schedule"].iloc[0] == "every 1:00:00" and frame["name"].iloc[1] == "eu"
    eu = frame.set_index("name").loc["eu"]
    # Friday noon UTC: the next weekday 06:00 in Berlin is Monday April 1 (CEST by then).
    assert eu["next_run"] == datetime(2024, 4, 1, 4, 0, tzinfo=UTC)
    assert (eu["next_run"].hour, str(eu["next_run"].tzinfo)) == (6, "Europe/Berlin")
    assert (eu["schedule"], eu["tz"], bool(eu["stored"])) == (
        "cron 0 6 * * MON-FRI (Europe/Berlin)",
        "Europe/Berlin",
        True,
    )
    assert eu["notebook"] == str(path) and eu["parameters"] == {"region": "eu"}
    assert q.unschedule("eu") is True
    assert q.unschedule("eu") is False
    assert "eu" not in set(q.schedules()["name"])


def test_a_schedule_is_refused_whole_when_anything_is_wrong(make_queue: MakeQueue, tmp_path) -> None:
    q = make_queue()
    path = write_notebook(tmp_path / "report.ipynb", "1")
    for kwargs, said in [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 6 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "0 6 * * *", "every": 60}, "exactly one"),
        ({"cron": "0 6 * * *", "parameters": {"a b": 1}}, "Python identifier"),
        ({"cron": "0 6 * * *", "max_retries": -1}, "max_retries"),
    ]:
        with pytest.raises(nbqueue.NbqueueError, match=said):
            q.periodic_notebook(path, **kwargs)
    with pytest.raises(nbqueue.NotebookError):
        q.periodic_notebook(tmp_path / "missing.ipynb", cron="@daily")
    assert q.manager.storage.schedules() == []


def test_requeue_with_reload_takes_the_current_file_and_without_it_the_pinned_copy(
    queue: nbqueue.Queue, tmp_path
) -> None:
    path = write_notebook(tmp_path / "n.ipynb", "print('old')")
    first, second = queue.enqueue_notebook(path), queue.enqueue_notebook(path)
    queue.cancel(first)
    queue.cancel(second)
    write_notebook(path, "print('fixed')")
    with pytest.raises(nbqueue.InvalidArgument, match="name them"):
        queue.requeue(None, reload=True)
    assert queue.requeue(first, reload=True) == 1
    assert queue.requeue(second) == 1

    def sources(job: nbqueue.Job) -> list[str]:
        return ["".join(cell["source"]) for cell in job.refresh().kwargs["notebook"]["cells"]]

    assert sources(first)[-1] == "print('fixed')"
    assert sources(second)[-1] == "print('old')"
    stored = queue.manager.storage.get(first.id)
    assert stored is not None
    assert signing.verify_job(
        queue.manager.trust.identity, covered(stored), first.refresh().signature
    )  # again
    with pytest.raises(nbqueue.InvalidTransition):
        queue.requeue(first, reload=True)  # pending now: not requeued, input unchanged
    assert sources(first)[-1] == "print('fixed')"


@pytest.mark.slow
def test_a_worker_with_allow_code_runs_a_stored_schedule(make_queue: MakeQueue, tmp_path) -> None:
    path = write_notebook(tmp_path / "tick.ipynb", "import nbqueue\nnbqueue.output('region', region)")
    q = make_queue()
    q.periodic_notebook(path, every=1, parameters={"region": "eu"}, name="ticker")
    with q.worker(allow_code=True, notebook_dir=tmp_path / "out"):
        jobs: list[nbqueue.Job] = []
        end = time.monotonic() + 60
        while not jobs and time.monotonic() < end:
            jobs = q.jobs(status="completed")
            time.sleep(0.2)
        q.unschedule("ticker")
    assert jobs and jobs[0].value["values"] == {"region": "eu"}


def test_the_cli_schedules_lists_and_removes_a_notebook_schedule(
    queue_target: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nbqueue.cli import main

    path = write_notebook(tmp_path / "daily.ipynb", "1")
    cron = ["--cron", "0 6 * * MON-FRI", "--tz", "Europe/Berlin"]
    assert main(["notebook", queue_target, str(path), *cron, "-p", "region=eu"]) == 0
    assert "as 'daily'" in capsys.readouterr().out
    assert main(["schedules", queue_target, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["name"], listed["tz"], listed["parameters"]) == (
        "daily",
        "Europe/Berlin",
        {"region": "eu"},
    )
    upcoming = datetime.fromisoformat(listed["next_run"])
    assert (upcoming.hour, upcoming.minute) == (6, 0) and upcoming.weekday() < 5
    assert main(["notebook", queue_target, str(path), "--tz", "Europe/Berlin"]) == 2  # tz without a schedule
    assert main(["schedules", queue_target, "--remove", "daily"]) == 0
    assert main(["schedules", queue_target, "--remove", "daily"]) == 1
    with nbqueue.Queue(queue_target) as q:
        assert sum(q.counts().values()) == 0 and q.manager.storage.schedules() == []


def test_the_cli_requeues_a_notebook_job_with_the_current_file(
    queue: nbqueue.Queue, queue_target: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nbqueue.cli import main

    path = write_notebook(tmp_path / "n.ipynb", "raise ValueError('bug')")
    job = queue.enqueue_notebook(path)
    queue.cancel(job)
    write_notebook(path, "print('fixed')")
    with pytest.raises(SystemExit) as refused:
        main(["requeue", queue_target, "--all-dead", "--reload"])
    assert refused.value.code == 2
    assert main(["requeue", queue_target, str(job.id), "--reload"]) == 0
    assert "requeued 1 job(s)" in capsys.readouterr().out
    cells = job.refresh().kwargs["notebook"]["cells"]
    assert "".join(cells[-1]["source"]) == "print('fixed')"
    assert job.status is nbqueue.State.PENDING
