"""The ``hf`` engine's fast path: continuous batching over a slot KV cache, with CUDA graphs.

Why each piece (see docs/performance.md for what they buy on an H200):
- One preallocated :class:`~rlcore_rollout_hf.decoder.SlotCache` row per sequence; a decode
  step writes only the new token's entry (:class:`~rlcore_rollout_hf.decoder.SlotDecoder`).
- The whole step -- forward, sampling, stop checks and the bookkeeping of lengths and outputs --
  runs on the device and is captured once per batch bucket as a CUDA graph, so a step costs one
  graph launch instead of about a thousand kernel launches from Python. Random numbers are drawn
  into a fixed buffer before each replay, from the call's own ``torch.Generator``.
- The host looks at the device only every few steps (``sync_every``, or sooner when a sequence
  is due to reach its length limit): then finished rows are collected, the live rows are moved to
  the front so that a smaller graph bucket can run, and free rows are refilled with waiting
  prompts (continuous batching).
- A prompt is prefilled once; its cache rows are copied to its n samples.

Stop strings need the text, so they are checked on the host at each sync; tokens sampled after a
stop string and before the sync are dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlcore.interfaces import Completion, SamplingParams
from rlcore_rollout_hf.decoder import SlotCache, SlotDecoder
from rlcore_rollout_hf.sampling import sample_next, sample_with_uniform
from rlcore_rollout_hf.stopping import StopChecker

# Batch sizes a graph is captured for; a step runs the smallest bucket holding every live row.
_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
# Most prompt tokens (rows x padded width) in one prefill forward pass.
PREFILL_TOKENS = 32768
_ROUND = 128  # cache capacity and output width are rounded up to this, so workspaces get reused


def bucket(count: int, rows: int) -> int:
    """Smallest bucket >= count (beyond 256: the next multiple of 64), at most ``rows``."""
    for size in _BUCKETS:
        if size >= count:
            return min(size, rows)
    return min(-(-count // 64) * 64, rows)


def _round_up(value: int, step: int = _ROUND) -> int:
    return -(-value // step) * step


@dataclass
class Workspace:
    """Device state for up to ``rows`` sequences; graphs capture these tensors' addresses, so
    they are allocated once and only ever written in place."""

    cache: SlotCache
    columns: int
    tokens: torch.Tensor  # [rows] the token each row feeds next
    positions: torch.Tensor  # [rows] that token's position
    lengths: torch.Tensor  # [rows] tokens generated so far
    limits: torch.Tensor  # [rows] most tokens the row may generate
    active: torch.Tensor  # [rows] bool
    uniform: torch.Tensor  # [rows] random draws for the next step
    row_ids: torch.Tensor  # [rows] arange
    out_tokens: torch.Tensor  # [rows, columns]
    out_logprobs: torch.Tensor  # [rows, columns] float32
    graphs: dict = field(default_factory=dict)
    stop_tensors: dict = field(default_factory=dict)  # stop-id set -> its tensor (see stop_tensor)
    pool: Any = None
    signature: tuple = ()

    @property
    def rows(self) -> int:
        return self.cache.rows

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def nbytes(self) -> int:
        tensors = [*self.cache.keys, *self.cache.values, self.out_tokens, self.out_logprobs]
        return sum(t.numel() * t.element_size() for t in tensors)

    def stop_tensor(self, stop_ids: frozenset[int]) -> torch.Tensor:
        """The stop ids on the device, one tensor per set: a captured graph reads its address."""
        key = tuple(sorted(stop_ids))
        if key not in self.stop_tensors:
            self.stop_tensors[key] = torch.tensor(key, dtype=torch.long, device=self.row_ids.device)
        return self.stop_tensors[key]

    def small_state(self) -> list[torch.Tensor]:
        return [self.tokens, self.positions, self.lengths, self.active]

    def move_rows(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Rows ``source`` are copied into rows ``target`` (the two sets disjoint), cache included."""
        for tensor in (*self.small_state(), self.limits, self.out_tokens, self.out_logprobs):
            tensor[target] = tensor[source]
        self.cache.move_rows(source, target)


