"""lm-evaluation-harness on rlcore's policy: an ``lm_eval`` model whose requests go to the run's
engine (``generate_until``) and actor (``loglikelihood``), token in and token out.

Text becomes tokens here, as lm-eval's own Hugging Face model does it: a continuation's tokens are
those of context + continuation after the context's (so a word boundary tokenizes as it would in
running text), trailing spaces of a context move to the continuation, and rolling log-likelihoods
go over windows of the model's length. Generation is greedy unless the task asks to sample.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lm_eval.api.model import LM

from rlcore.errors import UsageError, did_you_mean
from rlcore.interfaces import EvalPolicy, SamplingParams


class RlcoreLM(LM):
    """An lm-eval model over an :class:`rlcore.interfaces.EvalPolicy`."""

    def __init__(
        self, policy: EvalPolicy, *, batch_size: int = 32, max_gen_toks: int = 256, seed: int = 0
    ) -> None:
        super().__init__()
        self.policy = policy
        self.tok = policy.tokenizer
        self.batch_size = batch_size
        self.max_gen_toks = max_gen_toks
        self.seed = seed
        self.eos = self.tok.eos_token_id
        self.prefix_token = self.eos if self.eos is not None else (self.tok.bos_token_id or 0)

    # ------------------------------------------------------------------ text and tokens

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if not context:
            return [self.prefix_token], self.encode(continuation)
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation)
        head = self.encode(context)
        return head, whole[len(head) :]

    # ------------------------------------------------------------------ lm-eval's requests

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self._pair(*r.args) for r in requests]
        out = self.policy.loglikelihood(pairs)
        for request, value in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", request.args, value)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        totals = []
        for request in requests:
            (text,) = request.args
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    self.encode(text), self.prefix_token, self.policy.max_length, 1
                )
            ]
            total = sum(logp for logp, _ in self.policy.loglikelihood(windows)) if windows else 0.0
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            totals.append(total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):  # requests sharing their settings go to the engine together
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(i)
        for indices in groups.values():
            kwargs = dict(requests[indices[0]].args[1] or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            sample = bool(kwargs.pop("do_sample", False))
            temperature = float(kwargs.pop("temperature", 0.0)) if sample else 0.0
            params = SamplingParams(
                n=1,
                temperature=temperature,
                max_new_tokens=max_new,
                top_p=float(kwargs.pop("top_p", 1.0) or 1.0),
                stop=until,
                stop_token_ids=[self.eos] if self.eos is not None else [],
                seed=self.seed,
            )
            room = max(1, self.policy.max_length - max_new)
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                prompts = [self.encode(requests[i].args[0])[-room:] for i in chunk]
                for i, ids in zip(chunk, self.policy.generate(prompts, params)):
                    text = self.tok.decode(ids, skip_special_tokens=True)
                    for stop in until:  # the stop string is not part of the answer
                        if stop and stop in text:
                            text = text.split(stop)[0]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------------ chat templates

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "name_or_path", "rlcore")).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tok, "chat_template", None) or ""

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.tok.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )


class LmEvalHarness:
    """``rlcore eval --harness lm_eval``: the tasks are checked when the harness is built (before any
    model loads); ``run`` evaluates and writes lm-eval's results and samples."""

    def __init__(self, options: Any) -> None:
        from lm_eval.tasks import TaskManager

        self.options = options
        include = options.include_path
        if include is not None and not Path(include).is_dir():
            raise UsageError(f"--harness-option include_path: {include!r} is not a directory of task YAMLs")
        if include is None and not options.include_defaults:
            raise UsageError(
                "--harness-option include_defaults=false needs include_path (a directory of task YAMLs)"
            )
        self.tasks = TaskManager(include_path=include, include_defaults=options.include_defaults)
        known = set(self.tasks.all_tasks)  # tasks, groups and tags
        missing = [t for t in options.tasks if t not in known]
        if missing:
            hints = [
                f"{t!r}" + (f" (did you mean {h!r}?)" if (h := did_you_mean(t, known)) else "")
                for t in missing
            ]
            raise UsageError(
                f"--tasks: lm-eval knows no task {', '.join(hints)}; it has {len(known)} tasks and groups "
                f"(`lm-eval ls tasks` lists them)"
                + ("" if include else "; give your own with --harness-option include_path=DIR")
            )

    def run(self, policy: EvalPolicy, output_dir: str) -> dict[str, Any]:
        import lm_eval
        from lm_eval.utils import make_table

        o = self.options
        model = RlcoreLM(policy, batch_size=o.batch_size, max_gen_toks=o.max_gen_toks, seed=o.seed)
        limit = None if o.limit is None else (int(o.limit) if o.limit >= 1 else o.limit)
        results = lm_eval.simple_evaluate(
            model=model,
            tasks=list(o.tasks),
            num_fewshot=o.num_fewshot,
            limit=limit,
            task_manager=self.tasks,
            log_samples=o.log_samples,
            apply_chat_template=o.apply_chat_template,
            fewshot_as_multiturn=o.fewshot_as_multiturn and o.apply_chat_template,
            system_instruction=o.system_instruction,
            random_seed=o.seed,
            numpy_random_seed=o.seed,
            torch_random_seed=o.seed,
            fewshot_random_seed=o.seed,
            confirm_run_unsafe_code=o.confirm_run_unsafe_code,
            metadata=o.metadata or None,
            bootstrap_iters=0,
        )
        out = Path(output_dir)
        samples = results.pop("samples", None) or {}
        for task, rows in samples.items():
            with open(out / f"samples_{task}.jsonl", "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, default=str) + "\n")
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
        table = make_table(results)
        if results.get("groups"):
            table += "\n" + make_table(results, "groups")
        return {
            "tasks": list(o.tasks),
            "results": results.get("results", {}),
            "n-shot": results.get("n-shot", {}),
            "versions": results.get("versions", {}),
            "lm_eval_version": lm_eval.__version__,
            "table": table,
        }


def build(options: Any, context: Any = None) -> LmEvalHarness:
    return LmEvalHarness(options)
