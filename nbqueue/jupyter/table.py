"""A table whose rows can be clicked: HTML made (and escaped) in Python, a click sent back.

ipywidgets' HTML widget cannot tell the kernel that a row was clicked, so the board's
tables are a small anywidget: `value` is the table's HTML exactly as the views render
it (every value escaped there), `selected` is the id of the row clicked last, and a
button inside a row (`data-action`) sends its action and the row's id to `on_action`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

_ESM = """
function render({ model, el }) {
  el.classList.add(model.get("box"));
  const draw = () => {
    el.innerHTML = model.get("value");
    mark();
  };
  const mark = () => {
    const chosen = String(model.get("selected"));
    for (const row of el.querySelectorAll("tr[data-row-id]")) {
      row.classList.toggle("nbqueue-selected", row.dataset.rowId === chosen);
    }
  };
  el.addEventListener("click", (event) => {
    const row = event.target.closest(model.get("rows"));
    if (!row) return;
    const id = Number(row.dataset.rowId ?? row.dataset.jobId);
    const button = event.target.closest("[data-action]");
    if (button) {
      event.stopPropagation();
      model.send({ action: button.dataset.action, id });
      return;
    }
    if (event.target.closest("a")) return;  // a link opens, it does not select
    model.set("selected", id);
    model.save_changes();
    mark();
  });
  model.on("change:value", draw);
  model.on("change:selected", mark);
  draw();
}
export default { render };
"""

#: A detail pane: its graph's nodes and the names of a job's parents and children select them.
PANE = {"rows": ".nbqueue-node, .nbqueue-family span[data-job-id]", "box": "nbqueue-pane-box"}

# One line per row at any width: fixed layout, text clipped with an ellipsis (the whole
# text is in the cell's title, and in the detail pane).
_CSS = """
.nbqueue-table-box table { width: 100%; table-layout: fixed; border-collapse: collapse;
  font-size: 12px; line-height: 18px; }
.nbqueue-table-box th { text-align: left; font-weight: 600; color: #495057; padding: 1px 6px;
  border-bottom: 1px solid #dee2e6; white-space: nowrap; overflow: hidden; }
.nbqueue-table-box td { padding: 1px 6px; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; max-height: 18px; }
.nbqueue-table-box tr[data-row-id] { cursor: pointer; }
.nbqueue-table-box tr[data-row-id]:hover { background: #f1f3f5; }
.nbqueue-table-box tr.nbqueue-selected { background: #e7f1ff; }
.nbqueue-table-box tr.nbqueue-section td { font-weight: 700; color: #343a40; padding-top: 4px;
  cursor: default; background: none; }
.nbqueue-pane-box .nbqueue-node, .nbqueue-pane-box .nbqueue-family span[data-job-id] { cursor: pointer; }
.nbqueue-table-box button[data-action] { font-size: 11px; line-height: 14px; padding: 0 6px;
  margin-right: 4px; cursor: pointer; border: 1px solid #adb5bd; border-radius: 3px;
  background: #f8f9fa; }
"""


class ClickTable(anywidget.AnyWidget):  # type: ignore[misc]
    """An HTML table whose rows (`<tr data-row-id=N>`) select on click; with `rows` and `box`
    set (PANE), any HTML whose elements of that selector (data-job-id=N) select their job."""

    _esm = _ESM
    _css = _CSS
    value = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Int(0).tag(sync=True)
    rows = traitlets.Unicode("tr[data-row-id]").tag(sync=True)  # what a click selects
    box = traitlets.Unicode("nbqueue-table-box").tag(sync=True)  # the class that styles it

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._actions: list[Callable[[str, int], None]] = []
        self.on_msg(self._message)

    def on_action(self, callback: Callable[[str, int], None]) -> None:
        """Call `callback(action, row_id)` when a row's button is clicked."""
        self._actions.append(callback)

    def act(self, action: str, row_id: int) -> None:
        """Do what clicking the row's `action` button does."""
        for callback in self._actions:
            callback(action, row_id)

    def _message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and isinstance(content.get("action"), str):
            row_id = content.get("id")
            if isinstance(row_id, int) and not isinstance(row_id, bool):
                self.act(content["action"], row_id)
