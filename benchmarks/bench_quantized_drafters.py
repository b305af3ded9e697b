"""What quantizing the demo drafter costs in acceptance (issue 29): tau of the unquantized drafter,
FP8 and NVFP4 in ModelOpt's layout (testing.tiny.write_modelopt_drafter), and NVFP4 written by the build's
own path (ModelOpt NVFP4 PTQ with nvfp4.drafter_config, calibrated on CPU, then
quantize_drafter.write_quantized_drafter), all loaded by our loader (dequantized exactly) and
decoded side by side on the same held-out prompts (builder.validate.drafter_acceptance: greedy,
torch runtime; it fails unless every output equals the target's).

    python benchmarks/bench_quantized_drafters.py OUT_DIR [--new-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from trtllm_dflash.builder import nvfp4, validate
from trtllm_dflash.builder.quantize import calibration_batches
from trtllm_dflash.builder.quantize_drafter import drafter_forward, write_quantized_drafter
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.demo import DEMO_DIR
from trtllm_dflash.modeling.taps import HiddenTaps
from trtllm_dflash.recipes.schema import CalibrationSection
from trtllm_dflash.testing.tiny import write_modelopt_drafter


def build_path_nvfp4(target, out: Path) -> Path:
    """The demo drafter through the build's NVFP4 path (ModelOpt's calibration runs on CPU)."""
    import modelopt.torch.quantization as mtq

    drafter = load_drafter(DEMO_DIR / "drafter", target)
    decoder = target.model.get_decoder()
    taps = HiddenTaps(decoder.layers, drafter.config.target_layer_ids)
    batches = calibration_batches(target.tokenizer, CalibrationSection(num_samples=64, max_seq_len=256), "cpu")

    def forward_loop(model):
        for ids in batches:
            decoder(input_ids=ids, use_cache=False)
            drafter_forward(model, target.model, ids, taps.features())

    with torch.no_grad():
        quantized = mtq.quantize(drafter, nvfp4.drafter_config(), forward_loop=forward_loop)
    taps.remove()
    write_quantized_drafter(quantized, DEMO_DIR / "drafter", out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where the quantized drafters are written")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    target = load_target(DEMO_DIR / "target", require_tokenizer=True)
    dirs = {
        "nvfp4 (build path)": build_path_nvfp4(target, args.out / "nvfp4-build"),
        "nvfp4 (ModelOpt layout writer)": write_modelopt_drafter(DEMO_DIR / "drafter", args.out / "nvfp4-writer", "NVFP4"),
        "fp8 (ModelOpt layout writer)": write_modelopt_drafter(DEMO_DIR / "drafter", args.out / "fp8-writer", "FP8"),
    }
    drafters = {"unquantized": load_drafter(DEMO_DIR / "drafter", target)}
    drafters.update({name: load_drafter(path, target) for name, path in dirs.items()})
    lines = (DEMO_DIR / "heldout_prompts.jsonl").read_text().splitlines()
    prompts = [target.tokenizer(json.loads(line)["prompt"])["input_ids"] for line in lines]
    started = time.perf_counter()
    report = validate.drafter_acceptance(target.model, drafters, prompts, args.new_tokens)
    print(
        f"demo pair, {report['prompts']} held-out prompts, {args.new_tokens} new tokens, greedy, float32; "
        f"every output equals the target's ({time.perf_counter() - started:.0f} s)"
    )
    for name, tau in report["tau"].items():
        print(f"{name:<32} tau {tau:.3f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": platform.platform(),
                    "new_tokens": args.new_tokens,
                    "prompts": report["prompts"],
                    "tau": report["tau"],
                    "outputs_equal_target": report["outputs_equal_target"],
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
