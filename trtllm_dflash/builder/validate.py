"""Do the exported graphs compute what the torch runtime computes? Checked on CPU before any engine.

Both runtimes get the same calls through the `Runtime` interface: a ragged prefill, a verify
step on top of the filled cache, and two drafter steps (the second with a non-empty draft cache).
Logits (for a verifying target graph, which returns none: its accepted counts and bonus tokens,
which must be equal), hidden-state taps, draft logits (a V2 drafter's unary logits; a V2 graph that
walks its selector inside returns none), a V2 drafter's proposals (greedy and sampled with fixed
seeds: equal tokens, close q) and the KV caches written by each runtime are compared
(per layer, with each layer's own shape; layers that keep no cache in the torch runtime, such as
Gemma 4's KV-sharing layers, must keep none in the graphs either); then a short greedy
speculative decode must give the same tokens.

Like is compared with like: the graphs hold weights rounded to their dtype (BF16, FP16) and run
here as a float32 copy (onnxruntime has no 16-bit CPU kernels), so the reference is the torch
runtime on the same rounded weights, also in float32. The tolerance follows from the arithmetic
both sides ran in (`tolerance_for`): float32 leaves only the order of operations, so any
difference above it is the graph computing something else (a rounded constant, a wrong mask).
The decisive check is the greedy speculative decode, which must give the same tokens.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch

from trtllm_dflash.drafters import kind_of
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.base import Runtime, SamplingTensors

if TYPE_CHECKING:
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

# The smallest relative tolerance (max |a - b| / max |b|) of any comparison. In float32 the graphs
# of the trained demo pair match the torch runtime to ~1e-6 through its 8 + 3 layers; a BF16
# attention scale rounded by 0.25% (issue 12) gave 1.4e-3, a wrong mask or tap far more.
TOLERANCE = 1e-3


def unit_roundoff(dtype: torch.dtype) -> float:
    """The largest relative error of one rounding to `dtype` (half its machine epsilon)."""
    return torch.finfo(dtype).eps / 2


def tolerance_for(dtype: torch.dtype, depth: int) -> float:
    """Relative tolerance for outputs computed in `dtype` arithmetic through `depth` layers.

    Each layer's roundings are independent, so their errors add up like a random walk:
    u(dtype) * sqrt(depth), never below TOLERANCE. float32: 1e-3 at any depth of a real model;
    bf16 (u = 2^-8) through 11 layers: 1.3e-2; fp16 (u = 2^-11): 1.6e-3.
    """
    return max(TOLERANCE, unit_roundoff(dtype) * math.sqrt(max(depth, 1)))


def signal_depth(reference: TorchRuntime) -> int:
    """Layers the deepest compared output went through: the target's, then the drafter's (draft logits)."""
    drafter = reference.drafter_config.num_hidden_layers if reference.has_drafter else 0
    return reference.num_layers + drafter


class ValidationError(DFlashError):
    """The exported graphs disagree with the torch runtime."""


@dataclasses.dataclass
class Comparison:
    name: str
    max_abs: float
    rel: float
    argmax_agree: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 8) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}


def compare(name: str, candidate: torch.Tensor, reference: torch.Tensor, logits: bool = False) -> Comparison:
    candidate, reference = candidate.float(), reference.float()
    if candidate.shape != reference.shape:
        raise ValidationError(f"{name}: shape {tuple(candidate.shape)} != reference {tuple(reference.shape)}", "re-export the graphs")
    diff = float((candidate - reference).abs().max()) if reference.numel() else 0.0
    scale = float(reference.abs().max()) if reference.numel() else 1.0
    agree = float((candidate.argmax(-1) == reference.argmax(-1)).float().mean()) if logits else None
    return Comparison(name, diff, diff / max(scale, 1e-12), agree)


def same_tokens(name: str, candidate: torch.Tensor, reference: torch.Tensor) -> Comparison:
    """Token outputs (accepted counts, bonus tokens) must be equal: relative error 0, else infinite."""
    mismatches = int((candidate.cpu() != reference.cpu()).sum())
    return Comparison(name, float(mismatches), 0.0 if mismatches == 0 else float("inf"))


def compare_runtimes(
    candidate: Runtime, reference: Runtime, block_size: int, prompt_lengths: tuple[int, int] = (7, 4), seed: int = 0
) -> list[Comparison]:
    """Drive both runtimes through prefill, verify and two draft steps; compare every output."""
    generator = torch.Generator().manual_seed(seed)
    vocab = reference.vocab_size
    lengths = torch.tensor(prompt_lengths)
    span = int(lengths.max())
    capacity = span + 3 * block_size + 4
    for runtime in (candidate, reference):
        runtime.allocate(2, capacity)
    rows = slice(0, 2)
    results: list[Comparison] = []

    prompt = torch.randint(3, vocab, (2, span), generator=generator)
    block = torch.randint(3, vocab, (2, block_size), generator=generator)
    zeros = torch.zeros(2, dtype=torch.long)
    if getattr(candidate, "target_verifies", False):  # the plugin target graph returns verification results, not logits
        greedy = SamplingTensors(torch.zeros(2), zeros, torch.ones(2), zeros)
        outs = [rt.target_verify(rows, prompt, zeros, span, None, greedy, logits_at=lengths - 1) for rt in (candidate, reference)]
        results.append(same_tokens("prefill.bonus", outs[0].bonus, outs[1].bonus))
        block[:, 0] = outs[1].bonus  # the anchor is the token the prefill emitted, as in a decode
        verify = [rt.target_verify(rows, block, lengths, span + block_size, None, greedy) for rt in (candidate, reference)]
        results.append(same_tokens("verify.accepted", verify[0].accepted, verify[1].accepted))
        results.append(same_tokens("verify.bonus", verify[0].bonus, verify[1].bonus))
    else:
        outs = [rt.target_forward(rows, prompt, zeros, span, logits_at=lengths - 1) for rt in (candidate, reference)]
        results.append(compare("prefill.logits", outs[0].logits, outs[1].logits, logits=True))
        verify = [rt.target_forward(rows, block, lengths, span + block_size) for rt in (candidate, reference)]
        results.append(compare("verify.logits", verify[0].logits, verify[1].logits, logits=True))
    if outs[1].features is not None:
        results.append(compare("prefill.features", outs[0].features, outs[1].features))
    prefill_features = outs[1].features
    if verify[1].features is not None:
        results.append(compare("verify.features", verify[0].features, verify[1].features))

    if reference.has_drafter and candidate.has_drafter:
        mask = reference.drafter_config.mask_token_id
        draft_block = torch.full((2, block_size), mask, dtype=torch.long)
        draft_block[:, 0] = block[:, 0]
        accepted = torch.tensor([min(2, block_size - 1), 0])
        steps = {
            "empty draft cache": (prefill_features, lengths, torch.zeros(2, dtype=torch.long)),
            "filled draft cache": (verify[1].features, accepted + 1, lengths),
        }
        for label, (features, counts, cache_lens) in steps.items():
            if _has_draft_logits(candidate):
                logits = [rt.draft_forward(rows, draft_block, features, counts, cache_lens) for rt in (candidate, reference)]
                results.append(compare(f"draft.logits ({label})", logits[0], logits[1], logits=True))
            if kind_of(reference.drafter_config).candidate_selector:  # the selector's walk: the same drafts and the same q
                results.extend(_compare_proposals(candidate, reference, rows, (draft_block, features, counts, cache_lens), label))

    written = int(lengths.max()) + block_size
    # the drafter's context: after the two draft steps, each row holds lengths + accepted + 1 positions
    # (past them a runtime may keep scratch, e.g. the torch runtime's block K/V on a CPU: see
    # modeling/draft_attention.py)
    drafted = (lengths + accepted + 1).tolist() if reference.has_drafter and candidate.has_drafter else None
    for label, cand_cache, ref_cache in _caches(candidate, reference):
        for i, (a, b) in enumerate(zip(cand_cache.layers, ref_cache.layers)):
            if (a.keys is None) != (b.keys is None):  # a layer that owns a cache in one runtime only
                owner = "the graphs" if b.keys is None else "the torch runtime"
                raise ValidationError(f"{label} layer {i} keeps a cache only in {owner}", "this is a bug in the export; report it")
            if b.keys is None:  # a KV-sharing layer: it reads another layer's K/V and writes none
                continue
            if label == "draft_cache" and drafted is not None:
                keep = lambda t: torch.cat([t[r, :n] for r, n in enumerate(drafted)])  # noqa: E731
            else:
                keep = lambda t: t[:, :written]  # noqa: E731
            results.append(compare(f"{label}.key[{i}]", keep(a.keys), keep(b.keys)))
            results.append(compare(f"{label}.value[{i}]", keep(a.values), keep(b.values)))
    return results


def _has_draft_logits(runtime: Runtime) -> bool:
    """False for a V2 drafter graph that walks its selector inside (it returns draft tokens)."""
    from trtllm_dflash.drafters.dflash2.graph import HEAD_PLUGIN

    graph = getattr(runtime, "drafter", None)
    return not (isinstance(graph, dict) and graph.get("head") == HEAD_PLUGIN)


def _compare_proposals(candidate: Runtime, reference: Runtime, rows: slice, args: tuple, label: str) -> list[Comparison]:
    """A V2 drafter's proposals for one draft step, greedy and sampled (fixed seeds): equal tokens,
    close q. Proposing again writes the same context K/V into the draft cache (same slots, same values)."""
    zeros = torch.zeros(2, dtype=torch.long)
    settings = {
        "greedy": SamplingTensors(torch.zeros(2), zeros, torch.ones(2), zeros),
        "sampled": SamplingTensors(torch.tensor([1.0, 0.7]), zeros, torch.ones(2), torch.tensor([11, 12])),
    }
    results = []
    for name, sampling in settings.items():
        got, expected = (rt.propose(rows, *args, sampling) for rt in (candidate, reference))
        results.append(same_tokens(f"draft.tokens ({name}, {label})", got.tokens, expected.tokens))
        if expected.probs is not None:
            results.append(compare(f"draft.q ({name}, {label})", got.probs, expected.probs))
    return results


def _caches(candidate: Runtime, reference: Runtime):
    for label in ("target_cache", "draft_cache"):
        a, b = getattr(candidate, label, None), getattr(reference, label, None)
        if a is not None and b is not None:
            yield label, a, b


def check(results: list[Comparison], tolerance: float, graphs: str = "the ONNX graphs") -> None:
    """Raise on the worst comparison above `tolerance`."""
    worst = max(results, key=lambda c: c.rel)
    if worst.rel > tolerance:
        how = (
            f"{int(worst.max_abs)} token(s) differ"
            if math.isinf(worst.rel)
            else f"relative error {worst.rel:.2e} > tolerance {tolerance:.2e}"
        )
        raise ValidationError(
            f"output {worst.name} of {graphs} differs from the torch runtime ({how})",
            "this is a bug in the export; report it with the build's manifest.json",
        )


def greedy_tokens(runtime: Runtime, prompts: list[list[int]], max_new_tokens: int, block_size: int | None = None) -> list[list[int]]:
    """Greedy speculative decode through the decoding loop (the losslessness check)."""
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams

    context = max(len(p) for p in prompts) + max_new_tokens + 1
    decoder = Decoder(runtime, max_batch=len(prompts), max_context=context, block_size=block_size)
    results = decoder.generate([Request(list(p), SamplingParams(max_new_tokens=max_new_tokens)) for p in prompts])
    return [r.token_ids for r in results]


VALIDATION_PROMPTS = ((5, 6, 7, 8, 9, 10, 11, 12, 13), (40, 43, 46, 49))


def validate_graphs(
    candidate: Runtime, reference: TorchRuntime, block_size: int, max_new_tokens: int = 24, graphs: str = "the graphs"
) -> dict[str, Any]:
    """Everything the build's validate stage checks, for one pair of runtimes: the numerics of
    prefill, verify and draft steps (`compare_runtimes`) within the tolerance of the reference's
    arithmetic dtype over the layers the signal went through (`tolerance_for`), then a greedy
    speculative decode that must give the torch runtime's tokens (decisive). The candidate must
    compute at least as precisely as the reference (ONNX graphs on CPU: float32). Raises
    ValidationError; returns the report, with the tolerance and how it was derived."""
    depth = signal_depth(reference)
    tolerance = tolerance_for(reference.dtype, depth)
    results = compare_runtimes(candidate, reference, block_size)
    check(results, tolerance, graphs)
    prompts = [[token % reference.vocab_size for token in prompt] for prompt in VALIDATION_PROMPTS]
    with torch.no_grad():
        expected = greedy_tokens(reference, prompts, max_new_tokens)
        got = greedy_tokens(candidate, prompts, max_new_tokens)
    if got != expected:
        raise ValidationError(f"a greedy decode through {graphs} diverges from the torch runtime", "this is an export bug; report it")
    dtype = str(reference.dtype).removeprefix("torch.")
    return {
        "max_relative_error": max(r.rel for r in results),
        "tolerance": tolerance,
        "tolerance_rule": f"max({TOLERANCE:g}, u({dtype}) * sqrt(depth)) = "
        f"max({TOLERANCE:g}, {unit_roundoff(reference.dtype):.3g} * sqrt({depth}))",
        "evaluated_in": dtype,
        "depth": depth,
        "comparisons": [r.to_dict() for r in results],
        "greedy_decode_equal": True,
        "greedy_tokens": got,
    }


# ----------------------------------------------------------------------------- a quantized drafter's acceptance


def decode_with(target_model, drafter, prompts: list[list[int]], max_new_tokens: int):
    """Greedy results (tokens, acceptance lengths) of the torch runtime: speculative with `drafter`,
    autoregressive without one."""
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    context = max(len(p) for p in prompts) + max_new_tokens + 1
    decoder = Decoder(TorchRuntime(target_model, drafter), max_batch=len(prompts), max_context=context)
    with torch.no_grad():
        return decoder.generate([Request(list(p), SamplingParams(max_new_tokens=max_new_tokens)) for p in prompts])


def pooled_tau(results) -> float:
    """Mean acceptance length over every verify step of every prompt (as `dflash-trt bench` pools it)."""
    lengths = [a for r in results for a in r.acceptance_lengths]
    return sum(lengths) / len(lengths) if lengths else 0.0


def drafter_acceptance(target_model, drafters: dict[str, Any], prompts: list[list[int]], max_new_tokens: int = 32) -> dict[str, Any]:
    """The acceptance (tau) of each drafter in `drafters` (e.g. {"bf16": ..., "nvfp4": ...}) on the
    same prompts, greedy, through the torch runtime; every output must be the target's own greedy
    output (autoregressive, same target), else ValidationError. A quantized drafter changes only tau,
    so tau beside the unquantized drafter's is what its quantization cost."""
    expected = [r.token_ids for r in decode_with(target_model, None, prompts, max_new_tokens)]
    report: dict[str, Any] = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "tau": {}, "per_prompt_tau": {}}
    for name, drafter in drafters.items():
        results = decode_with(target_model, drafter, prompts, max_new_tokens)
        if [r.token_ids for r in results] != expected:
            raise ValidationError(
                f"greedy decoding with the {name} drafter differs from the target's own output",
                "this is a bug in the drafter loading or the decoding loop; report it with the build's manifest.json",
            )
        report["tau"][name] = round(pooled_tau(results), 4)
        report["per_prompt_tau"][name] = [round(r.mean_acceptance_length, 4) for r in results]
    report["outputs_equal_target"] = True
    return report


