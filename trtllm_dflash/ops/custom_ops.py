"""The plugins as torch custom ops: `dflash::block_attention`, `dflash::target_attention`,
`dflash::verify_block`, and DFlash V2's `dflash::grouped_dynamic_conv` and `dflash::candidate_select`.

Custom ops are opaque to torch.compile and torch.export, so graphs keep one node per plugin (the
ONNX exporter maps it to the plugin's ONNX node, see `onnx_nodes.custom_translation_table`), and
each op has a fake implementation for shape propagation. At run time an op runs:
- the compiled Triton kernels on CUDA tensors;
- the same kernels through Triton's CPU interpreter when `TRITON_INTERPRET=1`;
- otherwise, or for inputs the kernels do not cover (float64 models, head dims that are not a
  power of two in 16..256, blocks over 16), the torch reference (`reference.py`,
  `reference_attention.py`, `reference_dflash2.py`), which defines the semantics.

`dflash::block_attention` appends the new context rows to the caches in place (what a runtime
wants). Mutating ops cannot be exported, so `dflash::block_attention_functional` returns the
updated caches instead; its ONNX/TensorRT node aliases them to the input caches, which makes
the append in place inside an engine too. `dflash::target_attention` (causal attention of a
target layer over its in-place cache) and `dflash::target_attention_functional` follow the same
pattern. Each op's signature (so its schema), its in-place inputs and the functional form's
extra outputs come from its spec (`specs`; the attention ops' options from `attention_options`):
what is written here is which kernel covers which inputs, and the fake (shape) functions.
"""

from __future__ import annotations

from typing import Callable

import torch

from trtllm_dflash.ops import kernels, reference, reference_attention, reference_dflash2, specs
from trtllm_dflash.ops.kernels import dflash2_launch, launch


def kernels_enabled(device: torch.device) -> bool:
    """Whether the Triton kernels (compiled, or interpreted on request) run on this device."""
    if not kernels.triton_available():
        return False
    return device.type == "cuda" or kernels.interpreter_requested()


def _kernel_or_reference(spec: specs.OpSpec, module, supported: Callable, checked: tuple[str, ...], reference_fn: Callable) -> Callable:
    """`module.<spec.op_name>` (the launcher, looked up per call) where the kernels run and `supported(<checked inputs>)`,
    else `reference_fn`; all take the spec's parameters positionally."""
    picks = [spec.index(name) for name in checked]

    def run(*args):
        if kernels_enabled(args[0].device) and supported(*(args[i] for i in picks)):
            return getattr(module, spec.op_name)(*args)
        return reference_fn(*args)

    return run


def _functional(spec: specs.OpSpec, run: Callable) -> Callable:
    """`run` on copies of the inputs `spec` updates in place, returning (output, *updated copies)."""
    mutated = [spec.index(name) for name in spec.mutates]

    def run_functional(*args):
        args = list(args)
        for i in mutated:
            args[i] = args[i].clone()
        return (run(*args), *(args[i] for i in mutated))

    return run_functional


def register(spec: specs.OpSpec, run: Callable, fake: Callable, doc: str):
    """`dflash::<op>` with the spec's signature, running `run(*args)`, shaped by `fake(*args)`; for an
    in-place op also `dflash::<op>_functional`. Returns the op (and the functional one)."""
    op = torch.library.custom_op(f"dflash::{spec.op_name}", mutates_args=spec.mutates)(
        spec.takes(torch.Tensor, name=spec.op_name, doc=doc)(run)
    )
    op.register_fake(fake)
    if not spec.mutates:
        return op
    functional = spec.functional()
    mutated = [spec.index(name) for name in spec.mutates]
    functional_op = torch.library.custom_op(f"dflash::{functional.name}", mutates_args=())(
        functional.takes(torch.Tensor, name=functional.name, doc="The exportable form: returns (output, *updated caches).")(
            _functional(spec, run)
        )
    )
    functional_op.register_fake(lambda *args: (fake(*args), *(torch.empty_like(args[i]) for i in mutated)))
    return op, functional_op


block_attention, block_attention_functional = register(
    specs.BLOCK_ATTENTION,
    _kernel_or_reference(specs.BLOCK_ATTENTION, launch, launch.attention_supported, ("q", "k_cache"), reference_attention.block_attention),
    lambda q, *args: torch.empty_like(q),
    "KV-injected block attention; appends the new context to `k_cache`/`v_cache` in place.",
)
target_attention, target_attention_functional = register(
    specs.TARGET_ATTENTION,
    _kernel_or_reference(
        specs.TARGET_ATTENTION, launch, launch.target_attention_supported, ("q", "k_cache", "v_cache"), reference_attention.target_attention
    ),
    lambda q, k_new, v_new, k_cache, v_cache, *args: q.new_empty((*q.shape[:-1], v_cache.shape[-1])),
    "Causal block attention of a target layer; writes the block's K/V into the caches in place.",
)
verify_block = register(
    specs.VERIFY_BLOCK_PACKED,
    _kernel_or_reference(specs.VERIFY_BLOCK_PACKED, launch, launch.verify_supported, ("target_logits",), reference.verify_block_packed),
    lambda target_logits, *args: target_logits.new_empty((target_logits.shape[0], len(reference.VERIFY_RESULT_COLUMNS)), dtype=torch.int64),
    "Tree-free block verification; returns int64 `[b, 5]` (`reference.VERIFY_RESULT_COLUMNS`).",
)
grouped_dynamic_conv = register(
    specs.GROUPED_DYNAMIC_CONV,
    _kernel_or_reference(
        specs.GROUPED_DYNAMIC_CONV,
        dflash2_launch,
        dflash2_launch.conv_supported,
        ("x", "delta", "base", "residual"),
        reference_dflash2.grouped_dynamic_conv,
    ),
    lambda x, delta, base, residual=None: x.new_empty(x.shape, dtype=torch.float32 if residual is not None else x.dtype),
    "DFlash V2's grouped dynamic causal conv along a block (`reference_dflash2.grouped_dynamic_conv`).",
)


def _candidate_select_fake(unary, *args):
    batch, steps, vocab = unary.shape
    k = min(args[-1], vocab)  # top_k
    return (
        unary.new_empty((batch, steps), dtype=torch.int64),
        unary.new_empty((batch, steps, k), dtype=torch.int64),
        unary.new_empty((batch, steps, k), dtype=torch.float32),
    )


candidate_select = register(
    specs.CANDIDATE_SELECT,
    _kernel_or_reference(
        specs.CANDIDATE_SELECT,
        dflash2_launch,
        dflash2_launch.select_supported,
        ("unary", "z", "predecessor", "successor", "top_k"),
        reference_dflash2.candidate_select,
    ),
    _candidate_select_fake,
    "DFlash V2's candidate selector: (tokens, candidate ids, candidate q) (`reference_dflash2.candidate_select`).",
)
