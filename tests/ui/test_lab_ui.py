"""The job board and the dead-letter view in a real JupyterLab, driven by headless Chromium.

A fresh JupyterLab server (temp config, data, runtime, workspace, IPython and HOME
dirs; a free port; no token) serves a copy of `board.ipynb`. Playwright runs all
cells and checks, at 1280 px: the board's rendered counts match the SQLite file; the
running job is pinned first with a moving bar; the chart is drawn; no job or group row
is taller than one line. It requeues the dead-letter group with one click, opens the
running job by clicking its row, cancels it from the detail pane, and waits for the
board to show every other job completed. Jobs that wait for a person lead the board ("needs
you"); a click on a job's Approve button, then on "approve all", completes them. A LangGraph
graph run as a job (enqueue_graph) asks there too, from its node's interrupt; a click on its
Approve button resumes the graph, which completes with the verdict in its final state. Any error
output, "Error displaying widget" or browser console error
fails the test. Only the server this test started is stopped, by its process id.

Screenshots go to the test's temp dir; with NBQUEUE_UPDATE_SCREENSHOTS=1 they are
also copied to docs/ (board.png, deadletters.png, board-search.png, board-needs-you.png,
board-stream.png).
Without /usr/bin/chromium the test is skipped, except under CI, where it fails.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

import nbqueue
from tests.helpers import wait_until

CHROMIUM = "/usr/bin/chromium"
# The flags that worked on this machine (design/JUPYTER.md, section 5).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "board.ipynb"
DOCS = HERE.parent.parent / "docs"
GOOD, BAD = 6, 3  # the notebook enqueues 6 jobs that succeed and 3 that die on their first run
# ...and two that stay: one due in an hour ("next: attempt 1 of 4"), one after a flaky job
# (upstream_failed, then pending once the requeued flaky job completes: a payload no worker runs).
FIRST_ID = 40_001

# Lab settings: no news or update checks, no autosave of the copy, and every cell kept in
# the DOM (no windowing), so error text in any output can be found.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}

# Reads the notebook's state in the page: cells still to run, the kernel status, and every
# sign of a failure (error or stderr outputs in the model or the DOM, widget render errors).
PAGE_STATE_JS = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    const cells = panel.content.widgets.filter((c) => c.model.type === 'code');
    const problems = [];
    for (const [i, cell] of cells.entries()) {
        const outputs = cell.model.outputs;
        for (let k = 0; k < outputs.length; k++) {
            const out = outputs.get(k).toJSON();
            if (out.output_type === 'error') {
                problems.push(`code cell ${i}: ${out.ename}: ${out.evalue}`);
            } else if (out.output_type === 'stream' && out.name === 'stderr') {
                problems.push(`code cell ${i} wrote to stderr: ${[].concat(out.text).join('')}`);
            }
        }
    }
    const sel = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';
    for (const el of document.querySelectorAll(sel)) problems.push(`stderr output: ${el.innerText}`);
    for (const el of document.querySelectorAll('.jp-OutputArea-output')) {
        if (el.innerText.includes('Error displaying widget')) problems.push(`widget: ${el.innerText}`);
    }
    // A widget whose model or view cannot be created renders as this error placeholder.
    for (const el of document.querySelectorAll('.jupyter-widgets-error-widget')) {
        problems.push(`widget failed to render: ${el.textContent.trim() || el.outerHTML.slice(0, 300)}`);
    }
    return {
        unrun: cells.filter((c) => !c.model.executionCount).length,
        kernel: panel.sessionContext.session?.kernel?.status ?? null,
        problems,
    };
}"""

# The height of every job and group row the views show: one line of text each.
ROW_HEIGHTS_JS = """() => [...document.querySelectorAll(
    '.nbqueue-board tr[data-row-id], .nbqueue-deadletters tr[data-row-id]')]
    .map((row) => row.getBoundingClientRect().height)"""
ONE_LINE_PX = 26  # 18 px of text and its padding; a wrapped row is 36 px or more

# Cells whose whole text must show (id, status, attempt: columns 1, 4 and 5 of a job table), and
# whether an output area scrolls sideways (a view wider than the notebook's output column).
CLIPPED_JS = """() => [...document.querySelectorAll(
    '.nbqueue-board table.nbqueue-jobs tr[data-row-id],'
    + '.nbqueue-deadletters table.nbqueue-jobs tr[data-row-id]')]
    .flatMap((row) => [0, 3, 4].map((i) => row.children[i]).filter(Boolean)
        .filter((cell) => cell.scrollWidth > cell.clientWidth + 1)
        .map((cell) => `${row.dataset.rowId}: ${cell.textContent}`))"""