def quantized_drafter_acceptance(
    target_dir,
    drafter_dir,
    quantized_dir,
    calibration,
    progress=lambda text: None,
    num_prompts: int = 8,
    prompt_tokens: int = 64,
    max_new_tokens: int = 32,
) -> dict[str, Any]:
    """The build's check of a quantized drafter: loaded by our loader (dequantized exactly, the
    same files TensorRT-LLM gets), its tau beside the unquantized drafter's on the same prompts
    (the first `prompt_tokens` of each calibration sample), both decoding the target's own output.
    Runs on CUDA when there is a GPU, else on CPU, in the target's bf16 on CUDA, float32 on CPU."""
    from trtllm_dflash.builder.quantize import calibration_texts
    from trtllm_dflash.checkpoints import load_drafter, load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    progress("measuring the quantized drafter's acceptance against the unquantized one")
    target = load_target(target_dir, device=device, dtype=dtype, require_tokenizer=True)
    prompts = [target.tokenizer(text)["input_ids"][:prompt_tokens] for text in calibration_texts(calibration)]
    prompts = [p for p in prompts if len(p) >= 2][:num_prompts]
    if not prompts:
        raise ValidationError("no calibration sample gives a prompt of 2 tokens or more", "give longer calibration samples")
    drafters = {"unquantized": load_drafter(drafter_dir, target), "quantized": load_drafter(quantized_dir, target)}
    report = drafter_acceptance(target.model, drafters, prompts, max_new_tokens)
    report.update(device=device, dtype=str(dtype).removeprefix("torch."), prompt_source="calibration samples, first tokens")
    return report
