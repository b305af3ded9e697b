"""How far ModelOpt's NVFP4 PTQ moves a target from its BF16 self: relative logit error and greedy agreement.

Measured with ModelOpt's fake quantization (on Hopper that is its NVFP4 emulation, on Blackwell
the same numerics), so it says what NVFP4 does to the model, not how fast it runs. Used by
tests/test_nvfp4_gpu.py and benchmarks/bench_nvfp4_accuracy.py (RESULTS.md quotes the latter).
"""

from __future__ import annotations

from typing import Any

import torch

from trtllm_dflash.builder import nvfp4


@torch.no_grad()
def _logits(model: torch.nn.Module, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(input_ids=ids, use_cache=False).logits.float() for ids in batches]


@torch.no_grad()
def nvfp4_accuracy(
    model: torch.nn.Module, calibration: list[torch.Tensor], evaluation: list[torch.Tensor], kv_cache: str = "fp8"
) -> dict[str, Any]:
    """Quantize `model` in place (NVFP4 weights and activations, FP8 KV) and compare its logits on
    `evaluation` with the BF16 model's: ||q - r|| / ||r|| over all positions, and the share of
    positions whose greedy (argmax) token is the same."""
    nvfp4.require_cuda("NVFP4 accuracy measurement")
    import modelopt.torch.quantization as mtq

    reference = _logits(model, evaluation)

    def forward_loop(m) -> None:
        for ids in calibration:
            m(input_ids=ids, use_cache=False)

    mtq.quantize(model, nvfp4.dense_config(kv_cache), forward_loop=forward_loop)
    quantized = _logits(model, evaluation)
    diff = sum(float((q - r).pow(2).sum()) for q, r in zip(quantized, reference))
    norm = sum(float(r.pow(2).sum()) for r in reference)
    same = sum(int((q.argmax(-1) == r.argmax(-1)).sum()) for q, r in zip(quantized, reference))
    positions = sum(r.shape[0] * r.shape[1] for r in reference)
    return {
        "relative_logit_error": (diff / norm) ** 0.5,
        "greedy_agreement": same / positions,
        "positions": positions,
        "quantized_linears": sum(1 for name, m in model.named_modules() if name.endswith("weight_quantizer") and m.is_enabled),
        "gpu": torch.cuda.get_device_name(),
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "emulated": torch.cuda.get_device_capability()[0] < 10,
    }


def random_token_batches(vocab_size: int, count: int, length: int, seed: int, device: str = "cuda") -> list[torch.Tensor]:
    """Fixed-seed token ids (a random-weight model has no tokenizer worth calibrating with)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (1, length), generator=generator).to(device) for _ in range(count)]


def demo_target_accuracy(samples: int = 12, max_len: int = 128) -> dict[str, Any]:
    """The embedded demo target: calibrated on half the built-in text (24 samples), evaluated on the other half."""
    nvfp4.require_cuda("NVFP4 accuracy measurement")
    from trtllm_dflash.builder.quantize import calibration_batches
    from trtllm_dflash.checkpoints import load_target
    from trtllm_dflash.recipes.schema import CalibrationSection

    target = load_target("demo", device="cuda", dtype=torch.bfloat16, require_tokenizer=True)
    batches = calibration_batches(target.tokenizer, CalibrationSection(num_samples=2 * samples, max_seq_len=max_len), "cuda")
    result = nvfp4_accuracy(target.model.eval(), batches[:samples], batches[samples:])
    return {"model": "demo target", **result}


def qwen3_8b_shaped_accuracy(samples: int = 8, length: int = 128, seed: int = 0) -> dict[str, Any]:
    """A 2-layer model of Qwen3-8B's width (hidden 4096, 32/8 heads, head_dim 128, MLP 12288,
    vocab 151936), random weights from a fixed seed, on fixed-seed random tokens."""
    nvfp4.require_cuda("NVFP4 accuracy measurement")
    from trtllm_dflash.testing.qwen3_8b_shaped import make_qwen3_8b_shaped_target

    model = make_qwen3_8b_shaped_target(num_layers=2, device="cuda", seed=seed)
    vocab = model.config.vocab_size
    calibration = random_token_batches(vocab, samples, length, seed + 1)
    evaluation = random_token_batches(vocab, samples, length, seed + 2)
    return {"model": "Qwen3-8B-shaped, 2 layers, random init (seed %d)" % seed, **nvfp4_accuracy(model, calibration, evaluation)}
