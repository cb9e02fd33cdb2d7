"""The board's links into JupyterLab: a path of the kernel's server, opened as a tab of the same
Lab with no kernel (the browser part is tests/ui/test_lab_ui.py)."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nbqueue.jupyter import lab


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "runtime"
    folder.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(folder))
    lab.server_root.cache_clear()
    yield folder
    lab.server_root.cache_clear()


def test_the_server_root_is_read_from_the_parent_server_s_runtime_file(runtime: Path, tmp_path: Path) -> None:
    assert lab.server_root() is None  # no server started this process
    lab.server_root.cache_clear()
    other = {"pid": os.getppid() + 1, "root_dir": "/elsewhere"}
    (runtime / "jpserver-1.json").write_text(json.dumps(other))
    (runtime / "jpserver-2.json").write_text("{broken")
    ours = {"pid": os.getppid(), "root_dir": str(tmp_path)}
    (runtime / "jpserver-3.json").write_text(json.dumps(ours))
    assert lab.server_root() == os.path.realpath(tmp_path)


def test_a_path_below_the_root_opens_in_lab_without_a_kernel(tmp_path: Path) -> None:
    executed = tmp_path / "runs" / "report-7.ipynb"
    executed.parent.mkdir()
    executed.write_text("{}")
    root = os.path.realpath(tmp_path)
    assert lab.open_in_lab(str(executed), root) == {
        "path": "runs/report-7.ipynb",
        "factory": "Notebook",
        "kernelPreference": {"shouldStart": False, "canStart": True},
    }
    assert lab.open_in_lab(str(executed), os.path.realpath(executed.parent.parent.parent)) is not None
    assert lab.open_in_lab("/etc/passwd", root) is None
    assert lab.open_in_lab(str(executed), None) is None


def test_the_executed_notebook_link_carries_the_lab_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbqueue import Queue, State
    from nbqueue.jupyter.render import notebook_line
    from nbqueue.notebooks import NOTEBOOK_TASK, PARTIAL

    executed = tmp_path / "runs" / "report-7.ipynb"
    executed.parent.mkdir()
    executed.write_text("{}")
    monkeypatch.chdir(tmp_path / "runs")  # the kernel's folder: the file is not below it
    with Queue(tmp_path / "q.db") as q:
        written = q.enqueue({"n": 1})
    job = replace(
        written,
        status=State.DEAD,
        task=NOTEBOOK_TASK,
        error=f"...\n{PARTIAL}{executed}\ncell 0 raised ValueError: bug",
    )
    line = notebook_line(job, os.path.realpath(tmp_path))
    assert "data-commandlinker-command='docmanager:open'" in line
    args = html.unescape(line.split("data-commandlinker-args='", 1)[1].split("'", 1)[0])
    assert json.loads(args)["path"] == "runs/report-7.ipynb"
    plain = notebook_line(job, None)  # no server: as before, a link relative to the kernel's folder
    assert "commandlinker" not in plain and "href='report-7.ipynb'" in plain
