"""Host side of the DFlash V2 kernels (`dflash2.py`): tiles, grids, scalars, coverage, launches.

Like `launch.py`, the grid and scalar functions feed both the torch launches here and the
TensorRT plugins (`tensorrt_plugins.py`, where sizes are symbolic shape expressions), so they use
only `+ - * //`.
"""

from __future__ import annotations

import torch

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.ops import kernels, specs
from trtllm_dflash.ops.kernels.tiles import MAX_BLOCK, MAX_REGISTERS, cdiv, next_power_of_2

CONV_BLOCK_C = 128  # channels per program: with groups of 16, 8 coefficients (16 bytes of bf16) per row
CONV_WARPS = 2
SELECT_BLOCK_V = 1024  # logits per selection round of the partials kernel
SELECT_CHUNK_V = 4 * SELECT_BLOCK_V  # logits per program: 64 chunks of a 262,144 vocabulary
SELECT_BLOCK_M = 1024  # partial entries per selection round of the merge kernel
SELECT_ALIGN = 16  # a vocabulary that is a multiple of this starts every unary row 16-byte aligned
SELECT_RANKS = (16, 32, 64, 128, 256, 512)  # the codebook rank: a power of two (one register tile)
MAX_TOP_K = 64
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------- grids and scalars


def conv_aligned(hidden: int | None) -> bool:
    """Whether every row of x / delta starts on a channel tile (False when unknown at build time)."""
    return hidden is not None and hidden % CONV_BLOCK_C == 0


def conv_grid(blocks, hidden):
    return (cdiv(hidden, CONV_BLOCK_C), blocks, 1)


def conv_scalars(steps, hidden):
    return (steps, hidden)


def select_num_chunks(vocab, chunk_v: int = SELECT_CHUNK_V):
    return cdiv(vocab, chunk_v)


def select_vocab_divisible(vocab: int | None) -> bool:
    return vocab is not None and vocab % SELECT_ALIGN == 0


def topk_partials_grid(rows, vocab, chunk_v: int = SELECT_CHUNK_V):
    return (select_num_chunks(vocab, chunk_v), rows, 1)


def topk_merge_grid(rows):
    return (rows, 1, 1)


def candidate_select_grid(batch):
    return (batch, 1, 1)


def block_k(top_k: int) -> int:
    return max(next_power_of_2(top_k), 2)


# ----------------------------------------------------------------------------- coverage


