"""A job that waits outlives the kernel that started it: restart the kernel, answer, and the
restarted kernel's worker finishes the job, every step of it run once (tutorial 09's agent)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_kernel import Kernel, stdout_of

from nbqueue import Queue, State
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # run by make test, not make test-fast

# The notebook's cells, run again in the same order after a restart. `note` appends to a file,
# so what ran is counted across kernels.
AGENT = """
from datetime import timedelta
from pathlib import Path

import nbqueue

def note(what):
    with Path(LOG).open("a") as f:
        f.write(what + "\\n")

def write_draft(topic):
    note("draft")
    return {"title": topic.capitalize()}

def post_all(texts):
    note("post")
    return {"posted": texts}

@nbqueue_queue.task(name="blog.translate")
def translate(draft, lang):
    note(f"translate:{lang}")
    return f"[{lang}] {draft['title']}"

@nbqueue_queue.task(name="blog.publish", max_retries=3)
def publish(topic):
    draft = nbqueue.step("draft", write_draft, topic)
    answer = nbqueue.wait_for("review", timeout=timedelta(days=14), prompt=f"Publish {draft['title']}?",
                              choices=["approve", "reject"])
    if answer == "reject":
        return "dropped"
    nbqueue.sleep("cool-off", timedelta(seconds=COOL_OFF))
    texts = nbqueue.wait_for_jobs([translate.enqueue(draft, lang) for lang in ("de", "fr")])
    return nbqueue.step("post", post_all, [draft["title"], *texts])
"""

RESULT = {"posted": ["Owls", "[de] Owls", "[fr] Owls"]}


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kernel]:
    """One python3 kernel in tmp_path with private IPython/Jupyter dirs, shut down at teardown."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    started = Kernel(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def q(tmp_path: Path) -> Iterator[Queue]:
    """The queue file, opened from the test process as another process would."""
    opened = Queue(str(tmp_path / "blog.db"))
    yield opened
    opened.close()


def notebook_cells(kernel: Kernel, tmp_path: Path, cool_off: float) -> None:
    """What a person runs from the top after a (re)start: open the queue, define the tasks, start
    the worker."""
    kernel.run(f"%load_ext nbqueue\n%nbqueue {tmp_path / 'blog.db'}")
    kernel.run(f"LOG = {str(tmp_path / 'ran.txt')!r}\nCOOL_OFF = {cool_off}")
    kernel.run(AGENT)
    kernel.run("%worker start --concurrency 2")


def restart(kernel: Kernel) -> None:
    """Kernel > Restart: the kernel process is replaced; nothing of it survives but the file."""
    before = stdout_of(kernel.run("import os\nprint(os.getpid())"))
    kernel.km.restart_kernel(now=False)
    kernel.kc.wait_for_ready(timeout=60)
    after = stdout_of(kernel.run("import os\nprint(os.getpid())\nprint('publish' in globals())"))
    assert after.split()[0] != before.strip() and after.split()[1] == "False"


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_an_approval_after_a_kernel_restart_resumes_the_agent_once(
    kernel: Kernel, tmp_path: Path, q: Queue
) -> None:
    notebook_cells(kernel, tmp_path, cool_off=0.2)
    kernel.run("job = publish.enqueue('owls')")
    [job] = q.jobs()
    wait_until(lambda: q.get(job.id).status is State.WAITING, 20, "the agent waiting for its review")
    assert ran(tmp_path) == ["draft"]

    restart(kernel)
    waiting = q.waiting()
    assert list(waiting["id"]) == [job.id] and list(waiting["name"]) == ["review"]

    # approved while no worker runs anywhere: pending, and it stays so until a worker comes
    assert q.send(job.id, "review", "approve", by="ada") is True
    assert q.get(job.id).status is State.PENDING

    notebook_cells(kernel, tmp_path, cool_off=0.2)  # the notebook run again from the top
    assert q.get(job.id).result(timeout=30) == RESULT
    done = q.get(job.id)
    assert done.status is State.COMPLETED and done.retries == 0
    assert sorted(ran(tmp_path)) == ["draft", "post", "translate:de", "translate:fr"]  # each once

    attempts = q.attempts(done)
    outcomes = list(attempts["outcome"])
    assert outcomes[0] == "suspended" and outcomes[-1] == "completed"
    assert set(outcomes[1:-1]) <= {"suspended"}  # the sleep and the translations: waits, not failures
    assert attempts["pid"].iloc[0] != attempts["pid"].iloc[-1]  # started in one kernel, ended in the next
    [review] = [w for w in q.waits(done) if w.name == "review"]
    assert review.value == '"approve"' and review.sent_by == "ada"


def test_a_sleep_that_ends_while_the_kernel_restarts_ends_in_the_next_kernel(
    kernel: Kernel, tmp_path: Path, q: Queue
) -> None:
    notebook_cells(kernel, tmp_path, cool_off=2.0)
    kernel.run("job = publish.enqueue('owls')")
    [job] = q.jobs()
    wait_until(lambda: q.get(job.id).status is State.WAITING, 20, "the agent waiting for its review")
    kernel.run("assert nbqueue_queue.send(job, 'review', 'approve')")  # approved in the notebook
    wait_until(lambda: (q.get(job.id).waits_for or "").startswith("sleep"), 20, "the agent asleep")

    restart(kernel)
    [wakes] = q.waiting()["deadline"]
    assert q.get(job.id).status is State.WAITING  # asleep across the restart

    notebook_cells(kernel, tmp_path, cool_off=2.0)
    assert q.get(job.id).result(timeout=30) == RESULT
    done = q.get(job.id)
    assert done.status is State.COMPLETED and done.retries == 0
    assert done.finished_at is not None and done.finished_at >= wakes
    assert sorted(ran(tmp_path)) == ["draft", "post", "translate:de", "translate:fr"]