SIDEWAYS_JS = """() => [...document.querySelectorAll('.nbqueue-board, .nbqueue-deadletters')]
    .flatMap((view) => {
        const edge = view.closest('.jp-OutputArea-output').getBoundingClientRect().right;
        return [view, ...view.querySelectorAll('.jupyter-widgets')]
            .filter((part) => part.getBoundingClientRect().right > edge + 0.5)
            .map((part) => `${part.className.slice(0, 60)}: ${part.getBoundingClientRect().right} > ${edge}`);
    })"""

BOARD_COUNTS_JS = """() => Object.fromEntries(
    [...document.querySelectorAll('.nbqueue-board .nbqueue-count')]
        .map((el) => [el.dataset.state, Number(el.dataset.count)]))"""


def _need(condition: bool, reason: str) -> None:
    """Skip when the browser stack is missing, but never in CI: there it is a failure."""
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the UI test must run, not skip)", pytrace=False)
    pytest.skip(reason)


def _ids_from(db: Path, first: int) -> None:
    """A queue file whose jobs get ids from `first` on: five digits, as after a busy week."""
    nbqueue.Queue(str(db)).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'nbqueue_jobs'", (first - 1,))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _db_counts(path: Path) -> dict[str, int]:
    q = nbqueue.Queue(str(path))
    try:
        return q.counts()
    finally:
        q.close()


@dataclass
class Lab:
    """A running JupyterLab server this test started."""

    url: str
    root: Path
    db: Path
    log: Path
    proc: subprocess.Popen[bytes]
    home: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _write_lab_settings(config_dir: Path) -> None:
    for plugin, values in LAB_SETTINGS.items():
        package, name = plugin.rsplit("/", 1)
        target = config_dir / "lab" / "user-settings" / package / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))


def _stop(lab: Lab) -> None:
    """Stop the server we started, by its pid; SIGTERM makes it shut its kernels down too."""
    import psutil  # an ipykernel dependency

    try:
        kernels = [c.pid for c in psutil.Process(lab.proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        kernels = []
    lab.proc.terminate()
    try:
        lab.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        lab.proc.kill()
        lab.proc.wait(timeout=10)
    # Its kernels are our processes too: make sure none outlives the server.
    leftovers = [p for pid in kernels if (p := _process(pid)) is not None]
    _gone, alive = psutil.wait_procs(leftovers, timeout=10)
    for proc in alive:
        proc.kill()


def _process(pid: int) -> Any:
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


@contextmanager
def running_lab(tmp_path: Path) -> Iterator[Lab]:
    """A fresh JupyterLab on a copy of board.ipynb, with every Jupyter dir in tmp_path."""
    dirs = {name: tmp_path / name for name in ("root", "config", "data", "runtime", "ws", "ipython", "home")}
    for d in dirs.values():
        d.mkdir()
    shutil.copy(NOTEBOOK, dirs["root"] / NOTEBOOK.name)
    _write_lab_settings(dirs["config"])
    # A short path for the queue file: the views show it, and the screenshots go in the README.
    short = Path(tempfile.mkdtemp(prefix="nbqueue-ui-"))
    db = short / "jobs.db"
    _ids_from(db, FIRST_ID)
    port = _free_port()
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_DATA_DIR": str(dirs["data"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["ws"]),
        "IPYTHONDIR": str(dirs["ipython"]),
        "HOME": str(dirs["home"]),
        # Kernelspecs of this environment first; jupyter_client then runs the "python3"
        # kernel with the server's interpreter, i.e. this venv's python (checked in the notebook).
        "JUPYTER_PREFER_ENV_PATH": "1",
        "NBQUEUE_UI_DB": str(db),
        "NBQUEUE_UI_PREFIX": sys.prefix,
    }
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.token=",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={dirs['root']}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=None",
    ]
    log = tmp_path / "lab.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=dirs["root"])
    server = Lab(f"http://127.0.0.1:{port}", dirs["root"], db, log, proc, dirs["home"])
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"jupyter-lab exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/api/status", timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_until(up, 30, "JupyterLab answering /api/status", every=0.2)
        yield server
    finally:
        _stop(server)
        shutil.rmtree(short, ignore_errors=True)


