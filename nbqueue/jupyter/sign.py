"""A sign that work needs a person while they look elsewhere: a badge on the board, a count in
the browser tab's title, and a JupyterLab notification.

The kernel sets `count` (jobs that went dead since the board was last looked at) and `note`
(a notification to show once; a new `serial` shows it again). The browser tells the kernel
when the board has been in view, in a visible tab, for a moment: "looked at" resets the count.
The notification uses JupyterLab's own `apputils:notify` command through its command linker
(a click on an element that names the command), so no server extension is needed; outside
JupyterLab the badge and the title still work.
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
  const notify = () => {
    const message = model.get("note");
    if (!message || seen()) return;
    const link = document.createElement("span");
    link.style.display = "none";
    link.dataset.commandlinkerCommand = "apputils:notify";
    link.dataset.commandlinkerArgs = JSON.stringify({
      message, type: "error", options: { autoClose: false },
    });
    document.body.appendChild(link);
    link.click();  // JupyterLab's command linker runs the command; elsewhere nothing happens
    link.remove();
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
  model.on("change:serial", notify);
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
    """A badge, the tab title's count and a notification; `on_looked` hears that the person saw it."""

    _esm = _ESM
    _css = _CSS
    count = traitlets.Int(0).tag(sync=True)
    text = traitlets.Unicode("").tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)
    serial = traitlets.Int(0).tag(sync=True)  # a new value shows `note` as a notification

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

    def show(self, count: int, text: str, note: str | None = None) -> None:
        """Set the count and the badge's text; with `note`, notify once."""
        self.count, self.text = count, text
        if note:
            self.note = note
            self.serial += 1

    def _message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("looked") is True:
            self.looked()
