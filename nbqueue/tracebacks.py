"""A job's traceback with the user's frames first.

A job's error is a Python traceback whose first frames are nbqueue's own (the worker
that called the handler). A person looks for their code: it is moved to the top of
each traceback block, and nbqueue's frames follow under a label, in their order.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FRAME = re.compile(r'^  (?:File "(?P<file>[^"]+)"|Cell In\[\d+\]), line \d+')
_FILE = re.compile(r'^  File "(?P<file>[^"]+)", line', re.M)
_START = "Traceback (most recent call last):"

# What names a source file the way a person knows it: the notebook extension adds one that calls
# a kernel's cell file (/tmp/ipykernel_…/3459433877.py) "Cell In[17]", as IPython's own
# tracebacks do. Each returns None for a file it does not know.
_namers: list[Callable[[str], str | None]] = []


def name_files(namer: Callable[[str], str | None]) -> None:
    """Use `namer` for the frames of the tracebacks recorded from now on (once per namer)."""
    if namer not in _namers:
        _namers.append(namer)


def forget_namer(namer: Callable[[str], str | None]) -> None:
    if namer in _namers:
        _namers.remove(namer)


def named(text: str) -> str:
    """The traceback `text` with each frame's file as its namer names it:
    `File "/tmp/ipykernel_9/3459433877.py", line 3, in f` -> `Cell In[17], line 3, in f`."""
    if not _namers:
        return text

    def rename(found: re.Match[str]) -> str:
        for namer in list(_namers):
            name = namer(found["file"])
            if name:
                return f"  {name}, line"
        return found[0]

    return _FILE.sub(rename, text)


def user_first(text: str) -> str:
    """The traceback `text` with, in each block, the frames outside nbqueue before nbqueue's
    own; any other text (the exception line, "During handling of ...") is kept as it was."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i] != _START:
            out.append(lines[i])
            i += 1
            continue
        i += 1
        frames: list[list[str]] = []
        while i < len(lines) and (lines[i].startswith("    ") or _FRAME.match(lines[i])):
            if _FRAME.match(lines[i]) or not frames:
                frames.append([])
            frames[-1].append(lines[i])
            i += 1
        ours = [f for f in frames if _is_ours(f[0])]
        theirs = [f for f in frames if not _is_ours(f[0])]
        if not ours or not theirs:
            out.append(_START)
            out.extend(line for frame in frames for line in frame)
            continue
        out.append("Traceback (your code first, most recent call last):")
        out.extend(line for frame in theirs for line in frame)
        out.append(f"  ... called by nbqueue ({len(ours)} frame{'s' if len(ours) != 1 else ''}):")
        out.extend(line for frame in ours for line in frame)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _is_ours(line: str) -> bool:
    found = _FRAME.match(line)
    return (
        found is not None and found["file"] is not None and os.path.abspath(found["file"]).startswith(_OURS)
    )
