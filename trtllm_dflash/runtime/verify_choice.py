"""Which kernels verify a step with sampled rows: one program per position, spread over the
vocabulary, or from a shortlist of the largest logits (issue 39 item 5).

Why: at Qwen3's vocabulary (151,936) the per-position kernels took 4.6 ms for a top-k + top-p step
and 0.67 ms for temperature alone on an H200 (benchmarks/RESULTS.md): one program per (row,
position), 16 programs on 132 SMs at batch 1, each making ~14 serial passes over the vocabulary.
The spread form (`ops/kernels/verify_spread.py`) cuts every pass into chunks of the vocabulary,
many programs per position. The shortlist form (`ops/kernels/verify_shortlist.py`) reads the
logits once for rows with a top-k of at most 64 and works on their kept tokens; its other sampled
rows walk the vocabulary as the per-position kernels do. Where it verifies a step whose sampled
rows all have such a top-k, it draws the drafter's samples too (`samples_drafts`): the tokens and,
to float rounding, the q of `reference.sample_tokens`, which sorts the vocabulary for top-p. All decide exactly what
`reference.verify_block_packed` decides (the same committed counts and tokens,
tests/test_plugin_verify.py), so a choice changes no output (seeded requests reproduce either way),
only time. A step whose rows are all greedy keeps the per-position kernels (a split argmax: 0.02
ms), and so does any step where the host does not know its rows' parameters.

Choices: "positions" (the default until a GPU run has measured the others), "spread", "shortlist",
or "measure": at `allocate`, per batch bucket, each other form is checked against the reference on
a step of mixed rows (greedy, temperature, top-k, top-p), then the forms are timed
(runtime/kernel_choice.py) on the two kinds of sampled step, and the fastest is kept for each:
"top-k" steps, whose sampled rows all have a top-k the shortlist serves (chat models' settings),
and "other" steps, where some sampled row has none (the OpenAI API's default, temperature alone):
there the shortlist would walk the vocabulary per position as the per-position kernels do, so
only those and the spread form are timed. The kernels run on CUDA, or in Triton's interpreter where
TRITON_INTERPRET=1 asks for it; elsewhere "spread" and "shortlist" are refused in one line and
"measure" keeps "positions".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from trtllm_dflash import ops
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.ops import custom_ops, reference
from trtllm_dflash.ops.kernels.tiles import SHORTLIST
from trtllm_dflash.runtime.kernel_choice import bucketed, refusal, time_call

KERNEL_FORMS = ("spread", "shortlist")  # the forms that need the kernels and a check before they run
FORMS = ("positions", *KERNEL_FORMS)
CHOICES = (*FORMS, "measure")
# the kinds of sampled step measured apart, with the forms timed on each and its rows' (temperature, top-k, top-p)
STEP_KINDS = {"top-k": (FORMS, (1.0, 50, 0.9)), "other": (("positions", "spread"), (1.0, 0, 1.0))}
MIXED_ROWS = ((0.0, 0, 1.0), (0.9, 0, 1.0), (1.0, 40, 1.0), (0.8, 0, 0.9), (1.0, 50, 0.9))


def step_kind(sampling) -> str:
    """A sampled step's kind: "top-k" where every sampled row has a top-k the shortlist serves (the
    host's copies say so), else "other"."""
    if sampling.top_ks is None or sampling.greedy is None:
        return "other"
    return "top-k" if all(greedy or 1 <= k <= SHORTLIST for greedy, k in zip(sampling.greedy, sampling.top_ks)) else "other"


def unavailable_reason(device: torch.device) -> str | None:
    """Why the spread and shortlist kernels cannot run on `device` (None: they can)."""
    if not custom_ops.kernels_enabled(device):
        return "the verification kernels run on CUDA (or in Triton's interpreter, TRITON_INTERPRET=1)"
    return None


def packed_verification(form: str) -> Callable[..., torch.Tensor]:
    """The packed `[b, 5]` verification (`launch.verify_block`'s arguments) of a kernel form."""
    from trtllm_dflash.ops.kernels import verify_shortlist_launch, verify_spread_launch  # imports triton: only when used

    return {"spread": verify_spread_launch.verify_block_spread, "shortlist": verify_shortlist_launch.verify_block_shortlist}[form]


def verify_by(form: str, target_logits, block, draft_probs, sampling, starts) -> tuple[torch.Tensor, torch.Tensor]:
    """`CachedRuntime.verify` by a kernel form: accepted draft count and bonus token per row."""
    packed = packed_verification(form)(target_logits, block, draft_probs, *sampling.tensors(), starts)
    return packed[:, 0], packed[:, 1]


