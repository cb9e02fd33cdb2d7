"""The README is the front door: its examples run and its CLI table matches the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbqueue.cli import COMMANDS, parser

README = (Path(__file__).parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.slow  # each runs in a fresh interpreter, some with workers and a kernel
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: Path) -> None:
    for earlier in BLOCKS[:index]:  # later examples may reuse the file earlier ones made
        subprocess.run([sys.executable, "-c", earlier], cwd=tmp_path, check=True, capture_output=True)
    done = subprocess.run(
        [sys.executable, "-c", BLOCKS[index]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_quickstart_prints_what_it_says(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKS[0]], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "pending"
    assert lines[1] == "{'url': 'https://example.org', 'length': 19}"
    assert lines[2].startswith("{'pending': 0, 'running': 0, 'completed': 3")  # the job and the map's two


def test_every_cli_command_is_in_the_readme_table() -> None:
    table = re.findall(r"^\| `nbqueue (\w+) ", README, flags=re.M)
    assert sorted(table) == sorted(COMMANDS)
    sub = next(a for a in parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(COMMANDS)  # type: ignore[arg-type]


def test_every_cli_option_in_the_readme_exists() -> None:
    known = {opt for action in _all_actions() for opt in action.option_strings}
    mentioned = set(re.findall(r"(--[a-z][a-z-]+)", README.split("## Command line")[1].split("##")[0]))
    assert mentioned <= known, mentioned - known


def _all_actions() -> list:
    sub = next(a for a in parser()._actions if a.dest == "command")
    return [action for p in sub.choices.values() for action in p._actions]  # type: ignore[union-attr]


def test_every_magic_is_in_the_readme_table() -> None:
    from nbqueue.jupyter.magics import NbqueueMagics

    table = set(re.findall(r"^\| `(%%?\w+)", README, flags=re.M))
    defined = {f"%{name}" for name in NbqueueMagics.magics["line"]}
    defined |= {f"%%{name}" for name in NbqueueMagics.magics["cell"]}
    assert table == defined
