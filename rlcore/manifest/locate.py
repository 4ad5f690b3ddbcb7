"""Line numbers for dotted keys of a TOML document.

tomllib gives values but no positions; this light scan of the source maps each table header and
key to its line so that every validation error can point at the line to fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_BARE = r"[A-Za-z0-9_-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
_KEY = rf"(?:{_BARE}|{_QUOTED})(?:\s*\.\s*(?:{_BARE}|{_QUOTED}))*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_KEY})\s*\]\]?")
_ASSIGN = re.compile(rf"^\s*({_KEY})\s*=")


def _split_key(key: str) -> list[str]:
    parts = re.findall(rf"{_BARE}|{_QUOTED}", key)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def _entries(text: str) -> Iterator[tuple[int, str, list[str], list[str]]]:
    """Each table header and key assignment of ``text``: (1-based line, ``"table"`` / ``"array"`` /
    ``"key"``, its full dotted path as parts (an array of tables entry gets its index), the table
    it sits in (for a header, the table it opens; for an array entry, the array))."""
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
            if header.group(1) == "[[":
                dotted = ".".join(table)
                index = array_counts.get(dotted, 0)
                array_counts[dotted] = index + 1
                table = [*table, str(index)]
                yield number, "array", list(table), table[:-1]
            else:
                yield number, "table", list(table), list(table)
            continue
        assign = _ASSIGN.match(line)
        if assign:
            yield number, "key", [*table, *_split_key(assign.group(1))], list(table)
            rest = line[assign.end() :]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_multiline = quote


def key_lines(text: str) -> dict[str, int]:
    """Map ``"table.key"`` (and ``"table"``) to the 1-based line that defines it."""
    lines: dict[str, int] = {}
    for number, kind, key, table in _entries(text):
        if kind == "key":
            for i in range(len(table) + 1, len(key) + 1):
                lines.setdefault(".".join(key[:i]), number)
        else:
            if kind == "array":
                lines.setdefault(".".join(table), number)
            lines.setdefault(".".join(key), number)
    return lines


@dataclass
class Duplicate:
    """A key or table that a TOML document defines twice."""

    key: str  # dotted: "trainer.steps", or the table "trainer"
    table: str  # the enclosing table, "" at the top level
    line: int  # the second definition
    first_line: int
    is_table: bool

    def describe(self) -> str:
        if self.is_table:
            return f"table [{self.key}] is declared twice (first on line {self.first_line})"
        name = self.key[len(self.table) + 1 :] if self.table else self.key
        where = f"table [{self.table}]" if self.table else "the top level"
        return f"duplicate key {name!r} in {where} (first set on line {self.first_line})"


def find_duplicate(text: str) -> Duplicate | None:
    """The first key or table header ``text`` defines twice (what tomllib reports as "Cannot
    overwrite a value" or "Cannot declare ... twice", without naming it), or None."""
    values: dict[str, int] = {}  # dotted key -> line, for keys set to a value
    tables: dict[str, int] = {}  # dotted table -> line of its [header]
    for number, kind, key, table in _entries(text):
        dotted = ".".join(key)
        if kind == "table":
            if dotted in tables:
                return Duplicate(dotted, ".".join(key[:-1]), number, tables[dotted], True)
            if dotted in values:
                return Duplicate(dotted, ".".join(key[:-1]), number, values[dotted], False)
            tables[dotted] = number
        elif kind == "key":
            if dotted in values:
                return Duplicate(dotted, ".".join(table), number, values[dotted], False)
            if dotted in tables:
                return Duplicate(dotted, ".".join(table), number, tables[dotted], False)
            values[dotted] = number
    return None


def line_of(lines: dict[str, int], dotted: str) -> int | None:
    """The line of ``dotted`` or of its closest enclosing key."""
    parts = dotted.split(".") if dotted else []
    while parts:
        found = lines.get(".".join(parts))
        if found:
            return found
        parts.pop()
    return None