class Browser:
    """Headless Debian Chromium on one Lab page, recording console errors."""

    def __init__(self, context: Any, lab: Lab) -> None:
        self.context = context
        self.lab = lab
        self.errors: list[str] = []
        self.page = context.pages[0] if context.pages else context.new_page()
        self.page.on("console", self._console)
        self.page.on(
            "pageerror", lambda exc: self.errors.append(f"pageerror: {exc} {getattr(exc, 'stack', '')}")
        )

    def _console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        # Ignore rule: a failed fetch of a resource on another host (nothing on this page
        # should go out, but an offline machine must not fail the test for it). Errors
        # located on the Lab server itself, or with no location, always count.
        where = (msg.location or {}).get("url") or ""
        host = urlparse(where).hostname
        if host and host not in ("127.0.0.1", "localhost") and "Failed to load resource" in msg.text:
            return
        self.errors.append(f"console: {msg.text} ({where})")

    def state(self) -> dict[str, Any]:
        return dict(self.page.evaluate(PAGE_STATE_JS))

    def check(self) -> None:
        problems = self.state()["problems"]
        assert not problems, "the notebook shows errors:\n" + "\n".join(problems)
        assert not self.errors, "browser console errors:\n" + "\n".join(self.errors)

    def board_counts(self) -> dict[str, int]:
        return dict(self.page.evaluate(BOARD_COUNTS_JS))


def _require_browser_stack() -> Any:
    """Playwright's sync_playwright, once Chromium and playwright are known to be there."""
    _need(os.path.exists(CHROMIUM), f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(False, "the playwright package is missing (pip install playwright)")
        raise
    return sync_playwright


@contextmanager
def headless_chromium(sync_playwright: Any, lab: Lab, tmp_path: Path) -> Iterator[Browser]:
    """Debian's Chromium through Playwright (never a downloaded browser), with a temp profile."""
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1000},
            env={**os.environ, "HOME": str(lab.home)},
        )
        try:
            context.set_default_timeout(20_000)
            yield Browser(context, lab)
        finally:
            context.close()


def _save(locator: Any, shots: Path, name: str) -> Path:
    path = shots / name
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(path), animations="disabled")
    return _published(path, name)


@pytest.mark.ui
def test_board_and_dead_letters_in_jupyterlab(tmp_path: Path) -> None:
    # Checked in the test, not in a fixture, so that under CI a missing browser is a FAILED test.
    sync_playwright = _require_browser_stack()
    with running_lab(tmp_path) as lab, headless_chromium(sync_playwright, lab, tmp_path) as browser:
        _drive(lab, browser, tmp_path)


def _drive(lab: Lab, browser: Browser, tmp_path: Path) -> None:
    page = browser.page
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK.name}?reset")
        page.wait_for_function(
            "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.status"
            " === 'idle'",
            timeout=30_000,
        )
        # The notebook gets the whole 1280 px: no file browser beside it.
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

        # Every code cell ran and the kernel is idle; fail at once on any error sign.
        def ran() -> bool:
            browser.check()
            state = browser.state()
            return state["unrun"] == 0 and state["kernel"] == "idle"

        wait_until(ran, 30, "all cells executed", every=0.2)

        board = page.locator(".nbqueue-board")
        dead_view = page.locator(".nbqueue-deadletters")
        board.wait_for(state="visible")
        dead_view.wait_for(state="visible")
        browser.check()

        # The board shows what the SQLite file holds, the long job pinned on top, its bar moving.
        want = {
            **{state.value: 0 for state in nbqueue.State},
            "completed": GOOD,
            "dead": BAD,
            "running": 1,
            "pending": 1,
            "upstream_failed": 1,
        }
        wait_until(lambda: browser.board_counts() == want == _db_counts(lab.db), 20, f"board showing {want}")
        running = board.locator("table.nbqueue-jobs tbody tr[data-row-id]").first
        assert running.get_attribute("data-status") == "running"
        bar = running.locator(".nbqueue-progress")
        start = int(bar.get_attribute("data-percent") or 0)
        wait_until(
            lambda: int(bar.get_attribute("data-percent") or 0) > start,
            20,
            "the running bar moving",
            every=0.25,
        )
        # The chart is drawn (matplotlib SVG), and every row is one line of text at 1280 px.
        board.locator(".nbqueue-chart svg").wait_for(state="attached")
        heights = page.evaluate(ROW_HEIGHTS_JS)
        assert heights and max(heights) <= ONE_LINE_PX, f"rows taller than one line: {heights}"
        # Five-digit ids, "upstream_failed", "next: attempt 1 of 4": whole, and no sideways scroll.
        page_text = board.inner_text()
        assert "upstream_failed" in page_text and "next: attempt 1 of 4" in page_text
        assert page.evaluate(CLIPPED_JS) == [], page.evaluate(CLIPPED_JS)
        assert page.evaluate(SIDEWAYS_JS) == [], page.evaluate(SIDEWAYS_JS)

        # Dead letters: the three flaky failures are one group, requeued with one click.
        dead_count = dead_view.locator(".nbqueue-dead-count")
        assert dead_count.get_attribute("data-count") == str(BAD)
        groups = dead_view.locator("table.nbqueue-dead-groups tbody tr[data-row-id]")
        assert groups.count() == 1
        _save(dead_view, shots, "deadletters.png")
        groups.first.get_by_role("button", name=f"Requeue {BAD}").click()
        dead_view.locator(".nbqueue-message", has_text=f"requeued {BAD} job(s)").wait_for()

        # A click on the running row opens it; Cancel in its detail pane stops it.
        running.click()
        detail = board.locator(".nbqueue-detail")
        detail.locator("text=slow").first.wait_for()
        assert detail.get_attribute("data-job-id") == running.get_attribute("data-row-id")
        _save(board, shots, "board.png")
        board.get_by_role("button", name="Cancel job").click()
        board.locator(".nbqueue-message", has_text="cancelled job").wait_for()

        # The board refreshes itself every second; the flaky jobs pass on their second run.
        want = {
            **{state.value: 0 for state in nbqueue.State},
            "completed": GOOD + BAD,
            "cancelled": 1,
            "pending": 2,
        }

        def all_done() -> bool:
            browser.check()
            return browser.board_counts() == want and _db_counts(lab.db) == want

        wait_until(all_done, 30, f"board and database showing {want}", every=0.25)
        wait_until(
            lambda: dead_count.get_attribute("data-count") == "0", 10, "dead-letter count 0", every=0.2
        )
        assert board.locator(".nbqueue-outcome-part[data-state='cancelled']").count() == 1
        browser.check()
        _open_an_executed_notebook(lab, browser, board)
        _a_sign_while_the_person_looks_elsewhere(lab, browser, board)
        _search_export_and_the_graph(lab, browser, board, shots)
        _questions_answered_on_the_board(lab, browser, board, shots)
        _a_stream_grows_in_the_detail_pane(lab, browser, board, shots)
        _a_graph_interrupt_answered_on_the_board(lab, browser, board)
    except BaseException:
        page.screenshot(path=str(shots / "failure.png"), full_page=True)
        print(f"screenshots in {shots}\n--- jupyter-lab log ---\n{lab.log_tail()}")
        raise
    print(f"screenshots in {shots}")


