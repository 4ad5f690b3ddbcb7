"""verl's configuration as Hydra sees it: override words (``key=value``, ``+key=value``,
``++key=value``, ``~key``), their values in Hydra's grammar, and YAML files flattened to dotted keys.

Only the part of Hydra a training command line uses is read: primitives, quoted strings, lists and
dicts. Sweeps (``a=1,2``, ``choice(...)``) are refused; ``${...}`` interpolations stay as text
until :mod:`rlcore_verl.config` resolves them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcore.errors import UsageError

_KEY = re.compile(r"[A-Za-z_][\w\-]*(?:\.[A-Za-z_0-9][\w\-]*)*")
_INT = re.compile(r"[+-]?\d[\d_]*")
_FLOAT = re.compile(
    r"[+-]?(?:\d[\d_]*\.[\d_]*|\.\d[\d_]*|\d[\d_]*)(?:[eE][+-]?\d+)?|[+-]?(?:inf|nan)", re.IGNORECASE
)


class OverrideError(UsageError):
    """A word that is not a Hydra override, or a value Hydra's grammar does not allow."""


@dataclass(frozen=True)
class Override:
    key: str
    value: Any
    op: str  # "set" (key=v), "add" (+key=v), "force" (++key=v), "delete" (~key)
    origin: str  # where it was written: "command line", "run.sh:42"


def parse_override(word: str, origin: str) -> Override:
    """One override word, as the shell hands it to ``python3 -m verl.trainer.main_ppo``."""
    op, body = "set", word
    if word.startswith("++"):
        op, body = "force", word[2:]
    elif word.startswith("+"):
        op, body = "add", word[1:]
    elif word.startswith("~"):
        op, body = "delete", word[1:]
    key, sep, text = body.partition("=")
    key = key.strip()
    if not _KEY.fullmatch(key):
        raise OverrideError(
            f"{origin}: {word!r} is not a Hydra override (expected key=value, +key=value or ~key)"
        )
    if not sep:
        if op != "delete":
            raise OverrideError(f"{origin}: {word!r} has no '=': a Hydra override is key=value")
        return Override(key, None, op, origin)
    try:
        value = parse_value(text)
    except OverrideError as exc:
        raise OverrideError(f"{origin}: {key}: {exc}") from None
    return Override(key, value, op, origin)


def parse_value(text: str) -> Any:
    """A Hydra override value: ``1e-6`` (float), ``True`` (bool), ``null``, ``'text'``,
    ``["console","wandb"]``, ``{a: 1}``, or bare text."""
    parser = _ValueParser(text)
    value = parser.value(top=True)
    parser.skip_space()
    if parser.pos != len(text):
        raise OverrideError(f"unexpected {text[parser.pos :]!r} in the value {text!r}")
    return value


class _ValueParser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def value(self, top: bool = False) -> Any:
        self.skip_space()
        ch = self.peek()
        if ch == "[":
            return self.sequence("[", "]")
        if ch == "{":
            return self.mapping()
        if ch and ch in "'\"":
            return self.quoted()
        return self.primitive(top)

    def sequence(self, opening: str, closing: str) -> list:
        self.pos += 1
        items: list = []
        self.skip_space()
        if self.peek() == closing:
            self.pos += 1
            return items
        while True:
            items.append(self.value())
            self.skip_space()
            ch = self.peek()
            self.pos += 1
            if ch == closing:
                return items
            if ch != ",":
                raise OverrideError(f"expected ',' or {closing!r} in the list {self.text!r}")

    def mapping(self) -> dict:
        self.pos += 1
        out: dict = {}
        self.skip_space()
        if self.peek() == "}":
            self.pos += 1
            return out
        while True:
            self.skip_space()
            key = self.quoted() if self.peek() and self.peek() in "'\"" else self.bare_until(":")
            self.skip_space()
            if self.peek() != ":":
                raise OverrideError(f"expected ':' after the key {key!r} in {self.text!r}")
            self.pos += 1
            out[str(key).strip()] = self.value()
            self.skip_space()
            ch = self.peek()
            self.pos += 1
            if ch == "}":
                return out
            if ch != ",":
                raise OverrideError(f"expected ',' or '}}' in the dict {self.text!r}")

    def quoted(self) -> str:
        quote = self.text[self.pos]
        self.pos += 1
        out = []
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == "\\" and self.pos + 1 < len(self.text) and self.text[self.pos + 1] in (quote, "\\"):
                out.append(self.text[self.pos + 1])
                self.pos += 2
                continue
            if ch == quote:
                self.pos += 1
                return "".join(out)
            out.append(ch)
            self.pos += 1
        raise OverrideError(f"the quote {quote} in {self.text!r} is never closed")

    def bare_until(self, stops: str) -> str:
        start = self.pos
        depth = 0
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == "$" and self.text.startswith("${", self.pos):
                depth += 1
            elif ch == "}" and depth:
                depth -= 1
            elif not depth and ch in stops:
                break
            self.pos += 1
        return self.text[start : self.pos]

    def primitive(self, top: bool) -> Any:
        text = self.bare_until("" if top else ",]}").strip()
        if re.fullmatch(r"\w+\(.*\)", text):
            raise OverrideError(f"{text!r} is a Hydra sweep function; give one value")
        if top and "," in text and "${" not in text:
            raise OverrideError(f"{text!r} is a sweep over several values (Hydra's multirun); give one value")
        return convert_primitive(text)


def convert_primitive(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~"):
        return None
    if _INT.fullmatch(text):
        return int(text.replace("_", ""))
    if _FLOAT.fullmatch(text):
        return float(text.replace("_", ""))
    return text


def flatten(mapping: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; an empty dict stays a leaf (``engine_kwargs.vllm: {}``)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def read_yaml_config(path: Path) -> dict[str, Any]:
    """A verl YAML config (a run's saved ``config.yaml``, or a file of one's own), flattened. Its
    Hydra ``defaults`` list is returned under the key ``defaults`` for the caller to report."""
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read the verl config {str(path)!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise UsageError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UsageError(
            f"{path}: a verl config is a mapping of sections (data, actor_rollout_ref, ...), got {type(loaded).__name__}"
        )
    flat = flatten({k: v for k, v in loaded.items() if k not in ("defaults", "hydra")})
    if "defaults" in loaded:
        flat["defaults"] = loaded["defaults"]
    return flat
