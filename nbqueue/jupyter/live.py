"""A view that refreshes itself: a timer thread re-reads the queue and sets widget values; it
never displays anything, so no output lands in a running cell."""

from __future__ import annotations

import logging
import threading
from typing import Any

import ipywidgets as widgets

log = logging.getLogger("nbqueue.views")


class LiveView(widgets.VBox):  # type: ignore[misc]
    """A VBox refreshed by a timer thread until it is closed."""

    def __init__(self, interval: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.interval = interval
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._timer: threading.Thread | None = None

    def _start_timer(self) -> None:
        if self.interval and self._timer is None:
            self._timer = threading.Thread(target=self._tick, name="nbqueue-view", daemon=True)
            self._timer.start()

    def _tick(self) -> None:
        failures = 0
        while not self._closed.wait(self.interval):
            try:
                self.tick()
                failures = 0
            except Exception:  # a view must never kill the kernel's threads
                failures += 1
                log.exception("refreshing %s failed", type(self).__name__)
                if failures >= 5:
                    return

    def refresh(self) -> None:
        """Re-read the queue and update the widgets."""
        raise NotImplementedError

    def tick(self) -> None:
        """What the timer does each interval: refresh (a view may skip a costly read meanwhile)."""
        self.refresh()

    @property
    def live(self) -> bool:
        """True while the refresh timer runs."""
        return self._timer is not None and self._timer.is_alive()

    def stop(self) -> None:
        """Stop refreshing; the widgets stay as they are (a view whose subject is finished)."""
        self._closed.set()

    def close(self) -> None:
        """Stop refreshing and close the widgets."""
        self._closed.set()
        super().close()