def conv_supported(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether the conv kernel covers these inputs (else callers use the reference): blocks of
    1..16 rows, groups of a power of two up to the channel tile, float16/bfloat16/float32 data,
    a float32 residual of x's shape."""
    if x.dim() < 2 or delta.dim() != x.dim() + 1 or base.dim() != 2 or x.dtype not in DTYPES:
        return False
    steps, hidden = x.shape[-2:]
    kernel_size, groups = delta.shape[-2:]
    if groups == 0 or hidden % groups:
        return False
    group = hidden // groups
    return (
        1 <= steps <= MAX_BLOCK
        and tuple(delta.shape[:-2]) == tuple(x.shape[:-1])
        and tuple(base.shape) == (kernel_size, hidden)
        and 1 <= kernel_size <= MAX_BLOCK
        and group == next_power_of_2(group)
        and group <= CONV_BLOCK_C
        and delta.dtype in DTYPES
        and base.dtype in DTYPES
        and (residual is None or (residual.dtype == torch.float32 and residual.shape == x.shape))
    )


def select_supported(unary: torch.Tensor, z: torch.Tensor, predecessor: torch.Tensor, successor: torch.Tensor, top_k: int) -> bool:
    """Whether the selector kernels cover these inputs: a rank in SELECT_RANKS, 1 <= k <= MAX_TOP_K
    and at most the vocabulary, blocks of 1..16 positions, float16/bfloat16/float32 data."""
    if unary.dim() != 3 or z.dim() != 3 or predecessor.dim() != 2 or successor.dim() != 2:
        return False
    batch, steps, vocab = unary.shape
    rank = z.shape[-1]
    return (
        rank in SELECT_RANKS
        and tuple(z.shape[:2]) == (batch, steps)
        and tuple(successor.shape) == (vocab, rank)
        and predecessor.shape[1] == rank
        and 1 <= top_k <= min(MAX_TOP_K, vocab)
        and 1 <= steps <= MAX_BLOCK
        and vocab < 2**31 - 1
        and all(t.dtype in DTYPES for t in (unary, z, predecessor, successor))
    )


# ----------------------------------------------------------------------------- launches


@specs.GROUPED_DYNAMIC_CONV.launcher(torch.Tensor)
def grouped_dynamic_conv(inputs) -> torch.Tensor:
    """Run the conv kernel (`reference_dflash2.grouped_dynamic_conv`): float32 with a residual, else x's dtype."""
    x, delta, base, residual = inputs
    if not conv_supported(x, delta, base, residual):
        raise DFlashError(
            f"the grouped conv kernel does not cover x {tuple(x.shape)} {x.dtype}, delta {tuple(delta.shape)}, base {tuple(base.shape)}",
            "call ops.grouped_dynamic_conv, which falls back to the reference",
        )
    steps, hidden = x.shape[-2:]
    kernel_size, groups = delta.shape[-2:]
    blocks = x.numel() // max(steps * hidden, 1)
    out = torch.empty(x.shape, dtype=torch.float32 if residual is not None else x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    residual_arg = residual.contiguous() if residual is not None else out  # a placeholder it does not read
    kernels.for_tensor_device("dflash2", x.device).grouped_conv_kernel[conv_grid(blocks, hidden)](
        x.contiguous(),
        delta.contiguous(),
        base.contiguous(),
        residual_arg,
        *conv_scalars(steps, hidden),
        out,
        KERNEL_SIZE=kernel_size,
        GROUP=hidden // groups,
        BLOCK_T=MAX_BLOCK,
        BLOCK_C=CONV_BLOCK_C,
        HAS_RESIDUAL=residual is not None,
        ALIGNED=conv_aligned(hidden),
        **_launch_options(x.device, CONV_WARPS),
    )
    return out


def topk_partials(
    unary: torch.Tensor, top_k: int, chunk_v: int = SELECT_CHUNK_V, block_v: int = SELECT_BLOCK_V
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 of the candidates: float32 values and int32 ids `[b, T, chunks, k]` (`reference_dflash2.topk_partials`)."""
    if chunk_v % block_v:
        raise DFlashError(f"the selection chunk ({chunk_v}) must be a multiple of the tile ({block_v})")
    batch, steps, vocab = unary.shape
    chunks = select_num_chunks(vocab, chunk_v)
    values = torch.empty(batch, steps, chunks, top_k, dtype=torch.float32, device=unary.device)
    ids = torch.empty(batch, steps, chunks, top_k, dtype=torch.int32, device=unary.device)
    if values.numel() == 0:
        return values, ids
    kernels.for_tensor_device("dflash2", unary.device).topk_partials_kernel[topk_partials_grid(batch * steps, vocab, chunk_v)](
        unary.contiguous(),
        vocab,
        values,
        ids,
        TOP_K=top_k,
        BLOCK_K=block_k(top_k),
        BLOCK_V=block_v,
        CHUNK_V=chunk_v,
        VOCAB_DIVISIBLE=select_vocab_divisible(vocab),
        **_launch_options(unary.device, 4),
    )
    return values, ids


def topk_merge(values: torch.Tensor, ids: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2: int64 candidate ids and float32 unary logits `[b, T, k]` (`reference_dflash2.topk_merge`)."""
    batch, steps, chunks, _ = values.shape
    cand = torch.empty(batch, steps, top_k, dtype=torch.int64, device=values.device)
    cand_unary = torch.empty(batch, steps, top_k, dtype=torch.float32, device=values.device)
    if cand.numel() == 0:
        return cand, cand_unary
    kernels.for_tensor_device("dflash2", values.device).topk_merge_kernel[topk_merge_grid(batch * steps)](
        values.contiguous(),
        ids.contiguous(),
        chunks,
        cand,
        cand_unary,
        TOP_K=top_k,
        BLOCK_K=block_k(top_k),
        BLOCK_M=SELECT_BLOCK_M,
        **_launch_options(values.device, 4),
    )
    return cand, cand_unary


@specs.CANDIDATE_WALK.launcher(torch.Tensor)
def candidate_walk(inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk: int64 tokens `[b, T]` and float32 candidate probabilities `[b, T, k]` (`reference_dflash2.candidate_walk`)."""
    batch, steps, top_k = inputs.cand.shape
    device = inputs.cand.device
    tokens = torch.empty(batch, steps, dtype=torch.int64, device=device)
    probs = torch.empty(batch, steps, top_k, dtype=torch.float32, device=device)
    if tokens.numel() == 0:
        return tokens, probs
    kernels.for_tensor_device("dflash2", device).candidate_select_kernel[candidate_select_grid(batch)](
        inputs.cand.to(torch.int64).contiguous(),
        inputs.cand_unary.to(torch.float32).contiguous(),
        inputs.z.contiguous(),
        inputs.anchor.to(torch.int64).contiguous(),
        inputs.predecessor.contiguous(),
        inputs.successor.contiguous(),
        inputs.temperature.to(torch.float32).contiguous(),
        inputs.seed.to(torch.int64).contiguous(),
        inputs.positions.to(torch.int64).contiguous(),
        steps,
        tokens,
        probs,
        TOP_K=top_k,
        BLOCK_K=block_k(top_k),
        RANK=inputs.z.shape[-1],
        **_launch_options(device, 4, fp_fusion=False),
    )
    return tokens, probs


@specs.CANDIDATE_SELECT.launcher(torch.Tensor)
def candidate_select(
    inputs, *, chunk_v: int = SELECT_CHUNK_V, block_v: int = SELECT_BLOCK_V
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three selector kernels: (tokens, candidate ids, candidate probabilities), as `reference_dflash2.candidate_select`."""
    unary, z, top_k = inputs.unary, inputs.z, inputs.top_k
    if not select_supported(unary, z, inputs.predecessor, inputs.successor, top_k):
        raise DFlashError(
            f"the selector kernels do not cover unary {tuple(unary.shape)}, z {tuple(z.shape)}, top_k {top_k}",
            "call ops.candidate_select, which falls back to the reference",
        )
    cand, cand_unary = topk_merge(*topk_partials(unary, top_k, chunk_v, block_v), top_k)
    tokens, probs = candidate_walk(cand, cand_unary, *inputs[1:-1])  # the walk takes the select's inputs after unary, but top_k
    return tokens, cand, probs


def _launch_options(device: torch.device, num_warps: int, fp_fusion: bool = True) -> dict:
    """Compile options for GPU launches (the interpreter takes none)."""
    if device.type != "cuda":
        return {}
    return dict(num_warps=num_warps, num_stages=1, enable_fp_fusion=fp_fusion, maxnreg=MAX_REGISTERS)
