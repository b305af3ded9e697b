"""The losslessness gate of a GPU CI job: the built engines must decode like the target.

    python -m trtllm_dflash.builder.lossless_gate OUT [--max-new-tokens 64] [--prompts FILE]

Greedy decoding with DFlash through the engines must give exactly the tokens of autoregressive
decoding through the same target engine (speculation changes nothing), and should agree with the
torch runtime on the original checkpoints (reported; 16-bit kernels may break near-ties
differently, so that comparison is a prefix-agreement figure, with a threshold). Exit status 0
when both hold, 1 otherwise, with a JSON report on stdout. Needs a GPU and the TensorRT flavour
the engines were built with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtllm_dflash.decoding import Decoder, Request, SamplingParams


def _decode(runtime, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    context = max(len(p) for p in prompts) + max_new_tokens + 1
    decoder = Decoder(runtime, max_batch=len(prompts), max_context=context)
    return [r.token_ids for r in decoder.generate(Request(p, SamplingParams(max_new_tokens=max_new_tokens)) for p in prompts)]


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="the --out directory of `dflash-trt build`")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=Path, help="one prompt per line (default: the built-in calibration text)")
    parser.add_argument("--min-torch-agreement", type=float, default=0.9, help="mean prefix agreement with the torch runtime")
    args = parser.parse_args(argv)

    import torch

    from trtllm_dflash.backends.artifact import read_manifest
    from trtllm_dflash.backends.trt import load_engine_pipeline
    from trtllm_dflash.builder.quantize import BUILTIN_CALIBRATION
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    manifest = read_manifest(args.build)
    pipe = load_engine_pipeline(args.build / manifest.get("engines", "engines"))
    lines = (args.prompts.read_text() if args.prompts else BUILTIN_CALIBRATION.read_text().replace("\\n", "\n")).splitlines()
    prompts = [pipe.encode(line)[:256] for line in lines if line.strip()][:8]

    runtime = pipe.runtime
    dflash = _decode(runtime, prompts, args.max_new_tokens)
    drafter_config, runtime.drafter_config = runtime.drafter_config, None  # the same target engine, no drafter
    autoregressive = _decode(runtime, prompts, args.max_new_tokens)
    runtime.drafter_config = drafter_config

    checkpoints = manifest["checkpoints"]
    target = load_target(checkpoints["target"], device="cuda", dtype=torch.bfloat16)
    reference = _decode(TorchRuntime(target.model, load_drafter(checkpoints["drafter"], target)), prompts, args.max_new_tokens)
    agreement = sum(_prefix(a, b) / max(len(b), 1) for a, b in zip(dflash, reference)) / len(prompts)
    report = {
        "dflash_equals_autoregressive": dflash == autoregressive,
        "torch_prefix_agreement": round(agreement, 4),
        "min_torch_agreement": args.min_torch_agreement,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
    }
    print(json.dumps(report, indent=2))
    return 0 if report["dflash_equals_autoregressive"] and agreement >= args.min_torch_agreement else 1


if __name__ == "__main__":
    sys.exit(main())
