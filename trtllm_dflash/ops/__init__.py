"""The DFlash ops: KV-injected block attention, the target's in-place attention, block verification.

`reference` (with `rng`, and `reference_dflash2` for V2 drafters) defines their semantics in plain
torch; `kernels` holds the Triton kernels and their launchers; `custom_ops` exposes them as
`dflash::` torch ops; `attention_options` declares the attention ops' options (scale, window,
sinks) once. The functions below are the entry points the runtimes call: each runs the Triton
kernels (through the `dflash::` ops) where they can run, that is on CUDA tensors, or on CPU when
`TRITON_INTERPRET=1` asks for Triton's interpreter, and the torch reference otherwise, so the
torch runtime has one code path on CPU and GPU. Each entry point is derived from its op's spec
(`specs`): the signature, the binding and the forwarding. TensorRT packaging lives in
`trtllm_dflash.plugins`.
"""

from __future__ import annotations

from typing import Callable

import torch

from trtllm_dflash.ops import custom_ops, reference, reference_attention, reference_dflash2, specs


def entry_point(spec: specs.OpSpec, reference_fn: Callable, kernel_fn: Callable, doc: str) -> Callable:
    """The entry point of `spec`: `kernel_fn` (a `dflash::` op) where the kernels run, that is where
    `custom_ops.kernels_enabled` says so for the first input's device, else `reference_fn`; both
    take the spec's parameters positionally."""

    def call(*args):
        if custom_ops.kernels_enabled(args[0].device):
            return kernel_fn(*args)
        return reference_fn(*args)

    return spec.takes(torch.Tensor, name=spec.name, doc=doc)(call)


def _unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return packed[:, 0].contiguous(), packed[:, 1].contiguous()


block_attention = entry_point(
    specs.BLOCK_ATTENTION,
    reference_attention.block_attention,
    torch.ops.dflash.block_attention,
    """KV-injected block attention; see `reference_attention.block_attention` for the semantics.

    Options (scale, window, causal): `attention_options.BLOCK_ATTENTION`.
    """,
)
target_attention = entry_point(
    specs.TARGET_ATTENTION,
    reference_attention.target_attention,
    torch.ops.dflash.target_attention,
    """Causal target attention over an in-place cache; see `reference_attention.target_attention`.

    Options (sinks, scale, window): `attention_options.TARGET_ATTENTION`.
    """,
)
verify_block = entry_point(
    specs.VERIFY_BLOCK,
    reference.verify_block,
    lambda *args: _unpack(torch.ops.dflash.verify_block(*args)),
    """Tree-free block verification; see `reference.verify_block` for the semantics.""",
)
verify_block_packed = entry_point(
    specs.VERIFY_BLOCK_PACKED,
    reference.verify_block_packed,
    torch.ops.dflash.verify_block,
    """Verification plus next start, committed length and stop flag in one int64 `[b, 5]` tensor
    (one small host read per step); see `reference.verify_block_packed`.""",
)
# the V2 ops fall back to the reference themselves where their kernels do not fit
grouped_dynamic_conv = entry_point(
    specs.GROUPED_DYNAMIC_CONV,
    reference_dflash2.grouped_dynamic_conv,
    torch.ops.dflash.grouped_dynamic_conv,
    """DFlash V2's grouped dynamic causal convolution along a block; see `reference_dflash2`.""",
)
candidate_select = entry_point(
    specs.CANDIDATE_SELECT,
    reference_dflash2.candidate_select,
    torch.ops.dflash.candidate_select,
    """DFlash V2's candidate selector walk: (tokens, candidate ids, candidate q); see `reference_dflash2`.""",
)
