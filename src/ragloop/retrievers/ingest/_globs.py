"""Include and exclude globs over paths relative to the ingested folder (``ragloop index --include/--exclude``).

A pattern with a ``/`` matches the whole relative path (``docs/**/*.md``, ``_sources/**``); one without matches
the file name in any folder (``*.txt``). ``**`` matches any number of folders (none included), ``*`` and ``?``
stay inside one name, ``[abc]`` is a set. A file is read when it matches an include pattern (or none are given)
and no exclude pattern; excludes win.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["FileFilter", "glob_regex"]


@lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """The compiled regular expression a glob stands for (see the module docstring)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


class FileFilter:
    """Which files of a folder to read, and a count of those left out.

    Args:
        include: Globs a file must match one of (none: every file).
        exclude: Globs that leave a file out.

    Attributes:
        excluded: Files left out by the globs so far.
        hidden: Hidden files and folders passed over so far (counted by the folder walk).
    """

    def __init__(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> None:
        self.include = tuple(p.strip().removeprefix("./") for p in include if p.strip())
        self.exclude = tuple(p.strip().removeprefix("./") for p in exclude if p.strip())
        self.excluded = 0
        self.hidden = 0

    @staticmethod
    def _matches(relative: str, pattern: str) -> bool:
        target = relative if "/" in pattern else relative.rsplit("/", 1)[-1]
        return glob_regex(pattern.rstrip("/") + ("/**" if pattern.endswith("/") else "")).match(target) is not None

    def wants(self, relative: str) -> bool:
        """Whether the file at ``relative`` (a ``/``-separated path under the folder) is read; counts it if not."""
        keep = (not self.include or any(self._matches(relative, p) for p in self.include)) and not any(
            self._matches(relative, p) for p in self.exclude
        )
        if not keep:
            self.excluded += 1
        return keep
