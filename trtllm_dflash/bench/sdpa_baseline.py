"""The strongest torch SDPA baseline for a verify step: every backend tried, the fastest kept.

Why: `F.scaled_dot_product_attention` picks its backend from the arguments, and the easy way to
write a verify step's mask (a boolean `[T, L+T]` mask with `enable_gqa`) rules out flash and
usually lands on the math backend. Beating that proves little. So each backend is called the way
it accepts the step, and the fastest that computes the same attention is the baseline:

- FLASH_ATTENTION: the bottom-right causal mask (`torch.nn.attention.bias.causal_lower_right`,
  which torch lowers to flash's own causal mode), K/V with their KV heads (GQA) or expanded to the
  query heads;
- EFFICIENT_ATTENTION: the same mask through the memory-efficient kernel's bottom-right causal
  mode (the call torch's `CausalBias` makes), K/V expanded (it has no GQA); or a boolean mask;
- CUDNN_ATTENTION and MATH: the boolean mask under `torch.nn.attention.sdpa_kernel`.
- FLASH_VARLEN: torch's varlen flash attention over the caches in place, each row up to its own
  length (`seqused_k`; `trtllm_dflash.ops.flash`): no K/V copied out, as our kernel reads them.

`causal_lower_right` goes to flash whenever flash can run, whatever `sdpa_kernel` says, so the
flash and efficient candidates check `torch.backends.cuda.can_use_*` themselves and call what they
name: the backend reported is the one that ran. A sliding window has no bottom-right mask form:
those shapes use the boolean mask only. Layout: q `[b, Hq, T, D]`, k/v `[b, Hkv, L+T, D]`,
contiguous, prepared outside the timing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F

SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


@dataclasses.dataclass(frozen=True)
class SdpaOperands:
    """One verify step in SDPA's layout: every row's block at the end of its L+T keys."""

    q: torch.Tensor  # [b, Hq, T, Dk]
    k: torch.Tensor  # [b, Hkv, L+T, Dk]
    v: torch.Tensor  # [b, Hkv, L+T, Dv]
    scale: float
    window: int = 0  # 0: full attention; w > 0: a query at p sees keys in (p - w, p]
    # the caches themselves, [b, capacity, Hkv, D] (the block written): what a per-row-length kernel reads in place
    k_cache: torch.Tensor | None = None
    v_cache: torch.Tensor | None = None

    @property
    def group(self) -> int:
        return self.q.shape[1] // self.k.shape[1]

    def expanded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V with one head per query head, for backends without GQA (materialised: what they read)."""
        return self.k.repeat_interleave(self.group, dim=1), self.v.repeat_interleave(self.group, dim=1)

    def boolean_mask(self) -> torch.Tensor:
        """`[T, L+T]`: query t (position L+t) sees keys j <= L+t, and j > L+t-window on sliding layers."""
        tokens, span = self.q.shape[2], self.k.shape[2]
        query_pos = span - tokens + torch.arange(tokens, device=self.q.device).view(-1, 1)
        key_pos = torch.arange(span, device=self.q.device).view(1, -1)
        visible = key_pos <= query_pos
        if self.window > 0:
            visible &= key_pos > query_pos - self.window
        return visible


def verify_operands(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context: int, scale: float, window: int = 0
) -> SdpaOperands:
    """SDPA's operands for a step whose rows all start their block at `context` (the caches hold the block already)."""
    span = context + q.shape[1]
    return SdpaOperands(
        q.transpose(1, 2).contiguous(),
        k_cache[:, :span].transpose(1, 2).contiguous(),
        v_cache[:, :span].transpose(1, 2).contiguous(),
        scale,
        window,
        k_cache,
        v_cache,
    )


@dataclasses.dataclass(frozen=True)
class SdpaCandidate:
    """One way to run the step: a backend, the K/V layout it gets and the mask form."""

    backend: str  # one of SDPA_BACKENDS
    layout: str  # "gqa" (Hkv heads, enable_gqa) or "expanded" (Hq heads)
    mask: str  # "lower-right" (causal_lower_right) or "boolean"

    @property
    def name(self) -> str:
        return f"{self.backend} ({self.layout}, {self.mask} mask)"


@dataclasses.dataclass(frozen=True)
class SdpaTiming:
    """A candidate's median time, or why it did not run (refused the shape, or computed something else)."""

    candidate: SdpaCandidate
    ms: float | None
    refused: str = ""


CANDIDATES = (
    SdpaCandidate("FLASH_ATTENTION", "gqa", "lower-right"),
    SdpaCandidate("FLASH_ATTENTION", "expanded", "lower-right"),
    SdpaCandidate("EFFICIENT_ATTENTION", "expanded", "lower-right"),
    SdpaCandidate("EFFICIENT_ATTENTION", "gqa", "boolean"),
    SdpaCandidate("EFFICIENT_ATTENTION", "expanded", "boolean"),
    SdpaCandidate("CUDNN_ATTENTION", "gqa", "boolean"),
    SdpaCandidate("CUDNN_ATTENTION", "expanded", "boolean"),
    SdpaCandidate("MATH", "gqa", "boolean"),
    # flash attention over the cache in place, each row up to its own length (seqused_k): the fair
    # competitor of a kernel that reads the cache (issue 39 item 4); the others get K/V copied out of it
    SdpaCandidate("FLASH_VARLEN", "cache", "per-row length"),
)


