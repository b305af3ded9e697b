"""torch's built-in FlashAttention-2 reading the caches in place, each row up to its own length.

Why: at small batch the verify and AR passes' attention is a few microseconds of work, and which
kernel does it fastest is a question for the GPU (issue 39 item 4). FlashAttention is the peers'
choice; torch ships it, so no wheel has to be carried to a GPU machine without network. It is
called as the verify step needs it: the varlen kernel (`aten::_flash_attention_forward`, whose
`seqused_k` has been there since torch 2.5; the public `varlen_attn` takes it only from 2.12)
over the caches `[b, S, Hkv, D]` viewed as `[b * S, Hkv, D]`, row r's keys starting at r * S, of
which it reads `used[r]` (bottom-right causal: query t of row r is at position used[r] - T + t).
Nothing is copied out of the caches and nothing is read on the host, so a CUDA graph records it.
GQA is native. Sliding windows map to its left window; attention sinks (gpt-oss) it has not.
"""

from __future__ import annotations

import torch

FLASH_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def unavailable_reason(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None) -> str | None:
    """Why the flash kernel cannot run this call (None: it can)."""
    if q.device.type != "cuda":
        return "flash attention needs CUDA"
    if torch.version.hip is not None:
        return "torch's flash attention with per-row lengths is not checked on ROCm"
    if torch.cuda.get_device_capability(q.device)[0] < 8:
        return "flash attention needs SM 8.0 or newer"
    if q.dtype not in FLASH_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return f"flash attention runs float16/bfloat16, not {q.dtype}"
    dims = {q.shape[-1], k_cache.shape[-1], v_cache.shape[-1]}
    if len(dims) != 1 or any(d % 8 or d > MAX_HEAD_DIM for d in dims):
        return f"flash attention needs equal head dims, a multiple of 8 up to {MAX_HEAD_DIM} (got {sorted(dims)})"
    if q.shape[2] % k_cache.shape[2]:
        return f"{q.shape[2]} query heads are not a multiple of {k_cache.shape[2]} KV heads"
    if sinks is not None:
        return "flash attention has no attention sinks"
    if not k_cache.is_contiguous() or not v_cache.is_contiguous():
        return "flash attention reads contiguous caches"
    if not hasattr(torch.ops.aten, "_flash_attention_forward"):
        return f"torch {torch.__version__} has no flash attention forward"
    return None


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, used: torch.Tensor, scale: float, window: int = 0
) -> torch.Tensor:
    """q `[b, T, Hq, D]` over the first `used[r]` slots of each cache row (the block written there
    already, at the last T of them): `[b, T, Hq, D]`, as `reference_attention.target_attention` computes.
    `window` > 0: a query at position p sees slots in (p - window, p]. Check `unavailable_reason` first."""
    batch, tokens, heads, head_dim = q.shape
    capacity, kv_heads = k_cache.shape[1], k_cache.shape[2]
    steps = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    out = torch.ops.aten._flash_attention_forward(
        q.reshape(batch * tokens, heads, head_dim),
        k_cache.view(batch * capacity, kv_heads, head_dim),
        v_cache.view(batch * capacity, kv_heads, v_cache.shape[-1]),
        steps * tokens,
        steps * capacity,  # row r's keys start at r * capacity; seqused_k says how many it reads
        tokens,
        capacity,
        0.0,
        True,  # causal, bottom-right aligned: the block's queries are the last T of the used keys
        False,
        scale=scale,
        window_size_left=window - 1 if window > 0 else -1,
        window_size_right=0,
        seqused_k=used.to(torch.int32),
    )[0]
    return out.view(batch, tokens, heads, -1)
