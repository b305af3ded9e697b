"""How many device launches a decoding pass's layer costs on the GPU path (issue 39 item 3).

Under a CUDA graph every kernel of a batch-1 pass costs a few microseconds beyond its own work, so
a layer's launches are part of its speed. This runs the GPU path with its kernels in Triton's
interpreter and counts, per decoder layer, what would launch on a GPU: every Triton kernel, and
every aten op other than views and allocations (the `dflash::` custom ops are counted by the
kernels they run). The per-layer count is the difference between a 3-layer and a 2-layer model,
so the pass's fixed work (embedding, RoPE, the LM head) cancels.

Off CUDA the attention op runs one KV split and the skinny kernels one K split. On a GPU at
batch 1 both split, and neither adds a launch: a projection's last K split sums the splits and an
attention's last KV split merges them, each in the same launch; the forced-split test below counts
the attention op that way.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import pytest
import torch

pytest.importorskip("triton")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# aten ops that launch nothing on a GPU: views, allocations, metadata
NO_LAUNCH = {
    "view", "_unsafe_view", "reshape", "expand", "slice", "select", "t", "transpose", "unsqueeze", "squeeze", "as_strided",
    "permute", "split", "split_with_sizes", "chunk", "unbind", "alias", "detach", "empty", "empty_like", "empty_strided",
    "new_empty", "lift_fresh", "narrow", "unflatten", "flatten", "contiguous", "size", "stride", "dim", "is_contiguous",
}  # fmt: skip


class LaunchCounter(TorchDispatchMode):
    """Counts, while entered, aten ops that launch device work and Triton kernel launches (the
    interpreter's grid calls), by name; aten ops inside a Triton launch (the interpreter's own
    copies) are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.inside = 0

    def __enter__(self):
        from triton.runtime import interpreter

        self.real = real = interpreter.GridExecutor.__call__

        def launch(executor, *args, **kwargs):
            # a dependent launch (ops/kernels/dependent_launch.py) is counted as one, and only with both its
            # halves: the kernel's wait (PDL) and the launch attribute
            kind = {(True, True): " (dependent)", (False, False): ""}.get((kwargs.get("PDL", False), kwargs.get("launch_pdl", False)))
            self.counts[f"triton {executor.fn.__name__}{' (half dependent)' if kind is None else kind}"] += 1
            self.inside += 1
            try:
                return real(executor, *args, **kwargs)
            finally:
                self.inside -= 1

        interpreter.GridExecutor.__call__ = launch
        return super().__enter__()

    def __exit__(self, *exc):
        from triton.runtime import interpreter

        interpreter.GridExecutor.__call__ = self.real
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.inside and name not in NO_LAUNCH and func.namespace != "dflash":
            self.counts[f"aten {name}"] += 1
        return func(*args, **(kwargs or {}))


def _launches(layers: int, draft_layers: int, dependent: bool = False) -> tuple[dict[str, collections.Counter], dict[str, torch.Tensor]]:
    """Launches of the verify, AR and draft passes of a tiny model on the GPU path, skinny projections,
    and each pass's output (`dependent`: the runtime's dependent_launch)."""
    from trtllm_dflash.bench import gpu_step
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    shape = dataclasses.replace(gpu_step.TINY, layers=layers, draft_layers=draft_layers, target_layer_ids=(0, 1))
    target, drafter = gpu_step.make_models(shape, torch.device("cpu"), torch.float32)
    runtime = TorchRuntime(target, drafter, attention="dflash", linear_choice="skinny", dependent_launch=dependent)
    batch = 2  # (one row on a CPU writes its context K/V by slice copies, a shortcut the GPU path does not take)
    runtime.allocate(batch, 64)
    assert runtime.fused is not None
    rows, context = slice(0, batch), 20
    tokens = torch.randint(0, shape.vocab, (batch, shape.block), generator=torch.Generator().manual_seed(0))
    starts = torch.full((batch,), context, dtype=torch.long)
    features = torch.randn(batch, shape.block, len(shape.target_layer_ids) * shape.hidden)
    block = torch.full((batch, shape.block), runtime.drafter_config.mask_token_id, dtype=torch.long)
    new_counts = torch.full((batch,), 3, dtype=torch.long)
    passes = {
        "verify": lambda: runtime.target_forward(rows, tokens, starts, context + shape.block),
        "AR": lambda: runtime.target_forward(rows, tokens[:, :1], starts, context + 1),
        "draft": lambda: runtime.draft_forward(rows, block, features, new_counts, starts - new_counts),
    }
    counted, outputs = {}, {}
    for name, run in passes.items():
        run()
        counter = LaunchCounter()
        with torch.inference_mode(), counter:
            out = run()
        counted[name] = counter.counts
        outputs[name] = out.logits if hasattr(out, "logits") else out
    runtime.taps.remove()
    return counted, outputs