class Refused(Exception):
    """A candidate that cannot run this shape (checked before calling, or the backend said so)."""


def candidate_call(candidate: SdpaCandidate, operands: SdpaOperands) -> Callable[[], torch.Tensor]:
    """A no-argument function running `candidate` on `operands` (`[b, Hq, T, Dv]`); raises Refused
    for a candidate that does not apply to this shape or device."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    o = operands
    if candidate.backend == "FLASH_VARLEN":
        return _varlen_call(o)
    q = o.q
    k, v = (o.k, o.v) if candidate.layout == "gqa" else o.expanded()
    gqa = candidate.layout == "gqa" and o.group > 1
    if candidate.layout == "expanded" and o.group == 1:
        raise Refused("no GQA: same as the gqa layout")
    backend = getattr(SDPBackend, candidate.backend)

    if candidate.mask == "boolean":
        mask = o.boolean_mask()

        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=o.scale, enable_gqa=gqa)

        return run

    if o.window > 0:
        raise Refused("a sliding window has no bottom-right causal form")
    if q.device.type != "cuda":
        raise Refused("flash and memory-efficient attention need CUDA")
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    params = SDPAParams(q, k, v, None, 0.0, False, gqa)
    bias = causal_lower_right(q.shape[2], k.shape[2])
    if candidate.backend == "FLASH_ATTENTION":
        if not can_use_flash_attention(params):
            raise Refused("flash attention cannot run this shape")

        def flash():  # causal_lower_right goes to flash when flash can run
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=o.scale, enable_gqa=gqa)

        return flash
    if not can_use_efficient_attention(params):
        raise Refused("memory-efficient attention cannot run this shape")

    def efficient():  # what CausalBias calls when flash cannot run: the kernel's own bottom-right mode
        return torch.ops.aten._efficient_attention_forward(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            bias=None,
            cu_seqlens_q=None,
            cu_seqlens_k=None,
            max_seqlen_q=None,
            max_seqlen_k=None,
            dropout_p=0.0,
            custom_mask_type=int(bias.variant),
            compute_log_sumexp=False,
            scale=o.scale,
        )[0].transpose(1, 2)

    return efficient


def _varlen_call(o: SdpaOperands) -> Callable[[], torch.Tensor]:
    """torch's flash attention (`ops.flash`, what the runtime's "flash" attention choice runs)
    reading the caches in place: row i's queries are the last T of its L + T keys, causal
    (bottom-right) and windowed as the step is."""
    from trtllm_dflash.ops import flash

    if o.k_cache is None or o.v_cache is None:
        raise Refused("no caches given")
    q = o.q.transpose(1, 2)  # [b, T, Hq, D]
    reason = flash.unavailable_reason(q, o.k_cache, o.v_cache, None)
    if reason is not None:
        raise Refused(reason)
    q = q.contiguous()
    used = torch.full((q.shape[0],), o.k.shape[2], dtype=torch.int32, device=q.device)  # L + T keys per row

    def run() -> torch.Tensor:
        return flash.attend(q, o.k_cache, o.v_cache, used, o.scale, o.window).transpose(1, 2)

    return run


def time_candidates(
    operands: SdpaOperands,
    expected: torch.Tensor,
    timer: Callable[[Callable[[], object]], float],
    candidates: tuple[SdpaCandidate, ...] = CANDIDATES,
    tolerance: float = 3e-2,
) -> list[SdpaTiming]:
    """Every candidate: refused, or checked against `expected` (`[b, T, Hq, Dv]`, ours) and timed."""
    timings = []
    for candidate in candidates:
        try:
            run = candidate_call(candidate, operands)
            got = run().transpose(1, 2)
        except Refused as reason:
            timings.append(SdpaTiming(candidate, None, str(reason)))
            continue
        except (RuntimeError, ValueError, NotImplementedError) as error:  # the backend refused the inputs
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            timings.append(SdpaTiming(candidate, None, first[:160]))
            continue
        if got.shape != expected.shape or not torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance):
            timings.append(SdpaTiming(candidate, None, "computes another attention than the kernel"))
            continue
        ms = timer(run)
        # an in-graph timer gives NaN for a call that cannot be captured (kernels.graph_median_ms)
        timings.append(
            SdpaTiming(candidate, ms) if not math.isnan(ms) else SdpaTiming(candidate, None, "cannot be captured in a CUDA graph")
        )
    return timings


def fastest(timings: list[SdpaTiming]) -> SdpaTiming:
    """The fastest candidate that ran; a timing with ms = nan when none did."""
    ran = [t for t in timings if t.ms is not None]
    if not ran:
        return SdpaTiming(SdpaCandidate("none", "-", "-"), math.nan, "every backend refused the shape")
    return min(ran, key=lambda t: t.ms)
