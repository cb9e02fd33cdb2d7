"""What a search of the jobs looks for: an id, or text in what a job holds.

The storage runs it as one bounded statement per filter (storage.statements, SEARCH); the
board's search box, `q.jobs(search=)`, `q.history(search=)` and `q.count(search=)` read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument

#: How many of the newest jobs a search reads (any older job is still found by its id): a
#: scan of this many takes about 0.1 s on SQLite, whatever the size of the queue.
SEARCH_SCANNED = 250_000


@dataclass(frozen=True, slots=True)
class Search:
    """What a search looks for: the job of an id ("17", or "#17" for the id alone), and jobs
    among the newest `scanned` whose task, key, arguments, error, output or result hold the
    text (any case)."""

    text: str
    scanned: int = SEARCH_SCANNED

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise InvalidArgument(f"search for some text, not {self.text!r}")

    @property
    def id(self) -> int | None:
        """The job id the text names, if it names one."""
        digits = self.text.strip().removeprefix("#")
        return int(digits) if digits.isdigit() and len(digits) < 19 else None

    @property
    def pattern(self) -> str | None:
        """The text as a LIKE pattern (escaped with '!'): anywhere in a value; None for "#17",
        which names an id only."""
        if self.text.strip().startswith("#") and self.id is not None:
            return None
        escaped = self.text.strip().replace("!", "!!").replace("%", "!%").replace("_", "!_")
        return f"%{escaped}%"

    def params(self) -> dict[str, Any]:
        """The statement's parameters for this search."""
        return {"id": self.id, "pattern": self.pattern, "scanned": self.scanned}