@functools.cache
def _counted(layers: int, draft_layers: int, kv_splits: int | None = None, dependent: bool = False) -> tuple[dict, dict]:
    """`_launches` in Triton's interpreter (counts and each pass's output), with the attention's KV
    range forced into `kv_splits` (None: one, as off CUDA) and, with `dependent`, dependent launches
    allowed off a Hopper GPU. Cached: the tests below read the same passes in different ways, and
    each costs several seconds interpreted (nothing here mutates what it returns)."""
    from trtllm_dflash.ops.kernels import dependent_launch, launch

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        if kv_splits is not None:
            patch.setattr(launch, "default_target_kv_splits", lambda *shape: kv_splits)
            patch.setattr(launch, "default_kv_splits", lambda *shape: kv_splits)
        if dependent:
            patch.setattr(dependent_launch, "supported", lambda device: True)
        return _launches(layers, draft_layers, dependent)


def test_a_decoder_layer_launches_eight_kernels_on_the_gpu_path():
    """Per target layer, verify and AR passes alike: the input norm with the residual add, the qkv
    projection, q/k norm + RoPE, the attention op, o_proj, the post-attention norm with its residual
    add, gate/up, and the down projection forming silu(gate) * up itself. Per drafter layer the
    same, plus the context rows' K/V projection and their norm + RoPE. Nothing else: no torch op.
    Around the layers, a target pass launches 9 more."""
    (small, _), (large, _) = _counted(2, 1), _counted(3, 2)
    layer = {
        "triton add_rms_norm_kernel": 2,
        "triton skinny_linear_kernel": 4,
        "triton qk_norm_rope_kernel": 1,
        "triton target_attention_kernel": 1,
    }
    for name in ("verify", "AR"):
        per_layer = large[name] - small[name]
        assert dict(per_layer) == layer, f"{name} pass, per layer: {dict(per_layer)}"
        # and once per pass: the token embedding, the positions, cos/sin gathered from the rope table
        # (fused_ops.RopeTable: a clamp and two gathers), the final norm, the LM head, the taps' concat
        fixed = small[name] - collections.Counter({kernel: 2 * count for kernel, count in layer.items()})
        assert dict(fixed) == {
            "aten embedding": 3,
            "aten arange": 1,
            "aten add": 1,
            "aten clamp": 1,
            "aten cat": 1,
            "triton add_rms_norm_kernel": 1,
            "triton skinny_linear_kernel": 1,
        }, f"{name} pass, once per pass: {dict(fixed)}"
    per_draft_layer = dict(large["draft"] - small["draft"])
    assert per_draft_layer == {
        "triton add_rms_norm_kernel": 2,
        "triton skinny_linear_kernel": 5,
        "triton qk_norm_rope_kernel": 2,
        "triton block_attention_kernel": 1,
    }, f"draft pass, per layer: {per_draft_layer}"


def test_a_split_attention_launches_once_per_layer_and_computes_what_one_split_does():
    """With the KV range split in two (what a GPU picks at batch 1, forced here), each layer's
    attention is still one launch, the split kernel merging its own splits, and every pass gives
    what the unsplit kernels give (float32, to the interpreter's accumulation order)."""
    _, unsplit = _counted(2, 1)
    (small, split), (large, _) = _counted(2, 1, kv_splits=2), _counted(3, 2, kv_splits=2)
    for name in ("verify", "AR"):
        per_layer = dict(large[name] - small[name])
        assert per_layer["triton target_attention_merged_kernel"] == 1 and "triton target_attention_kernel" not in per_layer
        assert sum(per_layer.values()) == 8, f"{name} pass, per layer: {per_layer}"
    per_draft_layer = dict(large["draft"] - small["draft"])
    assert per_draft_layer["triton block_attention_merged_kernel"] == 1 and sum(per_draft_layer.values()) == 10, per_draft_layer
    for name, out in split.items():
        torch.testing.assert_close(out, unsplit[name], atol=1e-5, rtol=1e-5, msg=name)


