"""Grammar-constrained decoding that stays lossless under speculation (issue 42).

A request's grammar (JSON schema, regex, choice, tool calls) masks the target's distribution at
every position: tokens the grammar forbids get probability 0. Under speculation the target scores
a whole block in one pass, so the mask of block position t is the grammar's state after the anchor
and drafts 1..t: the matcher walks the drafts ahead (`fill_block`), filling one mask per position,
then rolls back. Verification then runs on the masked logits, unchanged: a draft the grammar
forbids has target probability 0 and is rejected there; the bonus (or correction) token is drawn
from the masked distribution. What is committed is exactly what the target decoding one token at a
time under the same mask would give (greedy), or its distribution (sampling). The matcher advances
over committed tokens only (`catch_up`). Greedy drafts follow the grammar too (`DraftConstraint`):
the target would reject the others anyway, and masking the drafter's logits costs no extra pass.

The engine is xgrammar (the `grammar` extra): it ships the tool-call formats of the families we
serve (structural tags for Qwen/Hermes, Llama, Harmony) and fills masks about as fast as llguidance
on the demo vocabulary and plain schemas; a length-bounded string at Qwen3's vocabulary size costs
it ~10x more (benchmarks/bench_grammar.py, RESULTS.md).
Masks are filled on the host and applied to the verify logits by xgrammar's kernel where they are (runtime/base.py `target_verify`);
runtimes whose target verifies inside its graph or engine cannot take them and refuse such requests.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from trtllm_dflash.contracts.grammar_spec import GrammarSpec
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import require

PURPOSE = "grammar-constrained decoding: JSON schemas, regular expressions, tool calls"


class GrammarError(DFlashError):
    """A grammar that cannot be compiled (a malformed schema, an invalid regex)."""


class GrammarCompiler:
    """Compiles GrammarSpecs for one target's tokenizer; the same grammar compiles once (cached)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int] = ()) -> None:
        xgr = require("xgrammar", purpose=PURPOSE)
        stops = list(stop_token_ids) or None
        self._info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stops)
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=1)
        self.vocab_size = vocab_size

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar; GrammarError names what is wrong with the spec."""
        try:
            spec.check()
            if spec.kind in ("json_object", "json_schema"):  # json_object: OpenAI's "any JSON object"
                schema = spec.value if spec.kind == "json_schema" else '{"type": "object"}'
                # JSON as json.dumps writes it: free whitespace lets a model pad its answer with
                # newlines the grammar cannot end (seen on the demo pair)
                return self._compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=True)
            if spec.kind == "regex":
                return self._compiler.compile_regex(spec.value)
            if spec.kind == "choice":
                return self._compiler.compile_regex(_choice_regex(spec.value))
            if spec.kind == "tool_calls":
                return self._compiler.compile_structural_tag(_tool_call_tag(spec.value))
            return self._compiler.compile_structural_tag(spec.value)
        except GrammarError:
            raise
        except (ValueError, RuntimeError, TypeError, KeyError) as exc:  # xgrammar's errors for bad schemas, regexes and tags
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GrammarError(
                f"the {spec.kind} grammar cannot be compiled: {first[:300]}", f"send a valid {spec.kind.replace('_', ' ')}"
            ) from None

    def state(self, spec: GrammarSpec) -> "GrammarState":
        """A new matcher for one request."""
        return GrammarState(self.compile(spec), self.vocab_size)


class GrammarState:
    """One request's place in its grammar: masks for a block, advanced over what is committed."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        xgr = require("xgrammar", purpose=PURPOSE)
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.consumed = 0  # tokens of the request's output the matcher has accepted
        # this step's greedy drafts and the masks DraftConstraint filled for them (at `consumed`): the
        # verify pass's masks at the same positions, which fill_block takes instead of filling them again
        self.drafted: tuple[int, list[int], Any] | None = None

    @property
    def terminated(self) -> bool:
        """The grammar's end of sequence has been accepted: nothing may follow."""
        return self.matcher.is_terminated()

    def catch_up(self, tokens: Sequence[int]) -> None:
        """Accept the output tokens not seen yet (committed by earlier steps)."""
        for token in tokens[self.consumed :]:
            if self.terminated:
                break
            if not self.matcher.accept_token(int(token)):  # the masks make this impossible: a bug, not bad input
                raise RuntimeError(f"the grammar rejected committed token {token} at output position {self.consumed}")
            self.consumed += 1

    def fill_block(self, bitmask: Any, first: int, drafts: Sequence[int], count: int) -> None:
        """Masks for block positions 0..count-1 into bitmask rows first..first+count-1: position t
        after drafts[:t]. Past a draft the grammar forbids (the target rejects it there) or past the
        grammar's end, rows stay all-allowed: nothing after them is committed. Masks DraftConstraint
        filled for these very drafts are copied, not filled again."""
        reused = self._drafted_masks(drafts, count)
        if reused is not None:
            bitmask[first : first + len(reused)] = reused
        start = 0 if reused is None else len(reused)
        if start == count:
            return
        walked = 0
        for t in range(count):
            if self.terminated:
                break
            if t >= start:
                self.matcher.fill_next_token_bitmask(bitmask, first + t)
            if t == count - 1 or not self.matcher.accept_token(int(drafts[t])):
                break
            walked += 1
        if walked:
            self.matcher.rollback(walked)

    def _drafted_masks(self, drafts: Sequence[int], count: int) -> Any:
        """The masks of block positions 0..n-1 DraftConstraint filled this step, if it drafted exactly
        `drafts[:n]` from the matcher's present state; None otherwise (they are used once)."""
        drafted, self.drafted = self.drafted, None
        if drafted is None or drafted[0] != self.consumed:
            return None
        tokens, masks = drafted[1], drafted[2]
        n = min(len(tokens), count)
        return masks[:n] if n and [int(d) for d in drafts[:n]] == tokens[:n] else None


