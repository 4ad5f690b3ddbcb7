"""Per-sample stop conditions: stop token ids and stop strings, checked one token at a time.

Stop strings are matched against the response text (the response tokens decoded on their own,
special tokens skipped), which is decoded incrementally: each step decodes only a short window
of recent tokens, so a step costs the same at token 5 and at token 500. A response ends right
after the token that completes a stop string; since tokens are not split, that token's text may
run past the stop string.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

_REPLACEMENT = "\ufffd"  # what decode yields for an unfinished multi-byte character


class IncrementalText:
    """The decoded text of a growing token sequence, updated in O(1) decode calls per token.

    It keeps two offsets into the ids: text before ``prefix`` is final; ``[prefix, read)`` is
    the context used to decode the next tokens the way a full decode would (leading spaces,
    merges). New text is released only once it no longer ends in an unfinished character.
    """

    __slots__ = ("tokenizer", "ids", "prefix", "read", "text")

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Append one token; return the text it completed (possibly empty)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            new = after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            self.text += new
            return new
        return ""


class StopChecker:
    """Decides, token by token, whether one sample has finished and why."""

    __slots__ = ("stop_ids", "stops", "longest", "text")

    def __init__(self, stop_ids: frozenset[int], stops: Sequence[str], tokenizer: Any):
        self.stop_ids = stop_ids
        self.stops = tuple(s for s in stops if s)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = IncrementalText(tokenizer) if self.stops else None

    def push(self, token_id: int) -> bool:
        """Return True when ``token_id`` ends the sample (a stop id, or it completes a stop string)."""
        if token_id in self.stop_ids:
            return True
        if self.text is None:
            return False
        new = self.text.push(token_id)
        if not new:
            return False
        # Only a window that contains new text can hold a stop string not seen before.
        window = self.text.text[-(len(new) + self.longest - 1) :]
        return any(s in window for s in self.stops)


def collect_stop_ids(*sources: Any) -> frozenset[int]:
    """Union of token ids from ints, lists of ints and None (tokenizer / generation-config EOS)."""
    ids: set[int] = set()
    for source in sources:
        if source is None:
            continue
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, Iterable):
            ids.update(int(i) for i in source if i is not None)
    return frozenset(ids)