NO_KERNEL_READ = "Cannot read properties of null (reading 'kernel')"

# Run in the board's kernel, without a cell: a notebook job that fails, written below the root.
FAILING_NOTEBOOK_JOB = """
import nbformat
_nb = nbformat.v4.new_notebook()
_nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
_nb.cells = [nbformat.v4.new_code_cell("raise ValueError('bug')")]
nbformat.write(_nb, "report.ipynb")
q.enqueue_notebook("report.ipynb", max_retries=0, output_dir="runs")
"""


def _open_an_executed_notebook(lab: Lab, browser: Browser, board: Any) -> None:
    """A failed notebook job's executed notebook opens as a tab of this Lab (no second Lab in a
    new browser tab), with no kernel: the server runs as many kernels as before."""
    page = browser.page
    page.evaluate(
        "(code) => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
        ".requestExecute({code}).done",
        FAILING_NOTEBOOK_JOB,
    )
    with nbqueue.Queue(str(lab.db)) as q:
        wait_until(lambda: q.jobs(status="dead"), 90, "the notebook job dead", every=0.5)
        [job] = q.jobs(status="dead")
    row = board.locator(f"table.nbqueue-jobs tbody tr[data-row-id='{job.id}']")
    row.wait_for(timeout=20_000)
    row.click()
    link = board.locator(".nbqueue-notebook a")
    link.wait_for(timeout=20_000)
    assert link.get_attribute("data-commandlinker-command") == "docmanager:open"
    kernels_before = len(_api(lab, "kernels"))
    link.click()
    executed = f"runs/report-{job.id}.ipynb"
    page.wait_for_function(
        "(path) => window.jupyterapp.shell.currentWidget?.context?.path === path",
        arg=executed,
        timeout=20_000,
    )
    assert len(browser.context.pages) == 1, "the link opened another browser tab"
    page.wait_for_timeout(2_000)  # a kernel would have been asked for by now
    kernel = page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel?.id ?? null"
    )
    assert kernel is None, f"the executed notebook got kernel {kernel}"
    assert len(_api(lab, "kernels")) == kernels_before
    # Its own error output is the failure it shows. ipywidgets' Lab manager reads the kernel of
    # every notebook opened, and one opened with no kernel makes it throw "Cannot read properties
    # of null (reading 'kernel')" in a promise (jupyterlab-manager, not nbqueue; the page works).
    others = [e for e in browser.errors if not (NO_KERNEL_READ in e and "jupyterlab-manager" in e)]
    assert not others, others


