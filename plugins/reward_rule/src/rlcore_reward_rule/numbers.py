"""Finding and comparing plain numbers in model output (shared by the gsm8k and math rewards)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

# Thousands separators only where they are well formed ("1,000", not "1,2"), so a list like
# "1,2,3" reads as three numbers.
NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(NUMBER)
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\uff0d": "-"})


def numbers_in(text: str) -> list[str]:
    """Every number in ``text``, in order, cleaned of thousands separators."""
    return [clean_number(m) for m in _NUMBER_RE.findall(text.translate(_MINUS_SIGNS))]


def clean_number(text: str) -> str:
    return text.replace(",", "").strip()


def as_decimal(value: Any) -> Decimal | None:
    """A number given as int, float or text ("1,234", "$5", "7.50") as an exact Decimal, else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    text = str(value).translate(_MINUS_SIGNS).strip().replace("$", "").replace(" ", "")
    if not re.fullmatch(NUMBER, text):
        return None
    try:
        return Decimal(clean_number(text))
    except InvalidOperation:
        return None


def same_number(answer: str | None, truth: Any) -> bool:
    """Numeric equality when both are numbers ("18.00" equals "18"), text equality otherwise."""
    if answer is None:
        return False
    a, b = as_decimal(answer), as_decimal(truth)
    if a is not None and b is not None:
        return a == b
    return str(answer).strip() == str(truth).strip()
