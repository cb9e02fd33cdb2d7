"""A job's traceback with the user's frames first.

A job's error is a Python traceback whose first frames are nbqueue's own (the worker
that called the handler). A person looks for their code: it is moved to the top of
each traceback block, and nbqueue's frames follow under a label, in their order.
"""

from __future__ import annotations

import os
import re

_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+')
_START = "Traceback (most recent call last):"


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
    return found is not None and os.path.abspath(found["file"]).startswith(_OURS)