def _api(lab: Lab, what: str) -> list[Any]:
    with urllib.request.urlopen(f"{lab.url}/api/{what}", timeout=5) as answer:
        return list(json.loads(answer.read()))


# Run in the board's kernel while another tab is in front: a job that dies at once.
DYING_JOB = "get_ipython().run_line_magic('enqueue', '--retries 0 flaky(7)')"
BOARD_KERNEL_JS = """(code) => [...window.jupyterapp.shell.widgets('main')]
    .find((w) => w.context?.path?.endsWith('board.ipynb'))
    .sessionContext.session.kernel.requestExecute({code}).done"""
SHOW_BOARD_JS = """() => window.jupyterapp.shell.activateById([...window.jupyterapp.shell.widgets('main')]
    .find((w) => w.context?.path?.endsWith('board.ipynb')).id)"""


def _a_sign_while_the_person_looks_elsewhere(lab: Lab, browser: Browser, board: Any) -> None:
    """With another tab in front, a job that dies puts "(1)" in the browser tab's title and a
    badge on the board, and no dialog; back on the board, they clear."""
    page = browser.page
    page.evaluate(SHOW_BOARD_JS)  # what died before (the notebook job) is seen, and clears
    page.wait_for_function("() => !document.title.startsWith('(')", timeout=15_000)
    page.evaluate("() => window.jupyterapp.commands.execute('launcher:create')")  # in front
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget?.title.label === 'Launcher'")
    page.evaluate(BOARD_KERNEL_JS, DYING_JOB)
    page.wait_for_function("() => document.title.startsWith('(1) ')", timeout=30_000)
    assert page.locator(".jp-Dialog").count() == 0  # (Lab's command linker would ask to run a command)
    page.evaluate(SHOW_BOARD_JS)
    badge = board.locator(".nbqueue-badge")
    assert badge.get_attribute("data-count") in ("1", "0")  # (0 once it has been seen a moment)
    page.wait_for_function("() => !document.title.startsWith('(')", timeout=15_000)
    assert badge.get_attribute("data-count") == "0" and not badge.is_visible()


def _search_export_and_the_graph(lab: Lab, browser: Browser, board: Any, shots: Path) -> None:
    """The search box finds a job by its error text over the whole queue; Export CSV downloads
    the rows shown; a click on a parent in the detail pane's graph opens it."""
    page = browser.page
    search = board.locator("input[placeholder^='find']")
    search.fill("ValueError: bug")  # the failed notebook job's error
    search.press("Enter")
    with nbqueue.Queue(str(lab.db)) as q:
        [found] = q.jobs(search="ValueError: bug")
        downstream = next(j for j in q.jobs(limit=100) if j.payload == {"after": "flaky(0)"})
        [parent] = q.relatives(downstream)[0]
    rows = board.locator("table.nbqueue-jobs tbody tr[data-row-id]")
    wait_until(lambda: rows.count() == 1, 10, "one job found", every=0.2)
    assert rows.first.get_attribute("data-row-id") == str(found.id)
    assert "1-1 of 1 found" in board.inner_text()
    board.get_by_role("button", name="Export CSV").click()
    with page.expect_download() as download:
        board.locator("a.nbqueue-download").click()
    with open(download.value.path(), newline="") as file:
        exported = list(csv.DictReader(file))
    assert [row["id"] for row in exported] == [str(found.id)] and "ValueError: bug" in exported[0]["error"]
    _save(board, shots, "board-search.png")

    search.fill(f"#{downstream.id}")
    search.press("Enter")
    wait_until(lambda: rows.first.get_attribute("data-row-id") == str(downstream.id), 10, "the child found")
    rows.first.click()
    node = board.locator(f".nbqueue-detail .nbqueue-node[data-job-id='{parent}']")
    node.wait_for(timeout=10_000)
    assert board.locator(".nbqueue-legend").count() == 1
    node.click()
    wait_until(
        lambda: board.locator(".nbqueue-detail").first.get_attribute("data-job-id") == str(parent),
        10,
        "the parent opened from the graph",
    )
    others = [e for e in browser.errors if not (NO_KERNEL_READ in e and "jupyterlab-manager" in e)]
    # (the executed notebook, still open in its tab, shows its failing cell's error: not a problem)
    problems = [p for p in browser.state()["problems"] if "raise ValueError('bug')" not in p]
    assert not others and not problems, (others, problems)


