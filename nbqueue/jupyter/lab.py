"""Where the kernel's Jupyter server serves files from, so that the board opens a file as a tab
of the same JupyterLab.

A link in a widget is followed by the browser: a relative one opened a second Lab in a new tab,
and the executed notebook there started a kernel that nobody shut down. JupyterLab runs a
command for a click on any element that names one (`data-commandlinker-command`), inside a
trusted notebook without asking; `docmanager:open` opens a path of the server's, here with no
kernel. The path is the server's own (relative to its root folder), which a kernel learns from
the runtime file its server wrote (the kernel is the server's child process).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path


@functools.cache
def server_root() -> str | None:
    """The root folder of the Jupyter server that started this kernel, or None (no server: a
    plain IPython, a test's shell, a kernel started by hand)."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir  # noqa: PLC0415
    except ImportError:
        return None
    parent = os.getppid()
    for found in sorted(Path(jupyter_runtime_dir()).glob("jpserver-*.json")):
        try:
            server = json.loads(found.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if server.get("pid") == parent and isinstance(server.get("root_dir"), str):
            return os.path.realpath(os.path.expanduser(str(server["root_dir"])))
    return None


def open_in_lab(path: str, root: str | None) -> dict[str, object] | None:
    """The `docmanager:open` arguments that open `path` as a tab, without a kernel; None when
    it is not below the server's root (Lab cannot open it)."""
    if root is None:
        return None
    real = os.path.realpath(path)
    if os.path.commonpath([real, root]) != root:
        return None
    return {
        "path": Path(os.path.relpath(real, root)).as_posix(),
        "factory": "Notebook",
        "kernelPreference": {"shouldStart": False, "canStart": True},
    }
