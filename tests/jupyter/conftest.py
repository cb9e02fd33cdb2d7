"""Fixtures for the notebook layer: a real IPython shell with the extension loaded.

Every test that uses `ip` must leave no worker thread behind; the teardown
checks it, and stops any orphan it finds so one failure does not poison the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_helpers import nbqueue_threads, stop_orphans

from tests.helpers import wait_until


@pytest.fixture
def ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The global test IPython shell, in tmp_path, with `%load_ext nbqueue` done.

    Teardown unloads the extension, removes the names the test added to the
    user namespace and fails if a worker thread is still alive.
    """
    from IPython.testing.globalipapp import get_ipython

    monkeypatch.chdir(tmp_path)
    shell = get_ipython()
    before = set(shell.user_ns)
    assert not nbqueue_threads(), f"a worker was already running before the test: {nbqueue_threads()}"
    shell.run_line_magic("load_ext", "nbqueue")
    try:
        yield shell
    finally:
        if "nbqueue" in shell.extension_manager.loaded:
            shell.run_line_magic("unload_ext", "nbqueue")
        for name in set(shell.user_ns) - before:
            del shell.user_ns[name]
        try:
            wait_until(lambda: not nbqueue_threads(), timeout=10, what="no worker thread")
        except AssertionError:
            orphans = stop_orphans()
            pytest.fail(f"the test left worker threads running: {orphans}")
