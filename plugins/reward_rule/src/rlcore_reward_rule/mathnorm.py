"""Extracting the last ``\\boxed{...}`` answer and deciding whether two math answers are the same.

The normaliser rewrites an answer into a canonical text so that equivalent forms compare equal:
spacing, ``\\left``/``\\right``, ``\\dfrac``/``\\tfrac``, ``\\frac12``, units and ``\\text{}``,
degrees, percent and dollar signs, ``x = 5``, trailing ``.0``, thousands separators. Numbers are
then compared exactly as fractions, so ``0.5`` equals ``\\frac{1}{2}`` but ``0.33`` does not equal
``\\frac{1}{3}`` (no rounding, so no false positives).
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\boxed 5``; None when there is none or its
    braces never close (a truncated response has no final answer)."""
    if not text:
        return None
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start == -1:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    return _box_content(text, start + len(cmd))


def _box_content(text: str, pos: int) -> str | None:
    if pos < len(text) and text[pos] == "{":
        depth = 0
        for i in range(pos, len(text)):
            ch = text[i]
            if ch == "{" and (i == 0 or text[i - 1] != "\\"):
                depth += 1
            elif ch == "}" and (i == 0 or text[i - 1] != "\\"):
                depth -= 1
                if depth == 0:
                    return text[pos + 1 : i].strip()
        return None
    match = re.match(r"[ \t]+([^\s$]+)", text[pos:])  # "\boxed 5"
    return match.group(1) if match else None


# ----------------------------------------------------------------------------- normalising

# Removed outright (order matters: "^\\circ" before "\\circ").
_DROP = ["^{\\circ}", "^\\circ", "\u00b0", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\$", "$", "\\%", "%"]
# Control words that only space or size things; replaced by a space.
_SPACING_WORDS = re.compile(
    r"\\(?:left|right|displaystyle|qquad|quad|circ|big|Big|bigl|bigr|Bigl|Bigr)(?![a-zA-Z])"
)
_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_NUM = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
_UNIT_AFTER_NUMBER = re.compile(
    r"^(" + _NUM + r"|-?\\frac\{[^{}]*\}\{[^{}]*\})\s+(?:[a-zA-Z][a-zA-Z.]*\s*)+$"
)


def normalise(answer: str) -> str:
    """A canonical text of a math answer (see the module docstring)."""
    s = str(answer).strip().replace("\n", " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\u2212", "-")
    # \text{ cm} -> " cm": units keep a space before them so they can be told from variables.
    s = _TEXT_COMMANDS.sub(lambda m: " " + m.group(1).strip() + " ", s)
    for token in _DROP:
        s = s.replace(token, "")
    s = _SPACING_WORDS.sub(" ", s)
    s = s.strip().rstrip(".").strip()
    # "x = 5" -> "5" (one variable on the left only: "x + y = 5" is an equation answer).
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)
    unit = _UNIT_AFTER_NUMBER.match(s)
    if unit:
        s = unit.group(1)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^\(([A-Za-z])\)$", r"\1", s)  # "(B)" -> "B"
    s = _brace_shorthand(s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"(^|[^\d.])\.(\d)", r"\g<1>0.\2", s)  # ".5" -> "0.5"
    if re.fullmatch(r"-?\d+\.\d*", s):
        s = s.rstrip("0").rstrip(".") or "0"  # "2.50" -> "2.5", "3.0" -> "3"
    simple_fraction = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if simple_fraction:
        s = f"\\frac{{{simple_fraction.group(1)}}}{{{simple_fraction.group(2)}}}"
    if s == "-0":
        s = "0"
    return s


def _brace_shorthand(s: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1{2} -> \\frac{1}{2}, \\sqrt2 -> \\sqrt{2}."""
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d+|[a-zA-Z])", r"\\sqrt{\1}", s)
    s = re.sub(r"([\^_])\{(\w)\}", r"\1\2", s)  # x^{2} -> x^2
    return s


def as_fraction(s: str) -> Fraction | None:
    """An exact value for a normalised integer, decimal or numeric fraction; None otherwise."""
    if re.fullmatch(r"-?\d+(\.\d+)?", s):
        return Fraction(s)
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}", s)
    if m:
        denominator = Fraction(m.group(3))
        if denominator == 0:
            return None
        value = Fraction(m.group(2)) / denominator
        return -value if m.group(1) else value
    return None


def equivalent(prediction: str, truth: str) -> bool:
    """Whether two answers are the same after normalising (numbers compared exactly)."""
    a, b = normalise(prediction), normalise(truth)
    if a == b:
        return a != ""
    fa, fb = as_fraction(a), as_fraction(b)
    return fa is not None and fb is not None and fa == fb
