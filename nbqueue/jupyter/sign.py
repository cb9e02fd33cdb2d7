"""A sign that work needs a person while they look elsewhere: a badge on the board and a count
in the browser tab's title.

The kernel sets `count` (jobs that went dead since the board was last looked at) and `text`.
The browser tells the kernel when the board has been in view, in a visible tab, for a moment:
"looked at" resets the count. No JupyterLab notification: a widget reaches Lab's commands only
through its command linker, which asks "Run Command?" whenever the document in front is not
trusted (an executed notebook just opened, say); a dialog is worse than no toast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

LOOKED_MS = 1500  # in view this long, in a visible tab: the person has seen the board

_ESM = """
const PREFIX = /^\\(\\d+\\) /;
function render({ model, el }) {
  el.classList.add("nbqueue-sign");
  const badge = document.createElement("span");
  badge.className = "nbqueue-badge";
  el.appendChild(badge);
  let inView = false, timer = null;
  const title = () => {
    const n = model.get("count");
    const bare = document.title.replace(PREFIX, "");
    const wanted = n > 0 ? `(${n}) ${bare}` : bare;
    if (document.title !== wanted) document.title = wanted;
  };
  const draw = () => {
    const n = model.get("count");
    badge.textContent = model.get("text");
    badge.dataset.count = String(n);
    badge.style.display = n > 0 ? "" : "none";
    title();
  };
  const seen = () => inView && document.visibilityState === "visible";
  const watch = () => {
    clearTimeout(timer);
    if (seen() && model.get("count") > 0) {
      timer = setTimeout(() => { if (seen()) model.send({ looked: true }); }, LOOKED_MS);
    }
  };
  const observer = new IntersectionObserver((entries) => {
    inView = entries.some((e) => e.isIntersecting);
    watch();
  });
  observer.observe(el.closest(".nbqueue-board") || el);
  const titleWatch = new MutationObserver(title);  // JupyterLab rewrites the title on tab changes
  const head = document.querySelector("title");
  if (head) titleWatch.observe(head, { childList: true });
  document.addEventListener("visibilitychange", watch);
  model.on("change:count", () => { draw(); watch(); });
  model.on("change:text", draw);
  draw();
  return () => {
    observer.disconnect();
    titleWatch.disconnect();
    document.removeEventListener("visibilitychange", watch);
    clearTimeout(timer);
    document.title = document.title.replace(PREFIX, "");
  };
}
export default { render };
""".replace("LOOKED_MS", str(LOOKED_MS))

_CSS = """
.nbqueue-sign .nbqueue-badge { background: #dc3545; color: white; border-radius: 9px;
  padding: 0 8px; font-size: 12px; line-height: 18px; font-weight: 600; margin-left: 8px; }
"""


class Sign(anywidget.AnyWidget):  # type: ignore[misc]
    """A badge and the tab title's count; `on_looked` hears that the person saw it."""

    _esm = _ESM
    _css = _CSS
    count = traitlets.Int(0).tag(sync=True)
    text = traitlets.Unicode("").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._looked: list[Callable[[], None]] = []
        self.on_msg(self._message)

    def on_looked(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when the person has looked at the board."""
        self._looked.append(callback)

    def looked(self) -> None:
        """Do what the browser does when the person has looked at the board."""
        for callback in self._looked:
            callback()

    def show(self, count: int, text: str) -> None:
        """Set the count and the badge's text."""
        self.count, self.text = count, text

    def _message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("looked") is True:
            self.looked()