# Run in the board's kernel: jobs that ask a person (three alike, one for any JSON value) and
# one that sleeps. Each review does its work in a step first: resumed, it is not done again.
QUESTIONS = """
from datetime import timedelta

def publish(n):
    draft = nbqueue.step("draft", lambda: {"title": f"Release notes 1.{n}", "words": 180 + 40 * n})
    return nbqueue.wait_for("review", timeout=timedelta(days=14), choices=["approve", "reject"],
                            prompt=f"Publish {draft['title']!r} ({draft['words']} words) to the blog?")

def pick_model():
    return nbqueue.wait_for("model", prompt="Which model should the weekly summary use?")

def cool_off():
    nbqueue.sleep("cool-off", timedelta(minutes=52))

for n in (1, 2, 3):
    get_ipython().run_line_magic("enqueue", f"publish({n})")
get_ipython().run_line_magic("enqueue", "pick_model()")
get_ipython().run_line_magic("enqueue", "cool_off()")
"""


def _questions_answered_on_the_board(lab: Lab, browser: Browser, board: Any, shots: Path) -> None:
    """Jobs waiting for a person lead the board, each with its question, deadline and buttons;
    a click on one's Approve completes it, "approve all 2" the rest of its group, and a JSON
    value typed in the box answers the question that has no choices."""
    page = browser.page
    search = board.locator("input[placeholder^='find']")
    search.fill("")
    search.press("Enter")
    page.evaluate(BOARD_KERNEL_JS, QUESTIONS)
    entries = board.locator(".nbqueue-needs .nbqueue-need-entry")
    wait_until(lambda: entries.count() == 4, 30, "four questions on the board", every=0.25)
    badge = board.locator(".nbqueue-badge")
    wait_until(lambda: badge.get_attribute("data-count") == "4", 10, "the sign counting them", every=0.2)
    assert "4 need you" in (badge.text_content() or "")
    needs = board.locator(".nbqueue-needs")
    table = board.locator("table.nbqueue-jobs")

    # Above the running jobs and the table; a sleeper says when it wakes.
    above, below = _laid_out(needs, table, "the needs-you section and the table")
    assert above["y"] < below["y"]
    board.locator("text=wakes in 5").first.wait_for(timeout=10_000)
    first = entries.first
    assert "answer within 14 d" in first.inner_text()
    assert "draft =" in first.inner_text()  # its last steps, for context
    heights = page.evaluate(ROW_HEIGHTS_JS)
    assert heights and max(heights) <= ONE_LINE_PX, f"rows taller than one line: {heights}"
    assert page.evaluate(SIDEWAYS_JS) == [], page.evaluate(SIDEWAYS_JS)
    _save_between(page, board, table, shots, "board-needs-you.png")

    job_id = int(first.locator(".nbqueue-need").get_attribute("data-job-id") or 0)
    first.get_by_role("button", name="approve", exact=True).click()
    needs.locator(".nbqueue-needs-message", has_text=f"to job {job_id}").wait_for()

    def done(ids: list[int]) -> bool:
        _no_new_problems(browser)
        with nbqueue.Queue(str(lab.db)) as q:
            return all(q.get(i).status is nbqueue.State.COMPLETED for i in ids)

    wait_until(lambda: done([job_id]), 30, f"job {job_id} completed", every=0.25)
    row = board.locator(f"table.nbqueue-jobs tbody tr[data-row-id='{job_id}']")
    wait_until(lambda: row.get_attribute("data-status") == "completed", 10, "its row completed", every=0.2)
    with nbqueue.Queue(str(lab.db)) as q:
        assert q.get(job_id).value == "approve"
        rest = [job.id for job, wait, _ in q.waiting_rows() if wait is not None and wait.name == "review"]
    assert len(rest) == 2
    board.get_by_role("button", name="approve all 2").click()
    wait_until(lambda: done(rest), 30, f"jobs {rest} completed", every=0.25)
    wait_until(lambda: entries.count() == 1, 10, "one question left", every=0.2)
    entries.first.locator("input").fill('"small"')
    entries.first.get_by_role("button", name="Send").click()
    wait_until(lambda: entries.count() == 0, 20, "no question left", every=0.2)
    wait_until(lambda: badge.get_attribute("data-count") == "0", 10, "the sign cleared", every=0.2)
    _no_new_problems(browser)


def _no_new_problems(browser: Browser) -> None:
    """No error anywhere but the executed notebook's own (still open in its tab: not a problem)."""
    others = [e for e in browser.errors if not (NO_KERNEL_READ in e and "jupyterlab-manager" in e)]
    problems = [p for p in browser.state()["problems"] if "raise ValueError('bug')" not in p]
    assert not others and not problems, (others, problems)


