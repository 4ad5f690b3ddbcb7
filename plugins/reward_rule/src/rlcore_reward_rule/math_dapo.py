"""The ``math_dapo`` reward: verl's scorer for DAPO-Math-17k, AIME and ``data_source = "math"``
(``verl.utils.reward_score.math_dapo``), exactly.

Of the response's last 300 characters, the text after the last ``Answer:`` (any case, spaces
around the colon, up to the end of its line) is the answer. It and the ground truth are
normalised as in Minerva (Lewkowycz et al., 2022: the part after the last ``=``, spaces, units
and ``\\text{}`` dropped, ``\\frac12`` written out, a comma-grouped integer without its commas),
and must be equal as text. A correct answer scores +1, anything else -1 (no answer included); the
``acc`` metric is 1 or 0, as verl's ``acc`` field, which DAPO's dynamic sampling filters on.

``strict_box_verify = true`` is verl's other mode: the content of the last ``\\boxed{...}`` of
the response's last 100 characters must equal the ground truth exactly, without normalising.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rlcore.interfaces import Prompt, RewardInput, RewardResult
from rlcore_reward_rule.options import MathDapoOptions
from rlcore_reward_rule.truths import refuse_uncomparable

_WINDOW = 300  # verl scores the last 300 characters ("the longest answer in MATH-500 has 159")
_BOX_WINDOW = 100  # strict_box_verify looks at the last 100 of those
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_NO_ANSWER = "[INVALID]"  # what verl normalises when the response has no "Answer:"

# Minerva's normalisation, step by step, in the order it applies them.
# 1. Plain replacements (articles, dollar signs, spaces, "and" written as text).
_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# 2. Units, filler words and spacing commands, removed wherever they occur.
_DROP = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
# 3. Regular-expression rewrites: the first $...$ span, text-like wrappers, brace shorthand.
_REWRITE = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),  # \frac12 -> \frac{1}{2}
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),  # \sqrt2 -> \sqrt{2}
)


def normalise(answer: str) -> str:
    """Minerva's canonical text of a final answer (see the module docstring)."""
    text = answer.split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for word in _DROP:
        text = text.replace(word, "")
    for pattern, replacement in _REWRITE:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def extract_answer(response: str) -> str | None:
    """The text after the response's last ``Answer:`` (within its last 300 characters), or None."""
    found = _ANSWER.findall(response[-_WINDOW:])
    return found[-1] if found else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces counted, escaped or not, as verl does);
    None when there is none or it never closes."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None


class MathDapoReward:
    required_fields = frozenset({"ground_truth"})

    def __init__(self, options: MathDapoOptions) -> None:
        self.options = options

    def judge(self, response: str, truth: object) -> tuple[bool, bool]:
        """(correct, an answer was found). A ground truth that is not text is compared by its text
        (verl's scorer fails on one)."""
        truth_text = truth if isinstance(truth, str) else str(truth)
        tail = response[-_WINDOW:]
        if self.options.strict_box_verify:
            answer = last_boxed(tail[-_BOX_WINDOW:])
            return answer is not None and answer == truth_text, answer is not None
        answer = extract_answer(tail)
        return normalise(_NO_ANSWER if answer is None else answer) == normalise(
            truth_text
        ), answer is not None

    def __call__(self, item: RewardInput) -> RewardResult:
        correct, found = self.judge(item.response or "", item.ground_truth)
        score = self.options.correct_score if correct else self.options.incorrect_score
        return RewardResult(score, {"acc": float(correct), "answer_found": float(found)})

    def check_data(self, prompts: Sequence[Prompt], source_name: str) -> None:
        """Refuse ground truths this reward can never compare (see :mod:`rlcore_reward_rule.truths`)."""
        refuse_uncomparable(prompts, source_name, "math_dapo", lists=False)


def build(options: MathDapoOptions, context: object = None) -> MathDapoReward:
    return MathDapoReward(options)
