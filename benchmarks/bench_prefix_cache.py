"""Time to first token behind a shared prefix, with and without the prefix cache, side by side.

The shipped demo pair on the torch runtime (float32), batch 1: prompts of a shared prefix (the first
`--prefix` tokens of a standard-library source file, standing in for a system prompt or a chat's
history) followed by `--suffix` tokens of their own, each decoded by a Decoder with a prefix cache
(primed by one request) and by one without, interleaved in one process (the order alternates per
prompt, so machine noise falls on both); the prompts' own `--suffix` tokens alone, cold, beside them.
Every pair of runs must give the same tokens and acceptance lengths.

    python benchmarks/bench_prefix_cache.py --json benchmarks/results/prefix-cache-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import platform
import statistics
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=int, default=1400, help="shared prefix tokens")
    parser.add_argument("--suffix", type=int, default=64, help="tokens of each prompt after the prefix")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--block", type=int, default=64, help="prefix cache block (tokens)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import argparse as argparse_module
    import json as json_module

    from transformers import AutoTokenizer

    from trtllm_dflash import demo
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams
    from trtllm_dflash.runtime.prefix_cache import PrefixCache
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    tokenizer = AutoTokenizer.from_pretrained(demo.target_dir())
    prefix = tokenizer.encode(inspect.getsource(argparse_module))[: args.prefix]
    other = tokenizer.encode(inspect.getsource(json_module.decoder))
    suffixes = [other[i * args.suffix : (i + 1) * args.suffix] for i in range(args.prompts + 1)]
    target = load_target(demo.target_dir(), dtype=torch.float32)
    runtime = TorchRuntime(target.model, load_drafter(demo.drafter_dir(), target))
    context = args.prefix + args.suffix + args.new_tokens + 8
    cache = PrefixCache(1 << 30, args.block)
    warm = Decoder(runtime, max_batch=1, max_context=context, prefix_cache=cache)
    cold = Decoder(runtime, max_batch=1, max_context=context)  # both allocate the same caches: one decodes at a time
    params = SamplingParams(max_new_tokens=args.new_tokens, stop_token_ids=())
    warm.generate([Request(prefix + suffixes[-1], params)])  # primes the cache with the prefix's blocks
    primed = cache.nbytes

    times: dict[str, list[float]] = {"cached prefix": [], "no cache": [], "suffix alone": []}
    restored, same = [], True
    for i, suffix in enumerate(suffixes[:-1]):
        runs = [("cached prefix", warm, prefix + suffix), ("no cache", cold, prefix + suffix), ("suffix alone", cold, suffix)]
        results = {}
        for name, decoder, prompt in runs if i % 2 == 0 else runs[::-1]:
            results[name] = decoder.generate([Request(prompt, params)])[0]
            times[name].append(results[name].time_to_first_token)
        a, b = results["cached prefix"], results["no cache"]
        same &= a.token_ids == b.token_ids and a.acceptance_lengths == b.acceptance_lengths
        restored.append(a.cached_prompt_tokens)

    medians = {name: statistics.median(values) for name, values in times.items()}
    report = {
        "command": "python benchmarks/bench_prefix_cache.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "json"),
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "model": "demo pair (8-layer Qwen3-architecture target, 3-layer drafter), float32, torch runtime, batch 1",
        "prompt_tokens": args.prefix + args.suffix,
        "restored_tokens": restored,
        "ttft_median_ms": {name: round(1000 * value, 2) for name, value in medians.items()},
        "ttft_ms": {name: [round(1000 * v, 2) for v in values] for name, values in times.items()},
        "speedup_of_cache": round(medians["no cache"] / medians["cached prefix"], 2),
        "cached_over_suffix_alone": round(medians["cached prefix"] / medians["suffix alone"], 2),
        "cache_bytes_for_prefix": primed,
        "cache_bytes_per_token": primed // (cache.storable(args.prefix + args.suffix) * args.block),
        "identical_outputs": same,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if not same:
        raise SystemExit("outputs differ between the cached and the uncached runs")


if __name__ == "__main__":
    main()
