"""Notebooks as jobs: real notebooks run by papermill in real kernels, on both backends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import nbqueue
from nbqueue.jupyter import render
from tests.conftest import MakeQueue

PARAMETERS = 'region = "nowhere"\nn = 1'


def write_notebook(path: Path, *cells: str, parameters: str | None = PARAMETERS) -> Path:
    """A notebook of code cells; the first is tagged `parameters` when given."""
    import nbformat  # here, not at the top: it costs every test process ~1.5 s to import

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if parameters is not None:
        notebook.cells.append(nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    notebook.cells += [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(notebook, path)
    return path


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def wait_gone(pids: list[int], within: float = 10) -> list[int]:
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def wait_for(path: Path, within: float = 60) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} was never written")


# A cell that starts a grandchild in the kernel's session, writes both pids down, then hangs.
HANG = (
    "import os, subprocess, time\n"
    "child = subprocess.Popen(['sleep', '300'])\n"
    "open(pid_file, 'w').write(f'{os.getpid()} {child.pid}')\n"
    "time.sleep(300)"
)


# -- enqueue: what is refused before anything is written --------------------------------


def test_a_missing_or_broken_notebook_or_bad_parameters_are_refused_and_nothing_is_queued(
    queue: nbqueue.Queue, tmp_path: Path
) -> None:
    good = write_notebook(tmp_path / "good.ipynb", "1")
    (tmp_path / "broken.ipynb").write_text("{not json")
    cases = [
        (tmp_path / "missing.ipynb", {}, "no notebook at"),
        (tmp_path / "broken.ipynb", {}, "not a readable notebook"),
        (tmp_path / "script.py", {}, "not a notebook"),
        (good, {"not an identifier": 1}, "Python identifier"),
        (good, ["region"], "must be a dict"),
    ]
    for path, parameters, said in cases:
        with pytest.raises(nbqueue.NotebookError, match=said):
            queue.enqueue_notebook(path, parameters)  # type: ignore[arg-type]
    with pytest.raises(nbqueue.NotebookError, match="'pdf'"):
        queue.enqueue_notebook(good, outputs=("ipynb", "pdf"))
    with pytest.raises(nbqueue.PayloadError):
        queue.enqueue_notebook(good, {"when": object()})
    assert sum(queue.counts().values()) == 0


def test_the_input_is_pinned_at_enqueue_without_its_outputs(queue: nbqueue.Queue, tmp_path: Path) -> None:
    import nbformat

    path = write_notebook(tmp_path / "pinned.ipynb", "print('first')")
    notebook = nbformat.read(path, as_version=4)
    notebook.cells[1].outputs = [nbformat.v4.new_output("stream", text="an old run\n")]
    nbformat.write(notebook, path)
    job = queue.enqueue_notebook(path, {"region": "eu"})
    write_notebook(path, "print('edited later')")
    pinned = job.refresh().kwargs["notebook"]
    assert ["".join(cell["source"]) for cell in pinned["cells"]] == [PARAMETERS, "print('first')"]
    assert pinned["cells"][1]["outputs"] == []
    assert job.kwargs["parameters"] == {"region": "eu"}
    assert job.task == "nbqueue.notebook"


# -- runs, in real kernels ---------------------------------------------------------------


@pytest.mark.slow
def test_parameters_are_injected_and_outputs_come_back_in_the_result(
    queue: nbqueue.Queue, tmp_path: Path
) -> None:
    import nbformat

    path = write_notebook(
        tmp_path / "report.ipynb",
        "import nbqueue\nnbqueue.output('region', region)\nnbqueue.output('double', n * 2)",
        "nbqueue.output('rows', [1, 2, 3])",
    )
    job = queue.enqueue_notebook(path, {"region": "eu", "n": 21}, outputs=("ipynb", "html"))
    write_notebook(path, "raise RuntimeError('the file changed after enqueue')")  # the run is pinned
    out = tmp_path / "out"
    with queue.worker(allow_code=True, notebook_dir=out):
        result = job.result(timeout=120)
    executed = out / f"report-{job.id}.ipynb"
    assert result == {
        "values": {"region": "eu", "double": 42, "rows": [1, 2, 3]},
        "notebook": str(executed),
        "html": str(executed.with_suffix(".html")),
    }
    assert "<html" in executed.with_suffix(".html").read_text()
    stored = job.notebook()
    assert stored is not None and stored == nbformat.read(executed, as_version=4)
    injected = [cell for cell in stored.cells if "injected-parameters" in cell.metadata.get("tags", [])]
    assert len(injected) == 1 and "region = " in injected[0].source and '"eu"' in injected[0].source
    assert all(cell.execution_count is not None for cell in stored.cells if cell.cell_type == "code")


@pytest.mark.slow
def test_a_failing_cell_is_named_by_its_index_and_the_partial_notebook_is_kept(
    queue: nbqueue.Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_notebook(
        tmp_path / "fails.ipynb", "x = 1", "raise ValueError(f'no data for {region}')", "y = 2"
    )
    job = queue.enqueue_notebook(path, {"region": "mars"}, max_retries=0)
    with queue.worker(allow_code=True, notebook_dir=tmp_path / "out"):
        with pytest.raises(nbqueue.JobFailed):
            job.result(timeout=120)
    job.refresh()
    assert job.status is nbqueue.State.DEAD
    assert job.error is not None
    assert "cell 2 raised ValueError: no data for mars" in job.error  # counted in the input, from 0
    assert "Traceback" in job.error or "ValueError" in job.error.splitlines()[-1]
    assert "\x1b[" not in job.error  # the kernel's colours are stripped
    # One name for the cell, and the kernel's traceback first: no "Cell In[4]", no worker frames.
    assert job.error.startswith("the kernel's traceback (cell 2, shown as ["), job.error
    assert "\ncell 2, line 1\n" in job.error and "Cell In[" not in job.error
    assert "nbqueue/worker.py" not in job.error and "CellFailed" not in job.error
    partial = job.notebook()
    assert partial is not None
    ran = {cell.source: cell.execution_count for cell in partial.cells if cell.cell_type == "code"}
    assert ran["x = 1"] is not None and ran["y = 2"] is None
    assert (tmp_path / "out" / f"fails-{job.id}.ipynb").exists()
    # The board's detail pane links it (relative, so JupyterLab opens it in a tab) and names the cell.
    monkeypatch.chdir(tmp_path)
    line = render.notebook_line(job)
    assert f"href='out/fails-{job.id}.ipynb'" in line and "failed at cell 2" in line
    count = next(c.execution_count for c in partial.cells if c.source.startswith("raise ValueError"))
    code = "raise ValueError(f&#x27;no data for {region}&#x27;)"
    assert f"failed at cell 2 [{count}]</span> <code>{code}</code>" in line


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_notebook_past_its_timeout_is_killed_with_its_kernel_and_what_it_started(
    make_queue: MakeQueue, tmp_path: Path, mode: str
) -> None:
    queue = make_queue()
    pid_file = tmp_path / "pids"
    path = write_notebook(tmp_path / "hangs.ipynb", HANG, parameters="pid_file = ''")
    # The timeout covers the kernel's start too: 15 s leaves room for a slow start on a loaded
    # machine (with 8 s, three slow tests at once and another suite beside them, the kernel was
    # still starting when the job timed out, and the cell never wrote its pids).
    job = queue.enqueue_notebook(path, {"pid_file": str(pid_file)}, timeout=15, max_retries=0)
    with queue.worker(allow_code=True, notebook_dir=tmp_path / "out", mode=mode):
        pids = [int(pid) for pid in wait_for(pid_file).split()]
        with pytest.raises(nbqueue.JobFailed):
            job.result(timeout=60)
        assert wait_gone(pids) == []
    assert job.refresh().status is nbqueue.State.DEAD
    assert job.error is not None and "timed out after 15 s" in job.error
    assert list(queue.attempts(job)["outcome"]) == ["timeout"]
    kept = job.notebook()  # as far as it ran: the parameters, then the cell that hung
    assert kept is not None and kept.cells[0].execution_count is not None


@pytest.mark.slow
def test_cancel_kills_the_kernel_and_what_it_started(queue: nbqueue.Queue, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    path = write_notebook(tmp_path / "hangs.ipynb", HANG, parameters="pid_file = ''")
    job = queue.enqueue_notebook(path, {"pid_file": str(pid_file)})
    with queue.worker(allow_code=True, notebook_dir=tmp_path / "out"):
        pids = [int(pid) for pid in wait_for(pid_file).split()]
        queue.cancel(job)
        assert wait_gone(pids) == []
    assert job.refresh().status is nbqueue.State.CANCELLED


@pytest.mark.slow
def test_a_notebook_job_is_a_dependency_of_another_job(queue: nbqueue.Queue, tmp_path: Path) -> None:
    total = queue.task(name="total")(lambda result: sum(result["values"]["rows"]))
    path = write_notebook(tmp_path / "rows.ipynb", "import nbqueue\nnbqueue.output('rows', list(range(n)))")
    first = queue.enqueue_notebook(path, {"n": 5})
    then = total.enqueue(nbqueue.result_of(first))
    assert then.refresh().status is nbqueue.State.BLOCKED
    with queue.worker(allow_code=True, notebook_dir=tmp_path / "out"):
        assert then.result(timeout=120) == 10
    assert first.refresh().value["values"] == {"rows": [0, 1, 2, 3, 4]}


@pytest.mark.slow
def test_a_notebook_whose_kernel_is_not_installed_is_dead_at_once(
    queue: nbqueue.Queue, tmp_path: Path
) -> None:
    import nbformat

    path = write_notebook(tmp_path / "r.ipynb", "1")
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata["kernelspec"] = {"name": "no-such-kernel", "display_name": "?", "language": "python"}
    nbformat.write(notebook, path)
    job = queue.enqueue_notebook(path, max_retries=3)
    with queue.worker(allow_code=True, notebook_dir=tmp_path / "out"):
        with pytest.raises(nbqueue.JobFailed, match="no kernel 'no-such-kernel' on this worker"):
            job.result(timeout=120)
    assert job.refresh().retries == 0  # no retry can mend it


@pytest.mark.slow
def test_a_worker_without_allow_code_leaves_notebook_jobs_alone(queue: nbqueue.Queue, tmp_path: Path) -> None:
    job = queue.enqueue_notebook(write_notebook(tmp_path / "n.ipynb", "1"))
    worker = queue.worker()
    worker.run_until_idle(timeout=10)
    assert job.refresh().status is nbqueue.State.PENDING
    assert not (tmp_path / "nbqueue-notebooks").exists()


def test_the_cli_queues_a_notebook_with_parameters(queue_target: str, tmp_path: Path) -> None:
    from nbqueue.cli import main

    path = write_notebook(tmp_path / "report.ipynb", "1")
    assert (
        main(
            [
                "notebook",
                queue_target,
                str(path),
                "-p",
                "region=eu",
                "-p",
                "n=21",
                "--html",
                "--timeout",
                "5m",
            ]
        )
        == 0
    )
    with nbqueue.Queue(queue_target) as q:
        [job] = q.jobs()
        assert job.kwargs["parameters"] == {"region": "eu", "n": 21}
        assert job.kwargs["outputs"] == ["ipynb", "html"]
        assert job.timeout == 300
    with pytest.raises(SystemExit):
        main(["notebook", queue_target, str(path), "-p", "no-equals-sign"])
    assert main(["notebook", queue_target, str(tmp_path / "missing.ipynb")]) == 1