class FastGenerator:
    """Generates with a :class:`SlotDecoder`; keeps its workspace and graphs between calls."""

    def __init__(
        self,
        decoder: SlotDecoder,
        device: torch.device,
        *,
        max_rows: int,
        cuda_graphs: bool,
        sync_every: int,
        compile: bool = False,
    ):
        self.decoder = decoder
        self.device = device
        self.max_rows = max_rows
        self.use_graphs = cuda_graphs and device.type == "cuda"
        self.sync_every = sync_every
        self.workspace: Workspace | None = None
        self._compiled_sample = None
        if compile:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            decoder.compile_layers(True)
            # Compiled, the float cast, softmax statistics and block sums over the vocabulary are
            # one or two passes over the logits instead of about eight.
            self._compiled_sample = torch.compile(sample_with_uniform, dynamic=False)

    @property
    def compiled(self) -> bool:
        """Whether the decode step runs compiled (false again after a compiler failure)."""
        return self.decoder.compiled

    @property
    def sample(self):
        """The sampling step: compiled exactly when the decode layers are."""
        return self._compiled_sample if self.compiled else sample_with_uniform

    def release(self) -> None:
        """Free the cache, the graphs and the decoder's weight copies (engine sleep)."""
        self.workspace = None
        self.decoder.release()

    # ------------------------------------------------------------------ workspace and graphs

    def _workspace(self, rows: int, capacity: int, columns: int) -> Workspace:
        ws = self.workspace
        if ws is not None and ws.rows >= rows and ws.capacity >= capacity and ws.columns >= columns:
            signature = self.decoder.parameters_signature() if self.use_graphs else ()
            if signature != ws.signature:
                ws.graphs.clear()
                ws.signature = signature
            return ws
        if ws is not None:
            rows, capacity, columns = max(rows, ws.rows), max(capacity, ws.capacity), max(columns, ws.columns)
        self.workspace = None  # free the old one before allocating
        device = self.device
        long = dict(dtype=torch.long, device=device)
        ws = Workspace(
            cache=self.decoder.new_cache(rows, capacity),
            columns=columns,
            tokens=torch.zeros(rows, **long),
            positions=torch.zeros(rows, **long),
            lengths=torch.zeros(rows, **long),
            limits=torch.zeros(rows, **long),
            active=torch.zeros(rows, dtype=torch.bool, device=device),
            uniform=torch.zeros(rows, dtype=torch.float32, device=device),
            row_ids=torch.arange(rows, device=device),
            out_tokens=torch.zeros((rows, columns), **long),
            out_logprobs=torch.zeros((rows, columns), dtype=torch.float32, device=device),
            pool=torch.cuda.graph_pool_handle() if self.use_graphs else None,
            signature=self.decoder.parameters_signature() if self.use_graphs else (),
        )
        self.workspace = ws
        return ws

    def _step(
        self, ws: Workspace, batch: int, temperature: float, top_k: int, top_p: float, stop: torch.Tensor
    ) -> None:
        """One decode step for rows [0, batch): everything in place, nothing read back."""
        logits = self.decoder.decode(ws.cache, ws.tokens[:batch], ws.positions[:batch])
        uniform = ws.uniform[:batch] if temperature else None
        chosen, logprobs = self.sample(logits, temperature, top_k, top_p, uniform)
        active = ws.active[:batch]
        rows = ws.row_ids[:batch]
        column = ws.lengths[:batch].clamp(max=ws.columns - 1)
        ws.out_tokens[rows, column] = torch.where(active, chosen, ws.out_tokens[rows, column])
        ws.out_logprobs[rows, column] = torch.where(active, logprobs, ws.out_logprobs[rows, column])
        advance = active.long()
        ws.lengths[:batch] += advance
        ws.positions[:batch] += advance
        ws.tokens[:batch] = chosen
        still = active & ~torch.isin(chosen, stop) & (ws.lengths[:batch] < ws.limits[:batch])
        ws.active[:batch] = still

    def safely(self, fn, *args):
        """``fn(*args)``; if the compiled layers fail to compile, fall back to uncompiled ones and
        run it again (a compilation fails before its layer writes anything, and a decode step or a
        prefill rewrites whatever it had written)."""
        if not self.compiled:
            return fn(*args)
        try:
            return fn(*args)
        except Exception as error:  # noqa: BLE001 -- any compiler failure; the eager layers are equivalent
            from loguru import logger

            logger.warning(
                f"hf engine: torch.compile of the decode layers failed, running them uncompiled: {error}"
            )
            self.decoder.compile_layers(False)
            return fn(*args)

    def _runner(self, ws: Workspace, batch: int, params: SamplingParams, stop_ids: frozenset[int]):
        key = (batch, params.temperature, params.top_k, params.top_p, tuple(sorted(stop_ids)))
        stop = ws.stop_tensor(stop_ids)
        args = (ws, batch, params.temperature, params.top_k, params.top_p, stop)
        if not self.use_graphs:
            return lambda: self.safely(self._step, *args)
        graph = ws.graphs.get(key)
        if graph is None:
            # A warm-up step initialises lazily created library state; it really runs, so the
            # small state is restored afterwards (the cache and output entries it wrote are
            # written again, identically placed, by the replay).
            saved = [t.clone() for t in ws.small_state()]
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.safely(self._step, *args)
            torch.cuda.current_stream(self.device).wait_stream(side)
            for tensor, value in zip(ws.small_state(), saved):
                tensor.copy_(value)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=ws.pool):
                self._step(*args)
            ws.graphs[key] = graph
        return graph.replay

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompts: Sequence[list[int]],
        groups: Sequence[int],
        limits: Sequence[int],
        params: SamplingParams,
        stop_ids: frozenset[int],
        generator: torch.Generator,
        tokenizer: Any,
        share_prefill: bool,
    ) -> list[Completion]:
        """One completion per entry of ``prompts``; entries with the same ``groups`` value share a
        prompt (and, with ``share_prefill``, its prefill)."""
        self.decoder.refresh()  # before the workspace: its graphs check the copies' addresses
        total = len(prompts)
        rows = bucket(min(total, self.max_rows), self.max_rows)
        capacity = _round_up(max(len(p) + limit for p, limit in zip(prompts, limits)))
        columns = _round_up(max(limits))
        ws = self._workspace(rows, capacity, columns)
        ws.active.zero_()
        run = _Run(self, ws, prompts, groups, limits, params, stop_ids, generator, tokenizer, share_prefill)
        return run.go()