def _step_tokens(batch: int, block: int, vocab: int, dtype: torch.dtype, device: torch.device):
    """A verification step's logits, the drafter's logits and the block (random, seeded): drafts
    following the target's argmax for a few positions, then not."""
    g = torch.Generator(device="cpu").manual_seed(batch * 31 + block)
    logits = (torch.randn(batch, block, vocab, generator=g) * 3).to(device, dtype)
    draft_logits = logits[:, 1:].float() + torch.randn(batch, block - 1, vocab, generator=g).to(device)
    tokens = torch.randint(0, vocab, (batch, block), generator=g).to(device)
    argmax = logits.float().argmax(-1)
    for r in range(batch):
        run = r % block
        tokens[r, 1 : 1 + run] = argmax[r, :run]
    return logits, draft_logits, tokens


def _step(step_tokens, rows: tuple[tuple[float, int, float], ...], device: torch.device):
    """The step's inputs with its rows cycling through `rows` (temperature, top-k, top-p): logits,
    block, the drafter's q, (temperature, top-k, top-p, seed), starts."""
    logits, draft_logits, tokens = step_tokens
    batch, block = tokens.shape
    kinds = [rows[r % len(rows)] for r in range(batch)]
    temperature = torch.tensor([t for t, _, _ in kinds], dtype=torch.float32, device=device)
    top_k = torch.tensor([k for _, k, _ in kinds], dtype=torch.int64, device=device)
    top_p = torch.tensor([p for _, _, p in kinds], dtype=torch.float32, device=device)
    seed = torch.arange(batch, dtype=torch.int64, device=device) * 7919 + 3
    starts = torch.arange(batch, dtype=torch.int64, device=device) * 5 + 11
    probs = reference.process_logits(draft_logits, temperature, top_k, top_p) if block > 1 else None
    return logits, tokens, probs, (temperature, top_k, top_p, seed), starts


def sample_drafts_by_shortlist(logits: torch.Tensor, sampling, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's samples and q (`base.sample_drafts`'s) by the shortlist kernels."""
    from trtllm_dflash.ops.kernels.verify_shortlist_launch import sample_drafts_shortlist

    return sample_drafts_shortlist(logits, *sampling.tensors(), positions)


def check(form: str, batch: int, block: int, vocab: int, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why a kernel form does not decide as the reference does here (None: it does, exactly)."""
    return check_forms((form,), batch, block, vocab, dtype, device)[form]


def check_forms(
    forms: tuple[str, ...], batch: int, block: int, vocab: int, dtype: torch.dtype, device: torch.device, step_tokens=None
) -> dict[str, str | None]:
    """`check` for several kernel forms on one mixed step, whose inputs and reference decisions
    are made once (at Qwen3's vocabulary and batch 32 the random logits alone take a second on the
    host; `step_tokens`, from `_step_tokens`, where the caller has them)."""
    reason = unavailable_reason(device)
    if reason is not None:
        return dict.fromkeys(forms, reason)
    logits, tokens, probs, sampling, starts = _step(step_tokens or _step_tokens(batch, block, vocab, dtype, device), MIXED_ROWS, device)
    want = reference.verify_block_packed(logits, tokens, probs, *sampling, starts).cpu()
    reasons: dict[str, str | None] = {}
    for form in forms:
        try:
            got = packed_verification(form)(logits, tokens, probs, *sampling, starts)
        except Exception as error:  # noqa: BLE001 - a kernel that does not compile or launch here is refused, not run
            reasons[form] = f"the {form} kernels failed: {refusal(error)}"
            continue
        reasons[form] = None if torch.equal(got.cpu(), want) else f"the {form} kernels commit other tokens than the reference"
    return reasons


@dataclasses.dataclass(frozen=True)
class VerifyChoice:
    """The form kept for sampled steps of a `kind` (STEP_KINDS), `tokens` block tokens, in batches
    of up to `batch` rows."""

    tokens: int
    batch: int
    chosen: str
    ms: dict[str, float | None]  # per form timed, on a step of this kind (None: refused)
    refused: dict[str, str] = dataclasses.field(default_factory=dict)  # per kernel form not timed: why
    kind: str = "top-k"

    def line(self) -> str:
        times = "; ".join(f"{form} {ms:.4f} ms" for form, ms in self.ms.items() if ms is not None)
        refusals = "".join(f"; {form}: {why}" for form, why in self.refused.items())
        return f"block {self.tokens} b<={self.batch} {self.kind} steps: {self.chosen} ({times}{refusals})"