@dataclasses.dataclass
class BlockMasks:
    """A step's grammar masks, packed as xgrammar fills them: bitmask row r * count + t is batch row
    r's mask at block position t; only the rows in `rows` are filled (and applied)."""

    bitmask: Any  # int32 [b * count, ceil(vocab / 32)], on the host
    rows: list[int]
    count: int
    vocab_size: int

    def apply(self, logits: Any) -> Any:
        """Forbidden tokens of `logits` ([b, count, V], or [b, V] at count 1) set to -inf, in place
        (xgrammar's kernel: on the device the logits are on); returns the logits."""
        import torch

        xgr = require("xgrammar", purpose=PURPOSE)
        logits = logits.contiguous()
        flat = logits.view(-1, logits.shape[-1])
        indices = [r * self.count + t for r in self.rows for t in range(self.count)]
        with torch.inference_mode():  # the logits of an inference-mode pass may only be changed in one
            xgr.apply_token_bitmask_inplace(flat, self.bitmask.to(flat.device), vocab_size=self.vocab_size, indices=indices)
        return logits

    def select_rows(self, rows: slice) -> "BlockMasks":
        """The masks of batch rows `rows` (a runtime that runs a batch in parts)."""
        start, stop = rows.start or 0, rows.stop
        return BlockMasks(
            self.bitmask[start * self.count : stop * self.count],
            [r - start for r in self.rows if start <= r < stop],
            self.count,
            self.vocab_size,
        )


@dataclasses.dataclass
class DraftConstraint:
    """Greedy drafts that follow the grammar: a DFlash drafter proposes its whole block in one pass,
    so its logits at position t are masked with the grammar's state after the anchor and the drafts
    before t, each draft the argmax of its masked logits (host-side, one position after another).
    The drafter pays nothing more; drafts the grammar forbids, which the target rejects anyway,
    are never proposed (the demo pair's tau under a JSON schema: bench_grammar.py). Rows that
    sample keep their unconstrained q (their drafts are drawn after this, by the head)."""

    states: list[GrammarState | None]  # per batch row, None: leave the row alone

    def __call__(self, logits: Any) -> Any:
        import torch

        xgr = require("xgrammar", purpose=PURPOSE)
        logits = logits.clone()
        for row, state in enumerate(self.states):
            if state is None:
                continue
            masks, tokens = xgr.allocate_token_bitmask(logits.shape[1], logits.shape[-1]), []
            for t in range(logits.shape[1]):
                if state.terminated:
                    break
                state.matcher.fill_next_token_bitmask(masks, t)
                with torch.inference_mode():
                    xgr.apply_token_bitmask_inplace(logits[row, t : t + 1], masks[t : t + 1].to(logits.device), vocab_size=state.vocab_size)
                token = int(logits[row, t].argmax())
                if not state.matcher.accept_token(token):
                    break
                tokens.append(token)
            if tokens:
                state.matcher.rollback(len(tokens))
            state.drafted = (state.consumed, tokens, masks)  # the verify pass's masks at positions 0..len(tokens)-1
        return logits

    def select_rows(self, rows: slice) -> "DraftConstraint":
        return DraftConstraint(self.states[rows])


def draft_constraint(states: Sequence[GrammarState | None], greedy: Sequence[bool] | None) -> DraftConstraint | None:
    """The constraint for a step's greedy rows with a grammar; None when there are none."""
    chosen = [s if s is not None and greedy is not None and greedy[i] else None for i, s in enumerate(states)]
    return DraftConstraint(chosen) if any(s is not None for s in chosen) else None


def block_masks(states: Sequence[GrammarState | None], blocks: Sequence[Sequence[int]], count: int, vocab_size: int) -> BlockMasks | None:
    """The masks of a step whose rows verify block `blocks[r]` (anchor first) at `count` positions;
    rows without a grammar are left alone. None when no row has a grammar."""
    rows = [row for row, state in enumerate(states) if state is not None]
    if not rows:
        return None
    xgr = require("xgrammar", purpose=PURPOSE)
    bitmask = xgr.allocate_token_bitmask(len(states) * count, vocab_size)  # all allowed
    for row in rows:
        states[row].fill_block(bitmask, row * count, blocks[row][1:], count)
    return BlockMasks(bitmask, rows, count, vocab_size)


def _tool_call_tag(value: str) -> Any:
    """xgrammar's structural tag for the tools of a `tool_calls` spec, in its family's call format:
    text or calls ("auto"), at least one call ("required"), or the named one. No reasoning block."""
    xgr = require("xgrammar", purpose=PURPOSE)
    ask = json.loads(value)
    # at most one whitespace character between JSON tokens, as in json_schema (free whitespace let the
    # demo model pad a call with newlines until max_tokens)
    return xgr.get_model_structural_tag(
        ask["format"],
        tools=ask["tools"],
        tool_choice=ask.get("tool_choice", "auto"),
        reasoning="disabled",
        max_whitespace_cnt=1,
        parallel_tool_calls=ask.get("parallel", True),
    )


def _choice_regex(value: str) -> str:
    """A regex that matches exactly one of the JSON list of strings `value` (vLLM's guided_choice);
    regex syntax characters are escaped, nothing else (xgrammar warns on `\\ `)."""
    import re

    try:
        choices = json.loads(value)
    except json.JSONDecodeError:
        choices = None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError("choice must be a non-empty list of non-empty strings", 'send e.g. ["yes", "no"]')
    return "(" + "|".join(re.sub(r"([\\.^$|?*+()\[\]{}/-])", r"\\\1", c) for c in choices) + ")"
