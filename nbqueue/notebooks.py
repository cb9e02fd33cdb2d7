"""Notebooks as jobs: a whole notebook, parameterised and run in a fresh kernel, as one job.

    job = q.enqueue_notebook("reports/daily.ipynb", parameters={"region": "eu"}, timeout=1800)
    job.result()    # {"values": {"rows": 1234}, "notebook": ".../daily-17.ipynb"}
    job.notebook()  # the executed notebook, from the database

Execution is papermill's (its `parameters` tag and `injected-parameters` cell) in a child
process of its own session; the notebook's kernel starts a session of its own too, so a
timeout or a cancel kills both process groups and nothing the notebook started survives.
The handler runs in the worker's thread whatever the worker's mode: the child is already
the isolation. The input is pinned in the job's arguments at enqueue (outputs stripped);
the executed notebook is saved by papermill after every cell into the output folder and,
at the end (a failure too), into the database with the job.

Running a notebook is running code: the task is opt-in and signed, like `%%enqueue` cells.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import context
from .errors import InvalidArgument, MissingDependency, NbqueueError, Unretryable
from .isolation import kill_group
from .jobs import NOTEBOOK_FILE, NOTEBOOK_JOB_ENV, NOTEBOOK_TASK, Job
from .tasks import Producer, Task, register

__all__ = [
    "NOTEBOOK_TASK",
    "CellFailed",
    "NotebookError",
    "check_outputs",
    "check_parameters",
    "collect",
    "executed_path",
    "failed_cell",
    "job_kwargs",
    "notebook_task",
    "output",
    "parameter",
    "read",
    "run",
]
OUTPUT_MIME = "application/x-nbqueue-output+json"  # what nbqueue.output() displays
FOLDER = "nbqueue-notebooks"  # the default output folder's name
OUTPUTS = ("ipynb", "html")
PARTIAL = "executed notebook (as far as it ran): "  # the board finds a failed run's notebook by it
POLL = 0.1  # seconds between looks at the child, the cancel flag and the deadline
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
INSTALL = "notebook jobs need papermill: pip install 'nbqueue[notebooks]'"


class NotebookError(InvalidArgument):
    """A notebook that cannot be queued: missing, not a notebook, or bad parameters."""


class CellFailed(NbqueueError):
    """A cell of a notebook job raised; the message names the cell, the exception and its traceback."""

    #: The job's error is this message alone: the kernel's traceback is the one that matters, not
    #: the worker's frames that started the notebook.
    told_in_full = True


def output(name: str, value: Any) -> None:
    """Inside a notebook run as a job: put a named JSON value into the job's result.

    The result's ``values`` holds every name given (the last value of a name wins). Run
    by hand, the notebook just shows ``name = value``.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"an output's name must be a non-empty string, not {name!r}")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"output {name!r} must be a JSON value: {exc}") from None
    from IPython.display import display  # noqa: PLC0415  (only ever called inside a kernel)

    display({OUTPUT_MIME: {"name": name, "value": value}, "text/plain": f"{name} = {value!r}"}, raw=True)


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The notebook at `path`, validated, its outputs and execution counts stripped (pinned at enqueue)."""
    try:
        import nbformat  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependency(INSTALL) from exc
    where = Path(path)
    if where.suffix != ".ipynb":
        raise NotebookError(f"{str(where)!r} is not a notebook (an .ipynb file)")
    try:
        with where.open(encoding="utf-8") as file:
            notebook = nbformat.read(file, as_version=4)
        nbformat.validate(notebook)
    except FileNotFoundError:
        raise NotebookError(f"no notebook at {str(where)!r}") from None
    except (OSError, ValueError, nbformat.ValidationError) as exc:
        raise NotebookError(f"{str(where)!r} is not a readable notebook: {exc}") from None
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return json.loads(nbformat.writes(notebook))  # type: ignore[no-any-return]


def job_kwargs(
    path: str | os.PathLike[str],
    parameters: Mapping[str, Any] | None,
    outputs: str | Sequence[str],
    output_dir: str | os.PathLike[str] | None,
) -> dict[str, Any]:
    """A notebook job's arguments: the notebook pinned, its parameters, where it came from."""
    return {
        "notebook": read(path),
        "parameters": check_parameters(parameters),
        "source": os.path.abspath(path),
        "outputs": check_outputs(outputs),
        "output_dir": None if output_dir is None else os.path.abspath(output_dir),
    }