@dataclasses.dataclass
class VerifyChoices:
    """The verification form of each step: `fixed` for all, or the measured `choices` by (step kind,
    block, smallest batch bucket holding the step's rows), else "positions"."""

    fixed: str | None = "positions"
    choices: tuple[VerifyChoice, ...] = ()

    def pick(self, block: int, batch: int, kind: str = "top-k") -> str:
        if self.fixed is not None:
            return self.fixed
        return bucketed(tuple(c for c in self.choices if c.kind == kind), block, batch, "positions")

    def kernel_form(self, block: torch.Tensor, sampling) -> str | None:
        """The kernel form that verifies this step of `block [b, B]` (None: the per-position kernels)."""
        return self._form(block.shape[0], block.shape[1], sampling)

    def _form(self, batch: int, tokens: int, sampling) -> str | None:
        """The kernel form chosen for steps of `batch` rows and `tokens` block tokens, where some row
        samples (the host's copies say so; unknown rows keep the per-position kernels)."""
        if sampling.greedy is None or all(sampling.greedy):
            return None
        form = self.pick(tokens, batch, step_kind(sampling))
        return form if form in KERNEL_FORMS else None

    def samples_drafts(self, batch: int, tokens: int, sampling) -> bool:
        """Whether the drafter's samples of a step (`batch` rows, blocks of `tokens`) come from the
        shortlist kernels too: the shortlist form verifies such steps, and every sampled row has a
        top-k it serves (the host's copies say so; rows without one sample faster through torch's ops)."""
        return self._form(batch, tokens, sampling) == "shortlist" and step_kind(sampling) == "top-k"

    def describe(self) -> str:
        if self.fixed is not None:
            return f"verification of sampled steps: {self.fixed}"
        return "verification of sampled steps, by measurement:\n" + "\n".join("  " + c.line() for c in self.choices)


def measure_one(block: int, batch: int, vocab: int, dtype: torch.dtype, device: torch.device) -> tuple[VerifyChoice, ...]:
    """The choice for each step kind (STEP_KINDS) of `batch` rows: the kernel forms checked once
    against the reference, then each kind's forms timed on a step of that kind, the fastest kept."""
    step_tokens = _step_tokens(batch, block, vocab, dtype, device)
    reasons = check_forms(KERNEL_FORMS, batch, block, vocab, dtype, device, step_tokens)
    choices = []
    for kind, (forms, row) in STEP_KINDS.items():
        logits, tokens, probs, sampling, starts = _step(step_tokens, (row,), device)
        ms: dict[str, float | None] = {}
        refused: dict[str, str] = {}
        for form in forms:
            reason = reasons.get(form)
            if reason is None:
                verification = ops.verify_block_packed if form == "positions" else packed_verification(form)
                took = time_call(lambda: verification(logits, tokens, probs, *sampling, starts), device)
                ms[form] = None if math.isnan(took) else took
                reason = "cannot be captured in a CUDA graph" if ms[form] is None and form != "positions" else None
            else:
                ms[form] = None
            if reason is not None:
                refused[form] = reason
        timed = {form: took for form, took in ms.items() if took is not None}
        chosen = min(timed, key=timed.get) if timed else "positions"  # dicts keep FORMS' order: a tie keeps the earlier form
        choices.append(VerifyChoice(block, batch, chosen, ms, refused, kind))
    return tuple(choices)


def measure(blocks: tuple[int, ...], batches: tuple[int, ...], vocab: int, dtype: torch.dtype, device: torch.device) -> VerifyChoices:
    """The measured form for every (step kind, block, batch bucket)."""
    return VerifyChoices(None, tuple(c for block in blocks for batch in batches for c in measure_one(block, batch, vocab, dtype, device)))


def fixed(name: str, block: int, vocab: int, dtype: torch.dtype, device: torch.device) -> VerifyChoices:
    """`name` for every sampled step, after checking a kernel form decides as the reference here."""
    if name not in FORMS:
        raise DFlashError(f"unknown verify choice {name!r}", f"use one of {', '.join(CHOICES)}")
    reason = check(name, 2, block, vocab, dtype, device) if name in KERNEL_FORMS else None
    if reason is not None:
        raise DFlashError(f"verify choice {name!r} cannot run here: {reason}", "use verify_choice='positions' (or 'measure')")
    return VerifyChoices(fixed=name)
