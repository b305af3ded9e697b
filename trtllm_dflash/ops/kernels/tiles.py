"""Tile configuration of the attention kernels: query/key tiles, warps and pipeline stages, sized
to the shared memory their launch gets.

The same functions feed the torch launches (`launch.py`) and the ahead-of-time builds
(`aot_variants.py`, `tensorrt_plugins.py`), so an engine runs the tiles that were tested, and
plugins/kernel_audit.py checks every configuration against the compiler.
"""

from __future__ import annotations

import dataclasses

from trtllm_dflash.contracts import dtypes
from trtllm_dflash.errors import DFlashError

ATTENTION_HEAD_DIMS = (16, 32, 64, 128, 256)  # powers of two: tl.dot tiles
MAX_BLOCK = 16
VERIFY_BLOCK_V = 1024
COMMIT_BLOCK_S = 16
# shortlist verification (verify_shortlist.py): the largest top-k it serves, the logits one select
# program reads, and the kept tokens (top-k with its ties) a position may have before the full walk
SHORTLIST = 64
SHORTLIST_CHUNK_V = 4096
SHORTLIST_KEPT = 128


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


# the fused decoding passes' kernels (fused_layer.py), launched by modeling/fused_ops.py and audited
# at Qwen3-8B's sizes by aot_variants.fused_layer_variants
QK_NORM_ROPE_WARPS = 1  # one head of D values per program
SILU_BLOCK_F = 1024  # FFN columns per program
SILU_WARPS = 4