# Run in the board's kernel: a job that emits a sentence a word at a time, slowly (an LLM's tokens).
TELLER = """
TEXT = ("Streams let a running job say what it is doing while it does it: each emitted item is "
        "kept with the job in the database, so the board, another notebook or a script on "
        "another machine can read it as it grows, and a retry starts a fresh stream.")

def tell(text):
    words = text.split()
    for word in words:
        nbqueue.emit(word + " ")
        time.sleep(0.4)
    nbqueue.emit({"words": len(words)})
    return len(words)

get_ipython().run_line_magic("enqueue", "tell(TEXT)")
"""
STREAM_TEXT_JS = "(el) => el.querySelector('.nbqueue-stream pre')?.textContent ?? ''"


def _a_stream_grows_in_the_detail_pane(lab: Lab, browser: Browser, board: Any, shots: Path) -> None:
    """A running job that emits tokens slowly: its pinned row shows its last item on one line, and
    its stream, opened in the detail pane, grows between two reads while the board refreshes."""
    page = browser.page
    page.evaluate(BOARD_KERNEL_JS, TELLER)
    with nbqueue.Queue(str(lab.db)) as q:
        running = wait_until(
            lambda: [j for j in q.jobs(status="running") if (j.task or "").endswith("tell")],
            30,
            "the teller running",
            every=0.2,
        )
    row = board.locator(f"table.nbqueue-jobs tbody tr[data-row-id='{running[0].id}']")
    row.locator(".nbqueue-last-item").wait_for(timeout=20_000)
    row.click()
    board.locator(f".nbqueue-stream[data-job-id='{running[0].id}'][data-live='1']").wait_for(timeout=20_000)
    # The widget that holds it: the stream's own element is drawn anew at each refresh.
    pane = board.locator(".nbqueue-stream-pane")
    first = wait_until(lambda: pane.evaluate(STREAM_TEXT_JS), 10, "the stream's first words", every=0.2)
    wait_until(
        lambda: len(pane.evaluate(STREAM_TEXT_JS)) > len(first) + 10, 20, "the stream growing", every=0.25
    )
    later = pane.evaluate(STREAM_TEXT_JS)
    assert later.startswith(first), (first, later)
    heights = page.evaluate(ROW_HEIGHTS_JS)
    assert heights and max(heights) <= ONE_LINE_PX, f"rows taller than one line: {heights}"
    assert page.evaluate(SIDEWAYS_JS) == [], page.evaluate(SIDEWAYS_JS)
    page.wait_for_timeout(2_500)  # a few more words for the picture
    _save_between(page, board.locator("table.nbqueue-jobs"), pane, shots, "board-stream.png", margin=4)
    _no_new_problems(browser)


