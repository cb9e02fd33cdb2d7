"""The tutorial notebooks: each one runs from top to bottom, and is committed without outputs.

The notebooks check themselves with `assert`s, so running them is the test. They run with
nbclient (which, unlike nbval, also fails on a magic's UsageError) on a copy in a temporary
folder, in a kernel on this interpreter, so nothing is written into notebooks/.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # run by make test, not make test-fast

# nbformat and nbclient are imported by the tests below, not here: jsonschema's format checks
# (rfc3987_syntax) make `import nbformat` cost ~2.5 s, which every test process would pay at
# collection, this module's tests deselected or not.

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
TUTORIALS = {
    "01-quickstart.ipynb",
    "02-retries-and-dead-letters.ipynb",
    "03-magics-and-the-board.ipynb",
    "04-agent-pipeline.ipynb",
    "05-long-running.ipynb",
    "06-async-agents.ipynb",
    "07-research-workflow.ipynb",
    "08-notebook-jobs.ipynb",
    "09-jobs-that-wait.ipynb",
    "10-streams.ipynb",
    "11-langgraph.ipynb",
    "12-pydantic-ai.ipynb",
}


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `python3` kernel spec on this interpreter, found before any other, and a clean IPython dir.

    The kernel inherits TMPDIR, so the queue files the notebooks create land in tmp_path too.
    """
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (nbqueue tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    return temp


def test_every_tutorial_is_there() -> None:
    assert {path.name for path in NOTEBOOKS} >= TUTORIALS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {index} has outputs"
            assert cell.execution_count is None, f"cell {index} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path, kernel_env: Path) -> None:
    import nbclient
    import nbformat

    workdir = tmp_path / "run"
    workdir.mkdir()
    copy = workdir / path.name
    shutil.copyfile(path, copy)
    nb = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell

    errors = [
        output
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert errors == []
    stderr = [
        output.text
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stderr"
    ]
    assert stderr == [], "a cell wrote to stderr (a UsageError, a warning, or the worker printing)"
    assert sorted(p.name for p in workdir.iterdir()) == [path.name], "the notebook wrote beside itself"
    # pymp-*: multiprocessing's own folder (the socket of process mode's fork server). Jupyter's
    # shutdown waits for multiprocessing's resource tracker, which ignores SIGTERM, and then
    # kills the kernel before multiprocessing's exit handler removes the folder (see README,
    # process mode in a notebook). Everything the notebook itself made must be gone.
    left = [p.name for p in kernel_env.iterdir() if not p.name.startswith("pymp-")]
    assert left == [], "the notebook left its temporary folder behind"
