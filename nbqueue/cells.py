"""Code jobs: a notebook cell's source queued as one job (`%%enqueue`).

Running queued source code is only safe for queues you trust, so the cell
task is opt-in: the notebook's own worker allows it, and a command-line worker
runs it only when started with `--allow-code`.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from .tasks import Producer, Task, register

CELL_TASK = "nbqueue.cell"


def register_cell_task(producer: Producer, namespace: dict[str, Any] | None = None) -> Task[Any, Any]:
    """Register the opt-in task that runs queued cells, in `namespace` (default: a fresh one)."""

    def run_cell(code: str, name: str = "cell") -> Any:
        scope = namespace if namespace is not None else {"__name__": "__nbqueue_cell__"}
        return execute(code, scope, filename=f"<nbqueue cell {name}>")

    task: Task[Any, Any] = Task(fn=run_cell, name=CELL_TASK, producer=producer, opt_in=True, signed=True)
    register(task)
    return task


def execute(code: str, scope: dict[str, Any], filename: str = "<nbqueue cell>") -> Any:
    """Run `code` in `scope`; the value of a final expression is the job's result.

    A final value that JSON cannot hold is returned as its repr, so a cell that
    ends in a DataFrame still completes.
    """
    tree = ast.parse(code, filename=filename, mode="exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    assert last is None or isinstance(last, ast.Expr)
    exec(compile(tree, filename, "exec"), scope)
    if last is None:
        return None
    value = eval(compile(ast.Expression(last.value), filename, "eval"), scope)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)
    return value