def norm_tile(hidden: int) -> tuple[int, int]:
    """(BLOCK_H, num_warps) of the add + RMSNorm kernel: the whole row in one program."""
    block = next_power_of_2(hidden)
    return block, max(1, min(8, block // 256))


def silu_block(width: int) -> int:
    """BLOCK_F of the SiLU * up kernel: SILU_BLOCK_F columns, fewer for a narrower FFN."""
    return min(SILU_BLOCK_F, next_power_of_2(width))


def cdiv(a, b):
    """Ceiling division with `//` only (works on TensorRT shape expressions too)."""
    return (a + b - 1) // b


# Shared memory. A TensorRT AOT plugin launch gets `shared_mem` bytes of dynamic shared memory, and
# nothing in TensorRT's documentation says it raises a kernel's limit above the 48 KiB every CUDA
# device grants without an opt-in (docs/plugins.md, "Shared memory"), so 16-bit tiles (what engines
# run) stay within ENGINE_SHARED_BUDGET, and torch launches take the same tiles: one set of
# compiled variants, all audited (plugins/kernel_audit.py). Float32 tiles are launched by torch
# only (tests, reference runs), through Triton's launcher, which opts in to more: they get the
# smallest opt-in limit of the kernel targets (sm_120's 99 KiB).
ENGINE_SHARED_BUDGET = 48 * 1024
FLOAT32_SHARED_BUDGET = 99 * 1024
# Triton's own barriers and scratch in shared memory (up to 1,056 bytes seen on sm_100a), kept out of
# the tiles' share of the budget.
SHARED_SLACK = 2048
# Registers per thread a kernel may use (PTX `.maxnreg`). Left alone, ptxas caps some 8-warp kernels
# at 128 and spills 4-16 bytes (float8 caches, attention sinks); 255 lets them keep their 130-160.
MAX_REGISTERS = 255


def dtype_name(dtype) -> str:
    """`torch.bfloat16` or "bfloat16" -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def element_bytes(dtype) -> int:
    """Bytes of one element of an activation dtype (torch's, or its name); 16-bit for one not known."""
    found = dtypes.find(dtype_name(dtype))
    return int(found.bytes) if found else 2


def shared_budget_for(dtype: str) -> int:
    """The shared memory a tile of this activation dtype is sized for (see above)."""
    return FLOAT32_SHARED_BUDGET if element_bytes(dtype) == 4 else ENGINE_SHARED_BUDGET


def tile_shared_bytes(
    block_m: int, block_n: int, head_dim_k: int, head_dim_v: int, element_bytes: int, num_stages: int, streams: int
) -> int:
    """Shared memory of one flash-attention program, an upper estimate of Triton's layout (checked
    against the compiler by tests/test_kernel_audit.py): the query tile with a key and a value tile
    per streamed load (`streams`: 2 for the drafter's cache + new rows, 1 for the target), buffered
    `num_stages` times when software-pipelined; or the float32 output tile a split program writes
    (Triton converts its layout through shared memory), whichever is larger (the allocations are
    reused)."""
    kv_tile = block_n * (head_dim_k + head_dim_v)
    operands = element_bytes * (block_m * head_dim_k + max(num_stages, 1) * streams * kv_tile)
    return max(operands, 4 * block_m * head_dim_v) + SHARED_SLACK


def fit_tiles(
    head_dim_k: int, head_dim_v: int, block_m: int, dtype: str, shared_budget: int | None, streams: int
) -> tuple[int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages) within `shared_budget` bytes (default: the dtype's).

    16-bit tiles start double buffered; float32 ones single, with at most 2048 query elements (fp32
    dots run on FMA units, and larger tiles spill hundreds of bytes per thread). Then the stage
    count, the key tile and the query tile shrink, in that order, until the estimate fits. 8 warps
    above 4 KiB of queries: with 4, ptxas (sm_90a) spills 50-650 bytes per thread in the 16-bit
    32 x 128 and 16/32 x 256 drafter tiles (tests/test_kernel_audit.py)."""
    element_size = element_bytes(dtype)
    budget = shared_budget if shared_budget is not None else shared_budget_for(dtype)
    block_n = 64 if max(head_dim_k, head_dim_v) <= 128 else 32
    num_stages = 2 if element_size <= 2 else 1
    if element_size == 4:
        block_m = min(block_m, max(16, 2048 // head_dim_k))
    if streams == 2 and head_dim_k >= 256:  # the drafter's 32 x 256 tile spills ~300 bytes even at 255 registers
        block_m = 16
    while tile_shared_bytes(block_m, block_n, head_dim_k, head_dim_v, element_size, num_stages, streams) > budget:
        if num_stages > 1:
            num_stages -= 1
        elif block_n > 16:
            block_n //= 2
        elif block_m > 16:
            block_m //= 2
        else:
            raise DFlashError(f"no attention tile of head dims {head_dim_k}/{head_dim_v} fits {budget} bytes of shared memory")
    num_warps = 4 if block_m * head_dim_k * element_size <= 16 * 128 * 2 else 8
    return block_m, block_n, num_warps, num_stages


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Compile-time tiles of one block-attention kernel variant."""

    head_dim: int
    block_m: int  # packed query rows (block position x GQA group) per program
    block_n: int  # context keys per step
    block_t: int  # block keys (one tile holds the whole block)
    num_warps: int
    num_stages: int

    def m_tiles(self, block, group):
        return cdiv(block * group, self.block_m)


def attention_config(
    head_dim: int, block: int = MAX_BLOCK, group: int = 1, dtype: str = "bfloat16", shared_budget: int | None = None
) -> AttentionConfig:
    """Tile sizes for a KV head's packed query rows (block x group), a head dimension and a dtype,
    within a shared-memory budget (default: the dtype's, `shared_budget_for`)."""
    if not 1 <= block <= MAX_BLOCK:
        raise DFlashError(f"block attention supports blocks of 1..{MAX_BLOCK} tokens, not {block}", "use a smaller block size")
    cap = 128 if head_dim <= 128 else 64
    return attention_config_for_tile(head_dim, min(max(16, next_power_of_2(block * group)), cap), dtype, shared_budget)


def attention_config_for_tile(head_dim: int, block_m: int, dtype: str = "bfloat16", shared_budget: int | None = None) -> AttentionConfig:
    """The rest of the configuration follows from the head dimension, the query tile and the budget."""
    if head_dim not in ATTENTION_HEAD_DIMS:
        raise DFlashError(f"block attention supports head_dim {ATTENTION_HEAD_DIMS}, not {head_dim}", "use a supported drafter")
    block_m, block_n, num_warps, num_stages = fit_tiles(head_dim, head_dim, block_m, dtype, shared_budget, streams=2)
    return AttentionConfig(head_dim, block_m, block_n, MAX_BLOCK, num_warps, num_stages)


@dataclasses.dataclass(frozen=True)
class TargetAttentionConfig:
    """Compile-time tiles of one target-attention kernel variant (keys and values may differ in width)."""

    head_dim_k: int
    head_dim_v: int
    block_m: int  # packed query rows (block token x GQA group) per program
    block_n: int  # keys per step, for the cached prefix and for the block's own keys
    num_warps: int
    num_stages: int

    def m_tiles(self, tokens, group):
        return cdiv(tokens * group, self.block_m)


def target_attention_config(
    head_dim_k: int,
    head_dim_v: int,
    tokens: int = MAX_BLOCK,
    group: int = 1,
    dtype: str = "bfloat16",
    shared_budget: int | None = None,
) -> TargetAttentionConfig:
    """Tiles for a target layer: the query tile packs a KV head's block x group rows, as the drafter's.

    A prefill (tokens > MAX_BLOCK) gets the tile of the largest verify block and more tiles, so one
    compiled variant serves an engine whose token dimension is dynamic.
    """
    cap = 128 if max(head_dim_k, head_dim_v) <= 128 else 64
    block_m = min(max(16, next_power_of_2(min(max(tokens, 1), MAX_BLOCK) * group)), cap)
    return target_attention_config_for_tile(head_dim_k, head_dim_v, block_m, dtype, shared_budget)


def target_attention_config_for_tile(
    head_dim_k: int, head_dim_v: int, block_m: int, dtype: str = "bfloat16", shared_budget: int | None = None
) -> TargetAttentionConfig:
    """The rest of the configuration follows from the head dims, the query tile and the budget (as for the drafter)."""
    for name, dim in (("key", head_dim_k), ("value", head_dim_v)):
        if dim not in ATTENTION_HEAD_DIMS:
            raise DFlashError(
                f"target attention supports {name} head dims {ATTENTION_HEAD_DIMS}, not {dim}", "the torch reference runs other shapes"
            )
    block_m, block_n, num_warps, num_stages = fit_tiles(head_dim_k, head_dim_v, block_m, dtype, shared_budget, streams=1)
    return TargetAttentionConfig(head_dim_k, head_dim_v, block_m, block_n, num_warps, num_stages)
