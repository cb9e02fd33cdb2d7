"""The notebook front end: magics and views.

The only package that imports IPython and ipywidgets, and only when used, so
`import nbqueue` in a plain worker process stays light.
"""

from __future__ import annotations

import atexit
import contextlib
from typing import Any

from .. import tracebacks
from ..errors import MissingDependency
from ..workflows import Workflow

_sessions: dict[int, Any] = {}  # id(shell) -> Session: loading twice must not start twice


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext nbqueue`: register the magics (idempotent)."""
    try:
        from .magics import NbqueueMagics, Session  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependency(
            f"the notebook front end needs: pip install 'nbqueue[notebook]' ({exc})"
        ) from None
    if id(ipython) in _sessions:
        return
    session = Session(ipython)
    _sessions[id(ipython)] = session
    ipython.register_magics(NbqueueMagics(ipython, session))
    ipython.events.register("post_run_cell", session.after_cell)  # functions defined after %worker start
    tracebacks.name_files(session.cell_name)  # a job's traceback says "Cell In[17]", as IPython does
    # A workflow shown by a cell is its live graph (without the extension: a drawing as it stands).
    ipython.display_formatter.ipython_display_formatter.for_type(Workflow, session.show_workflow)
    atexit.register(session.shutdown)  # kernel shutdown stops the worker cleanly


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext nbqueue`: stop the worker and the views; `%reload_ext` leaves one worker."""
    session = _sessions.pop(id(ipython), None)
    if session is not None:
        session.shutdown()
        with contextlib.suppress(ValueError):
            ipython.events.unregister("post_run_cell", session.after_cell)
        tracebacks.forget_namer(session.cell_name)
        ipython.display_formatter.ipython_display_formatter.type_printers.pop(Workflow, None)
    # Unregister the magics too, so none is left pointing at a stopped session.
    from .magics import NbqueueMagics  # noqa: PLC0415

    for kind, names in NbqueueMagics.magics.items():
        for name in names:
            ipython.magics_manager.magics[kind].pop(name, None)
    ipython.magics_manager.registry.pop(NbqueueMagics.__name__, None)


def session(ipython: Any) -> Any:
    """The extension's state in this shell (queue, worker, views), or None if not loaded."""
    return _sessions.get(id(ipython))