class _Run:
    """The host side of one ``generate`` call: which request sits in which row, and when to look."""

    def __init__(
        self,
        owner: FastGenerator,
        ws: Workspace,
        prompts,
        groups,
        limits,
        params,
        stop_ids,
        generator,
        tokenizer,
        share_prefill,
    ):
        self.owner, self.ws = owner, ws
        self.prompts, self.limits, self.params = prompts, list(limits), params
        self.stop_ids, self.generator, self.share_prefill = stop_ids, generator, share_prefill
        self.device = owner.device
        self.results: list[Completion | None] = [None] * len(prompts)
        self.row_request: list[int] = []  # row -> request index, for rows [0, len)
        self.row_length: list[int] = []  # host copy of lengths for those rows, as of the last sync
        self.checkers = (
            [StopChecker(frozenset(), params.stop, tokenizer) for _ in prompts] if params.stop else None
        )
        self.checked = [0] * len(prompts)  # tokens of each request already fed to its checker
        self.string_stopped: set[int] = set()
        # Requests of one prompt enter together (so that its prefill is shared).
        order: dict[int, list[int]] = {}
        for index, group in enumerate(groups):
            order.setdefault(group, []).append(index)
        self.pending = deque(order.values())

    def go(self) -> list[Completion]:
        self._admit()
        while self.row_request:
            batch = bucket(len(self.row_request), self.ws.rows)
            step = self.owner._runner(self.ws, batch, self.params, self.stop_ids)
            for _ in range(self._steps_until_look()):
                if self.params.temperature:
                    torch.rand(self.ws.rows, generator=self.generator, out=self.ws.uniform)
                step()
            self._look()
        return self.results  # type: ignore[return-value]

    def _steps_until_look(self) -> int:
        """Look every ``sync_every`` steps, and no later than the step by which every live row
        has reached its length limit (rows stop themselves on the device; looking is only for
        collecting, compacting and refilling)."""
        last = max(self.limits[r] - n for r, n in zip(self.row_request, self.row_length))
        return max(1, min(self.owner.sync_every, last))

    def _look(self) -> None:
        ws = self.ws
        live = len(self.row_request)
        state = torch.stack([ws.active[:live].long(), ws.lengths[:live]]).tolist()
        active, lengths = state
        if self.checkers is not None:
            self._check_stop_strings(active, lengths)
        self.row_length = lengths
        finished = [row for row in range(live) if not active[row]]
        if finished:
            self._collect(finished, lengths)
        keep = [row for row in range(live) if active[row]]
        if len(keep) < live:
            self._compact(keep)
        free = ws.rows - len(self.row_request)
        if self.pending and (not self.row_request or free >= max(1, ws.rows // 4)):
            self._admit()

    def _check_stop_strings(self, active: list[int], lengths: list[int]) -> None:
        """Feed new tokens to the host stop-string checkers; cut rows whose string appeared."""
        ws = self.ws
        start = min(self.checked[r] for r in self.row_request)
        end = max(lengths)
        new = ws.out_tokens[: len(self.row_request), start:end].tolist()
        for row, request in enumerate(self.row_request):
            checker = self.checkers[request]
            for position in range(self.checked[request], lengths[row]):
                if checker.push(new[row][position - start]):
                    lengths[row] = position + 1
                    active[row] = 0
                    ws.lengths[row] = position + 1
                    ws.active[row] = False
                    self.string_stopped.add(request)
                    break
            self.checked[request] = lengths[row]

    def _collect(self, rows: list[int], lengths: list[int]) -> None:
        ws = self.ws
        index = torch.tensor(rows, device=self.device)
        width = max(lengths[r] for r in rows)
        tokens = ws.out_tokens[index, :width].tolist()
        logprobs = ws.out_logprobs[index, :width].tolist()
        for i, row in enumerate(rows):
            request, length = self.row_request[row], lengths[row]
            ids = tokens[i][:length]
            stopped = ids[-1] in self.stop_ids or request in self.string_stopped
            self.results[request] = Completion(
                token_ids=ids, logprobs=logprobs[i][:length], finish_reason="stop" if stopped else "length"
            )

    def _compact(self, keep: list[int]) -> None:
        """Make the live rows ``keep`` rows 0..len(keep)-1; the rows after them become free.

        Only the live rows beyond that range move, each into a finished row's place below it, so
        a look copies as many cache rows as have finished rather than every live one (at 7B, 256
        rows, moving all of them cost milliseconds a look). Row order carries no meaning."""
        ws = self.ws
        count = len(keep)
        kept = set(keep)
        holes = [row for row in range(count) if row not in kept]
        movers = [row for row in keep if row >= count]  # as many as holes
        if holes:
            ws.move_rows(torch.tensor(movers, device=self.device), torch.tensor(holes, device=self.device))
        ws.active[count:] = False
        for hole, mover in zip(holes, movers):
            self.row_request[hole] = self.row_request[mover]
            self.row_length[hole] = self.row_length[mover]
        del self.row_request[count:], self.row_length[count:]

    def _admit(self) -> None:
        """Prefill waiting prompts into the free rows after the live ones and sample their first token."""
        ws = self.ws
        first_row = len(self.row_request)
        chosen: list[list[int]] = []
        free = ws.rows - first_row
        while self.pending and len(self.pending[0]) <= free:
            group = self.pending.popleft()
            chosen.append(group)
            free -= len(group)
        if not chosen and self.pending:  # a group wider than the workspace: admit part of it
            group = self.pending[0]
            chosen.append(group[:free])
            self.pending[0] = group[free:]
        requests = [r for group in chosen for r in group]
        if not requests:
            return
        rows = list(range(first_row, first_row + len(requests)))
        # Prefill one row per prompt (or per request without sharing), then copy to the siblings.
        sources: list[int] = []  # per request: the row whose prefill it uses
        prefill_rows: list[int] = []
        at = 0
        for group in chosen:
            if self.share_prefill:
                prefill_rows.append(rows[at])
                sources.extend([rows[at]] * len(group))
            else:
                prefill_rows.extend(rows[at : at + len(group)])
                sources.extend(rows[at : at + len(group)])
            at += len(group)
        row_prompt = dict(zip(rows, (self.prompts[r] for r in requests)))
        logits = self._prefill(prefill_rows, [row_prompt[row] for row in prefill_rows])
        by_row = dict(zip(prefill_rows, range(len(prefill_rows))))
        copies = [(s, t) for s, t in zip(sources, rows) if s != t]
        if copies:
            width = max(len(row_prompt[s]) for s, _ in copies)
            src = torch.tensor([s for s, _ in copies], device=self.device)
            dst = torch.tensor([t for _, t in copies], device=self.device)
            ws.cache.copy_rows(src, dst, width)
        logits = logits[torch.tensor([by_row[s] for s in sources], device=self.device)]
        p = self.params
        token, logprob = sample_next(logits, p.temperature, p.top_k, p.top_p, self.generator)
        index = torch.tensor(rows, device=self.device)
        limits = torch.tensor([self.limits[r] for r in requests], device=self.device)
        ws.tokens[index] = token
        ws.positions[index] = torch.tensor([len(self.prompts[r]) for r in requests], device=self.device)
        ws.lengths[index] = 1
        ws.limits[index] = limits
        ws.out_tokens[index, 0] = token
        ws.out_logprobs[index, 0] = logprob.float()
        ws.active[index] = ~torch.isin(token, ws.stop_tensor(self.stop_ids)) & (limits > 1)
        self.row_request.extend(requests)
        self.row_length.extend([1] * len(requests))
        for r in requests:
            self.checked[r] = 0

    def _prefill(self, rows: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Next-token logits [len(rows), vocab] after each prompt, prefilled into its row;
        prompts go in length order, in passes of at most PREFILL_TOKENS padded tokens."""
        order = sorted(range(len(rows)), key=lambda i: len(prompts[i]))
        out: list[torch.Tensor | None] = [None] * len(rows)
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(prompts[order[end]]) <= PREFILL_TOKENS:
                end += 1
            part = order[start:end]
            width = max(len(prompts[i]) for i in part)
            ids = torch.zeros((len(part), width), dtype=torch.long)
            for j, i in enumerate(part):
                ids[j, : len(prompts[i])] = torch.tensor(prompts[i])
            lengths = torch.tensor([len(prompts[i]) for i in part])
            target = torch.tensor([rows[i] for i in part])
            logits = self.owner.safely(
                self.owner.decoder.prefill,
                self.ws.cache,
                ids.to(self.device),
                lengths.to(self.device),
                target.to(self.device),
            )
            for j, i in enumerate(part):
                out[i] = logits[j]
            start = end
        return torch.stack(out)  # type: ignore[arg-type]