def check_parameters(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """Parameters are JSON values named by Python identifiers (papermill assigns them as variables)."""
    if parameters is None:
        return {}
    if not isinstance(parameters, Mapping):
        raise NotebookError(f"parameters must be a dict, not {type(parameters).__name__}")
    for name in parameters:
        if not isinstance(name, str) or not name.isidentifier():
            raise NotebookError(f"a parameter's name must be a Python identifier, not {name!r}")
    return dict(parameters)


def parameter(text: str) -> tuple[str, Any]:
    """'region=eu' -> ("region", "eu"); a value that reads as JSON is that value: 'n=21' -> 21.

    (The type of the CLI's and %enqueue's ``-p`` option.)
    """
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a parameter like name=value")
    try:
        return name.strip(), json.loads(value)
    except ValueError:
        return name.strip(), value


def check_outputs(outputs: Any) -> list[str]:
    """Which files the run writes: "ipynb" always, "html" on request."""
    chosen = [outputs] if isinstance(outputs, str) else list(outputs)
    for kind in chosen:
        if kind not in OUTPUTS:
            raise NotebookError(f"outputs are {' and '.join(map(repr, OUTPUTS))}, not {kind!r}")
    return sorted(set(chosen) | {"ipynb"}, key=OUTPUTS.index)


def default_folder(producer: Producer) -> Path:
    """Beside a SQLite queue file; for PostgreSQL, the worker's working folder."""
    database = getattr(getattr(producer, "storage", None), "path", None)
    return (Path(database).parent if database else Path.cwd()) / FOLDER


def notebook_task(producer: Producer, folder: str | os.PathLike[str] | None = None) -> Task[Any, Any]:
    """The opt-in, signed task that runs notebook jobs; registered for this process's workers.

    `folder` is where executed notebooks are written (default: `default_folder`, which a
    job's own ``output_dir`` overrides).
    """
    fallback = Path(folder) if folder is not None else default_folder(producer)

    def run_notebook(
        notebook: dict[str, Any],
        parameters: dict[str, Any],
        source: str = "notebook.ipynb",
        outputs: list[str] | None = None,
        output_dir: str | None = None,
    ) -> dict[str, Any]:
        return run(notebook, parameters, source, outputs or ["ipynb"], Path(output_dir or fallback))

    task: Task[Any, Any] = Task(
        fn=run_notebook, name=NOTEBOOK_TASK, producer=producer, opt_in=True, signed=True, own_process=True
    )
    register(task)
    return task


def run(
    notebook: dict[str, Any], parameters: dict[str, Any], source: str, outputs: list[str], folder: Path
) -> dict[str, Any]:
    """Execute `notebook` in a child process; the job's result, or CellFailed / TimeoutError."""
    job_context = context.current()
    job_id = job_context.job.id if job_context else 0
    timeout = job_context.job.timeout if job_context else None
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # an executed notebook is the owner's
    stem = Path(source).stem or "notebook"
    target = folder / f"{stem}-{job_id}.ipynb"
    written = [target, target.with_suffix(".html")] if "html" in outputs else [target]
    _owner_only(written)
    with tempfile.TemporaryDirectory(prefix="nbqueue-notebook-") as scratch:
        spec = Path(scratch) / "spec.json"
        spec.write_text(
            json.dumps(
                {
                    "notebook": notebook,
                    "parameters": parameters,
                    "output": str(target),
                    "html": str(target.with_suffix(".html")) if "html" in outputs else None,
                    "cwd": str(Path(source).parent) if Path(source).parent.is_dir() else None,
                    "kernel_pid": str(Path(scratch) / "kernel.pid"),
                    "error": str(Path(scratch) / "error.json"),
                }
            ),
            encoding="utf-8",
        )
        log = (Path(scratch) / "log.txt").open("w+", encoding="utf-8")
        child = subprocess.Popen(
            [sys.executable, "-m", "nbqueue.notebooks", str(spec)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed with all it started
            env={**os.environ, NOTEBOOK_JOB_ENV: str(job_id)},  # its kernel knows it is a job's
        )
        try:
            stopped = _watch(child, job_context, timeout)
        finally:
            _kill(child, Path(scratch) / "kernel.pid")
            log.seek(0)
            told = log.read()[-4000:]
            log.close()
        _keep(job_context, target)
        for made in written:  # made above, never written: the run ended before it got there
            with contextlib.suppress(OSError):
                if not made.stat().st_size:
                    made.unlink()
        if stopped:
            raise stopped
        if child.returncode != 0:
            raise _failure(Path(scratch) / "error.json", child.returncode, told, target)
    result: dict[str, Any] = {"values": collect(target), "notebook": str(target)}
    if "html" in outputs:
        result["html"] = str(target.with_suffix(".html"))
    return result


def _owner_only(paths: list[Path]) -> None:
    """Create each file owner-only (0600), or make an existing one so, before the run writes it:
    papermill and nbconvert open with "w", which keeps a file's mode, whatever the umask. A
    symlink put there is refused (OSError), never followed."""
    for path in paths:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(handle, 0o600)
        finally:
            os.close(handle)


def _watch(
    child: subprocess.Popen[bytes], job_context: context.JobContext | None, timeout: float | None
) -> BaseException | None:
    """Wait for the child; an exception to raise if the job was cancelled or timed out first."""
    started = time.monotonic()
    # A little before the worker's own deadline, so that the partial notebook is still kept
    # under the claim (the worker fails the job at the deadline itself if this is late).
    early = None if timeout is None else timeout - min(1.0, timeout / 10)
    while child.poll() is None:
        if context.cancelled():
            return context.Cancelled(f"job {job_context.job.id if job_context else 0} was cancelled")
        if early is not None and time.monotonic() - started >= early:
            return context.TimedOut(f"timed out after {timeout:g} s")
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(POLL)
    return None


def _kill(child: subprocess.Popen[bytes], kernel_pid: Path) -> None:
    """Kill the kernel's process group (a session of its own) and then the child's."""
    with contextlib.suppress(OSError, ValueError):
        kill_group(int(kernel_pid.read_text()))
    kill_group(child.pid)
    child.wait()


def _keep(job_context: context.JobContext | None, target: Path) -> None:
    """Store the executed (or partly executed) notebook with the job, if the run wrote one."""
    if job_context is None or job_context.save_file is None:
        return
    with contextlib.suppress(OSError):
        text = target.read_text(encoding="utf-8")
        if text:  # empty: made owner-only before the run, which never wrote it
            job_context.save_file(NOTEBOOK_FILE, text)


def _failure(error_file: Path, code: int, told: str, target: Path) -> BaseException:
    """The error a failed run raises. A cell's failure ends with the line the board shows:
    which cell raised what; the kernel's traceback and the partial notebook's path come first."""
    try:
        error = json.loads(error_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return RuntimeError(f"the notebook runner exited with code {code}: {told.strip()[-2000:]}")
    if "ename" not in error:
        kind = Unretryable if error.get("final") else RuntimeError
        return kind(f"the notebook could not run: {error['message']}")
    where = "the injected parameters" if error["cell"] is None else f"cell {error['cell']}"
    trace = _ANSI.sub("", "\n".join(error.get("traceback") or [])).strip()
    shown_as = ""
    if error.get("count") is not None:  # one name for the cell: IPython's "Cell In[4]" is ours
        trace = trace.replace(f"Cell In[{error['count']}]", where)
        shown_as = f" ({where}, shown as [{error['count']}] in the executed notebook)"
    return CellFailed(
        f"the kernel's traceback{shown_as}:\n{trace}\n\n{PARTIAL}{target}\n"
        f"{where} raised {error['ename']}: {error['evalue']}"
    )


def executed_path(job: Job) -> str | None:
    """Where a notebook job's executed notebook was written: its result says, or a failure's error."""
    if job.task != NOTEBOOK_TASK:
        return None
    if isinstance(job.value, dict) and isinstance(job.value.get("notebook"), str):
        return str(job.value["notebook"])
    said = [line for line in (job.error or "").splitlines() if line.startswith(PARTIAL)]
    return said[-1][len(PARTIAL) :] if said else None


def failed_cell(job: Job) -> int | None:
    """The index of the cell whose error failed a notebook job's last run, if a cell did."""
    found = re.match(r"cell (\d+) raised ", ((job.error or "").strip().splitlines() or [""])[-1])
    return int(found.group(1)) if found and job.task == NOTEBOOK_TASK else None


def failed_cell_shown(job: Job) -> tuple[int | None, str]:
    """How the executed notebook shows the failed cell: its execution count ([4] in Lab) and its
    first line, from the notebook the job ran; (None, "") where they are not known."""
    index = failed_cell(job)
    if index is None:
        return None, ""
    found = re.search(r"shown as \[(\d+)\] in the executed notebook", job.error or "")
    cells = (job.kwargs.get("notebook") or {}).get("cells") or []
    source = cells[index].get("source", "") if index < len(cells) else ""
    text = "".join(source) if isinstance(source, list) else str(source)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return (int(found.group(1)) if found else None), first


def collect(path: Path) -> dict[str, Any]:
    """The values nbqueue.output() displayed in an executed notebook (the last of a name wins)."""
    values: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        for cell in notebook.get("cells", []):
            for shown in cell.get("outputs", []):
                found = shown.get("data", {}).get(OUTPUT_MIME)
                if isinstance(found, dict) and isinstance(found.get("name"), str):
                    values[found["name"]] = found.get("value")
    return values


# -- the child: papermill in a process of its own ------------------------------------------


def _main(spec_path: str) -> int:
    """Run the notebook a spec describes; 0 when every cell ran, else the error is written down."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    try:
        import nbformat  # noqa: PLC0415
        import papermill  # noqa: PLC0415
        from jupyter_client.kernelspec import NoSuchKernel  # noqa: PLC0415
        from jupyter_client.manager import AsyncKernelManager  # noqa: PLC0415
    except ImportError:
        Path(spec["error"]).write_text(json.dumps({"message": INSTALL}), encoding="utf-8")
        return 3

    class ReportingKernelManager(AsyncKernelManager):  # type: ignore[misc]
        """Writes the kernel's pid down as soon as it runs, so a kill can reach its session."""

        async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]
            await super().start_kernel(**kw)
            pid = self.provisioner.process.pid  # type: ignore[union-attr]  # the local provisioner
            Path(spec["kernel_pid"]).write_text(str(pid), encoding="utf-8")

    notebook = nbformat.from_dict(spec["notebook"])
    kernelspec = notebook.metadata.get("kernelspec") or {}
    kernel = kernelspec.get("name") or "python3"
    language = kernelspec.get("language") or (notebook.metadata.get("language_info") or {}).get("name")
    ids = [cell.get("id") for cell in notebook.cells]
    status = 0
    try:
        papermill.execute_notebook(
            notebook,
            spec["output"],
            parameters=spec["parameters"],
            kernel_name=kernel,
            language=language or "python",
            progress_bar=False,
            request_save_on_cell_execute=True,
            cwd=spec["cwd"],
            kernel_manager_class=ReportingKernelManager,
        )
    except papermill.PapermillExecutionError as exc:
        failed, count = _failed_cell(spec["output"], ids)
        error = {
            "cell": failed,
            "count": count,
            "ename": exc.ename,
            "evalue": exc.evalue,
            "traceback": exc.traceback,
        }
        Path(spec["error"]).write_text(json.dumps(error), encoding="utf-8")
        status = 1
    except NoSuchKernel as exc:  # no retry can mend it: dead at once, requeued once it is installed
        message = f"no kernel {kernel!r} on this worker: {exc}"
        Path(spec["error"]).write_text(json.dumps({"message": message, "final": True}), encoding="utf-8")
        status = 2
    except Exception as exc:  # a kernel that would not start, a parameter papermill cannot write
        said = {"message": f"{type(exc).__name__}: {exc}"}
        Path(spec["error"]).write_text(json.dumps(said), encoding="utf-8")
        status = 2
    if spec["html"] and Path(spec["output"]).exists():
        from nbconvert import HTMLExporter  # noqa: PLC0415

        body, _ = HTMLExporter().from_filename(spec["output"])
        Path(spec["html"]).write_text(body, encoding="utf-8")
    return status


def _failed_cell(output: str, ids: list[str | None]) -> tuple[int | None, int | None]:
    """The index, in the input notebook, of the cell whose error the executed notebook shows, and
    its execution count (what the kernel's traceback calls it: "Cell In[4]")."""
    notebook = json.loads(Path(output).read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        if any(shown.get("output_type") == "error" for shown in cell.get("outputs", [])):
            index = ids.index(cell.get("id")) if cell.get("id") in ids else None
            return index, cell.get("execution_count")
    return None, None


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
