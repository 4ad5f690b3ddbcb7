"""Expected errors: each prints as one clear message, without a traceback, and maps to an exit code."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


class RlcoreError(Exception):
    """An expected failure the user can fix. ``exit_code`` 2 means bad input or usage."""

    exit_code = 1


class UsageError(RlcoreError):
    exit_code = 2


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(str(word), sorted(set(choices)), n=1, cutoff=0.6)
    return matches[0] if matches else None


def suggest(hint: str | None) -> str:
    """`` (did you mean 'x'?)`` to append to a clause, or "" without a hint: the question mark
    stays inside its parentheses, so the clause can go on with "; available: ..."."""
    return f" (did you mean {hint!r}?)" if hint else ""


class UnknownComponentError(UsageError):
    def __init__(
        self,
        kind: str,
        name: str,
        available: Iterable[str],
        install_hint: str | None = None,
        maybe_broken: Iterable[str] = (),
    ):
        """``maybe_broken``: plugins that failed to load before saying what they provide, each
        described with its distribution and error (one of them may be the provider)."""
        self.kind, self.name, self.available = kind, name, sorted(available)
        self.suggestion = did_you_mean(name, self.available)
        parts = [
            f"unknown {kind.replace('_', ' ')} {name!r}" + ("" if install_hint else suggest(self.suggestion))
        ]
        if install_hint:
            parts.append(f"it is provided by the distribution {install_hint!r}: pip install {install_hint}")
        parts.append("available: " + (", ".join(self.available) or "(none installed)"))
        broken = list(maybe_broken)
        if broken:
            parts.append("it may come from a plugin that failed to load: " + "; ".join(broken))
        super().__init__("; ".join(parts))


class ConflictError(UsageError):
    def __init__(self, kind: str, name: str, providers: list[str]):
        self.kind, self.name, self.providers = kind, name, providers
        super().__init__(
            f"conflicting plugins for {kind.replace('_', ' ')} {name!r}: provided by "
            + " and by ".join(providers)
            + "; uninstall one, or disable it with RLCORE_DISABLE_PLUGINS"
        )


class BrokenPluginError(UsageError):
    pass


@dataclass
class Problem:
    """One located problem in a manifest."""

    key: str  # dotted key, "" for the whole document
    message: str
    line: int | None = None
    file: str = "<manifest>"

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line else "")
        key = f" [{self.key}]" if self.key else ""
        return f"{where}:{key} {self.message}"


class ManifestError(UsageError):
    """All the problems found in one manifest, reported together."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        n = len(problems)
        header = f"{n} problem{'s' if n != 1 else ''} in the manifest:"
        super().__init__("\n".join([header, *(f"  {p}" for p in problems)]))
