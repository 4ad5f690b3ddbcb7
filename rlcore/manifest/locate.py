"""Line numbers for dotted keys of a TOML document.

tomllib gives values but no positions; this light scan of the source maps each table header and
key to its line so that every validation error can point at the line to fix.
"""

from __future__ import annotations

import re

_BARE = r"[A-Za-z0-9_-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
_KEY = rf"(?:{_BARE}|{_QUOTED})(?:\s*\.\s*(?:{_BARE}|{_QUOTED}))*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_KEY})\s*\]\]?")
_ASSIGN = re.compile(rf"^\s*({_KEY})\s*=")


def _split_key(key: str) -> list[str]:
    parts = re.findall(rf"{_BARE}|{_QUOTED}", key)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def key_lines(text: str) -> dict[str, int]:
    """Map ``"table.key"`` (and ``"table"``) to the 1-based line that defines it."""
    lines: dict[str, int] = {}
    table: list[str] = []
    array_counts: dict[str, int] = {}
    in_multiline: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if in_multiline:
            if line.count(in_multiline) % 2 == 1:
                in_multiline = None
            continue
        header = _HEADER.match(line)
        if header:
            table = _split_key(header.group(2))
            dotted = ".".join(table)
            if header.group(1) == "[[":
                index = array_counts.get(dotted, 0)
                array_counts[dotted] = index + 1
                table = [*table, str(index)]
                lines.setdefault(dotted, number)
            lines.setdefault(".".join(table), number)
            continue
        assign = _ASSIGN.match(line)
        if assign:
            key = [*table, *_split_key(assign.group(1))]
            for i in range(len(table) + 1, len(key) + 1):
                lines.setdefault(".".join(key[:i]), number)
            rest = line[assign.end():]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_multiline = quote
    return lines


def line_of(lines: dict[str, int], dotted: str) -> int | None:
    """The line of ``dotted`` or of its closest enclosing key."""
    parts = dotted.split(".") if dotted else []
    while parts:
        found = lines.get(".".join(parts))
        if found:
            return found
        parts.pop()
    return None
