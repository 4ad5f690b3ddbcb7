"""rlcore.engine_kit.samples: one greedy request copied to n samples, and stop strings cut after
the fact with the run's tokenizer."""

from __future__ import annotations

from rlcore.engine_kit.samples import apply_stop_strings, first_stop, replicate, samples_to_request
from rlcore.interfaces import Completion, SamplingParams


class CharTokenizer:
    """Token id k >= 1 decodes to the k-th letter (1 = a); 0 is a special token (skipped)."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(
            "" if (t == 0 and skip_special_tokens) else "_abcdefghijklmnopqrstuvwxyz"[t] for t in ids
        )


def test_greedy_asks_for_one_sample_and_sampling_for_n():
    assert samples_to_request(SamplingParams(n=4, temperature=0.0)) == 1
    assert samples_to_request(SamplingParams(n=4, temperature=0.7)) == 4


def test_replicate_makes_independent_copies_and_leaves_full_groups_alone():
    one = Completion([1, 2], [-0.5, -0.25], "stop")
    copies = replicate([one], 3)
    assert len(copies) == 3 and all(
        c.token_ids == [1, 2] and c.logprobs == [-0.5, -0.25] and c.finish_reason == "stop" for c in copies
    )
    copies[0].token_ids.append(9)
    assert copies[1].token_ids == [1, 2] and one.token_ids == [1, 2]
    group = [one, Completion([3], [-1.0], "length")]
    assert replicate(group, 2) is group


def test_first_stop_is_the_token_that_completes_the_string():
    tok = CharTokenizer()
    # a b c d e: "cd" is complete at index 3
    assert first_stop([1, 2, 3, 4, 5], ["cd"], tok) == 3
    assert first_stop([1, 2, 3, 4, 5], ["zz", "bc"], tok) == 2
    assert first_stop([1, 2, 3], ["x"], tok) is None
    assert first_stop([1, 2, 3], [], tok) is None
    assert first_stop([2, 0, 3], ["bc"], tok) == 2  # special tokens do not count in the text


def test_apply_stop_strings_cuts_ids_and_logprobs_and_sets_the_reason():
    tok = CharTokenizer()
    hit = Completion([1, 2, 3, 4], [-1.0, -2.0, -3.0, -4.0], "length")
    miss = Completion([5, 6], [-0.1, -0.2], "length")
    cut, kept = apply_stop_strings([hit, miss], ["bc"], tok)
    assert (cut.token_ids, cut.logprobs, cut.finish_reason) == ([1, 2, 3], [-1.0, -2.0, -3.0], "stop")
    assert kept is miss