def _save_between(page: Any, top: Any, bottom: Any, shots: Path, name: str, margin: int = 0) -> Path:
    """A screenshot from the top of `top` to the bottom of `bottom` (`margin` px more around it),
    in a window 1280 px wide made tall enough to hold it all."""
    size = page.viewport_size
    page.set_viewport_size({"width": 1280, "height": 2400})
    try:
        top.evaluate("(el) => el.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)  # the notebook lays out again
        start, end = _laid_out(top, bottom, f"both ends of {name}")
        height = end["y"] + end["height"] - start["y"] + 8
        clip = {
            "x": start["x"] - margin,
            "y": start["y"] - margin,
            "width": start["width"] + 2 * margin,
            "height": height,
        }
        path = shots / name
        page.screenshot(path=str(path), clip=clip, animations="disabled")
    finally:
        page.set_viewport_size(size)
    return _published(path, name)


def _laid_out(first: Any, second: Any, what: str) -> tuple[Any, Any]:
    """Both elements' boxes, once both are laid out (a box is None while the board redraws its
    element: it failed so once under load for each caller)."""

    def boxes() -> tuple[Any, Any] | None:
        both = first.bounding_box(), second.bounding_box()
        return both if all(both) else None

    found = wait_until(boxes, 10, f"{what} laid out", every=0.2)
    assert found is not None
    return found


def _published(path: Path, name: str) -> Path:
    """A screenshot, also copied to docs/ when NBQUEUE_UPDATE_SCREENSHOTS=1."""
    if os.environ.get("NBQUEUE_UPDATE_SCREENSHOTS") == "1":
        DOCS.mkdir(exist_ok=True)
        shutil.copy(path, DOCS / name)
    return path


# Run in the board's kernel: a LangGraph graph, draft -> review -> publish, whose review node asks
# a person through interrupt(); enqueue_graph runs it as a job of the board's queue.
GRAPH = """
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from nbqueue.integrations.langgraph import enqueue_graph

class Post(TypedDict, total=False):
    topic: str
    draft: str
    verdict: str
    published: bool

def draft(state: Post) -> Post:
    return {"draft": f"Release notes for {state['topic']}"}

def review(state: Post) -> Post:
    question = f"Publish {state['draft']!r}? (LangGraph)"
    verdict = interrupt({"prompt": question, "choices": ["approve", "reject"]})
    return {"verdict": verdict}

def publish(state: Post) -> Post:
    return {"published": state["verdict"] == "approve"}

builder = StateGraph(Post)
for node in (draft, review, publish):
    builder.add_node(node.__name__, node)
builder.add_edge(START, "draft")
builder.add_edge("draft", "review")
builder.add_edge("review", "publish")
builder.add_edge("publish", END)
graph_job = enqueue_graph(q, builder.compile(name="release-notes"), {"topic": "nbqueue 1.4"})
"""
GRAPH_TASK = "langgraph.release-notes"
GRAPH_PROMPT = "Publish 'Release notes for nbqueue 1.4'? (LangGraph)"
GRAPH_FINAL = {
    "topic": "nbqueue 1.4",
    "draft": "Release notes for nbqueue 1.4",
    "verdict": "approve",
    "published": True,
}
# Like BOARD_KERNEL_JS, but what the kernel replied: code sent this way has no cell to show an error.
BOARD_KERNEL_REPLY_JS = """async (code) => {
    const reply = await [...window.jupyterapp.shell.widgets('main')]
        .find((w) => w.context?.path?.endsWith('board.ipynb'))
        .sessionContext.session.kernel.requestExecute({code}).done;
    const {status, ename, evalue} = reply.content;
    return {status, error: status === 'ok' ? null : `${ename}: ${evalue}`};
}"""


def _a_graph_interrupt_answered_on_the_board(lab: Lab, browser: Browser, board: Any) -> None:
    """A LangGraph graph run as a job stops at its review node's interrupt: the board asks its
    question under "needs you", named after the node, with one button per choice; a click on
    Approve resumes the graph, and the job completes with the final state, verdict "approve"."""
    page = browser.page
    reply = page.evaluate(BOARD_KERNEL_REPLY_JS, GRAPH)
    assert reply["status"] == "ok", reply["error"]
    entries = board.locator(".nbqueue-needs .nbqueue-need-entry")
    wait_until(lambda: entries.count() == 1, 30, "the graph's question on the board", every=0.25)
    entry = entries.first
    with nbqueue.Queue(str(lab.db)) as q:
        [job] = [j for j in q.jobs(limit=100) if j.task == GRAPH_TASK]
    assert entry.locator(".nbqueue-need").get_attribute("data-job-id") == str(job.id)
    assert entry.locator(".nbqueue-prompt").inner_text() == GRAPH_PROMPT
    head = entry.locator(".nbqueue-need").inner_text()
    assert f"#{job.id} {GRAPH_TASK} · review ·" in head, head  # the wait: the node's name
    assert entry.get_by_role("button").all_inner_texts() == ["approve", "reject"]
    badge = board.locator(".nbqueue-badge")
    wait_until(lambda: badge.get_attribute("data-count") == "1", 10, "the sign counting it", every=0.2)

    entry.get_by_role("button", name="approve", exact=True).click()
    board.locator(".nbqueue-needs-message", has_text=f"to job {job.id} as 'review'").wait_for()

    def completed() -> bool:
        _no_new_problems(browser)
        with nbqueue.Queue(str(lab.db)) as q:
            now = q.get(job.id)
        assert now.status is not nbqueue.State.DEAD, f"graph job {job.id} dead: {now.error}"
        return now.status is nbqueue.State.COMPLETED

    wait_until(completed, 30, f"graph job {job.id} completed", every=0.25)
    with nbqueue.Queue(str(lab.db)) as q:
        assert q.get(job.id).value == GRAPH_FINAL
    # The kernel that enqueued it reads the same result.
    check = f"assert q.get(graph_job.id).value == {GRAPH_FINAL!r}, q.get(graph_job.id).value"
    reply = page.evaluate(BOARD_KERNEL_REPLY_JS, check)
    assert reply["status"] == "ok", reply["error"]
    row = board.locator(f"table.nbqueue-jobs tbody tr[data-row-id='{job.id}']")
    wait_until(lambda: row.get_attribute("data-status") == "completed", 10, "its row completed", every=0.2)
    wait_until(lambda: entries.count() == 0, 10, "no question left", every=0.2)
    wait_until(lambda: badge.get_attribute("data-count") == "0", 10, "the sign cleared", every=0.2)
    _no_new_problems(browser)