def test_with_dependent_launches_every_kernel_waits_for_the_kernel_ahead():
    """With the runtime's `dependent_launch` (a Hopper GPU's choice, allowed here), every Triton kernel
    of the verify, AR and draft passes, with the attention's KV range split, is launched as a
    dependent launch with its wait compiled in (never one half without the other); the passes
    launch the same kernels and torch ops as with ordinary launches, and compute their outputs bit
    for bit (the same arithmetic). Without `dependent_launch`, nothing is (the tests above)."""
    (plain, ordinary), (with_dependent, dependent) = _counted(2, 1, kv_splits=2), _counted(2, 1, kv_splits=2, dependent=True)
    for name, layer_kernels in (("verify", 2 * 8), ("AR", 2 * 8), ("draft", 10)):  # at least the layers' kernels
        want = {f"{op} (dependent)" if op.startswith("triton ") else op: count for op, count in plain[name].items()}
        assert dict(with_dependent[name]) == want, f"{name} pass: {dict(with_dependent[name])}"
        assert sum(count for op, count in want.items() if op.endswith(" (dependent)")) > layer_kernels, name
        assert torch.equal(dependent[name], ordinary[name]), name


def _verifications(dependent: bool) -> tuple[collections.Counter, list[torch.Tensor]]:
    """The launches and results of a tiny model's verification and draft sampling, with its kernels
    in Triton's interpreter (`dependent`: the runtime's dependent_launch, allowed off a Hopper GPU):
    a greedy step (split argmax, per-position decisions, commit), and a step of a greedy and a
    top-k + top-p row with the drafts sampled and verified by the shortlist kernels."""
    from trtllm_dflash.bench import gpu_step
    from trtllm_dflash.ops.kernels import dependent_launch
    from trtllm_dflash.runtime import verify_choice
    from trtllm_dflash.runtime.base import SamplingTensors, draft_positions
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    target, drafter = gpu_step.make_models(gpu_step.TINY, torch.device("cpu"), torch.float32)
    runtime = TorchRuntime(target, drafter, dependent_launch=dependent)
    runtime.verify_choices = verify_choice.VerifyChoices("shortlist")
    block, vocab = gpu_step.TINY.block, gpu_step.TINY.vocab
    g = torch.Generator().manual_seed(0)
    logits, draft_logits = torch.randn(2, block, vocab, generator=g) * 3, torch.randn(2, block - 1, vocab, generator=g) * 3
    block_tokens, starts = torch.randint(0, vocab, (2, block), generator=g), torch.tensor([20, 7])
    greedy = SamplingTensors(
        torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(2), torch.tensor([3, 4]), (True, True), (0, 0), (1.0, 1.0)
    )
    mixed = SamplingTensors(
        torch.tensor([0.0, 0.8]), torch.tensor([0, 50]), torch.tensor([1.0, 0.9]), torch.tensor([3, 4]), (True, False), (0, 50), (1.0, 0.9)
    )
    counter, results = LaunchCounter(), []
    with pytest.MonkeyPatch.context() as patch, torch.inference_mode(), counter:
        patch.setenv("TRITON_INTERPRET", "1")
        patch.setattr(dependent_launch, "supported", lambda device: True)
        results += runtime.verify(logits, block_tokens, None, greedy, starts)
        proposal = runtime.draft_head(draft_logits, mixed, draft_positions(starts, block - 1))
        block_tokens = torch.cat([block_tokens[:, :1], proposal.tokens], dim=1)
        results += [proposal.tokens, proposal.probs, *runtime.verify(logits, block_tokens, proposal.probs, mixed, starts)]
    return counter.counts, results


def test_verification_and_draft_sampling_wait_for_the_kernel_ahead_too():
    """After a pass, its verification and the drafter's sampling are chains of short kernels too (3
    for a greedy step; 6 for the shortlist's verification, 5 for its sampling). With the runtime's
    `dependent_launch`, each is launched as a dependent launch with its wait compiled in; the same
    kernels and torch ops run, and the tokens, q and decisions are bit for bit the ordinary ones."""
    (plain, ordinary), (with_dependent, dependent) = _verifications(False), _verifications(True)
    kernels = {op for op in plain if op.startswith("triton ")}
    assert {"triton verify_positions_kernel", "triton shortlist_sample_kernel", "triton shortlist_decide_kernel"} <= kernels, plain
    assert not any(op.endswith("dependent)") for op in plain), plain
    assert dict(with_dependent) == {f"{op} (dependent)" if op in kernels else op: count for op, count in plain.items()}
    for got, want in zip(dependent, ordinary, strict=True):
        assert torch.equal(got, want)
