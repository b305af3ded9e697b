"""Batch-1 decoding against z-lab's reference loop, side by side in one process.

For each pair (the embedded demo pair, and a pair of our own in z-lab's layout), on the same
prompts, greedy, 64 new tokens, batch 1, this times z-lab's `dflash_generate` and our torch
runtime through the public path (`DFlashPipeline.generate`), interleaved prompt by prompt (the
order alternates), checks that both produce exactly the target's greedy tokens, and prints wall
time, the ratio (z-lab time / our time: above 1 means we are faster) and tau (mean committed
tokens per verify step) for both.

    python benchmarks/bench_reference_loop.py --zlab-dir /path/to/z-lab/dflash

z-lab's code is imported from `--zlab-dir` (a checkout of github.com/z-lab/dflash) and never
copied into this repository. Its loop times itself with `torch.cuda.synchronize()`; on a CPU
machine this script replaces that timer (`dflash.model._cuda_time`) with `time.perf_counter`
at run time. Its loop also calls `DynamicCache.crop(length)` with the older transformers meaning
(keep the first `length` tokens); transformers 5.24 takes a negative count to remove instead, so
the script hands z-lab's module a DynamicCache whose `crop` keeps the old meaning (it removes
`seq_length - length` tokens). Nothing else of z-lab's code is changed.

Pairs:
- `demo`: trtllm_dflash/demo (already in z-lab's layout: a Qwen3 target directory and a drafter
  directory with config.json + model.safetensors), on the held-out demo prompts.
- `cycle`: a wider 8-layer Qwen3 target trained for a few seconds to continue two token cycles,
  with a 2-layer drafter distilled from it (the recipe of `tiny.make_cycle_pair`, at a size
  where one generation takes a good fraction of a second), written in z-lab's layout to
  `--work-dir` and reused from there; its prompts are cycle windows (the demo prompts mean
  nothing to it). Its acceptance is high, the demo pair's moderate: two regimes.

`--contexts 150,1000,2000,3500` instead times the per-step cost against the context length on a
third pair, `long` (see `context_curve`): DFlash and AR (z-lab's loop at block 1), ours vs z-lab's.

`--profile` also prints where our step time goes (see `step_breakdown`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from trtllm_dflash import DFlashPipeline
from trtllm_dflash.checkpoints import save_drafter

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "trtllm_dflash" / "demo"


def import_zlab(zlab_dir: Path):
    """z-lab's `dflash.model` from a checkout, with its CUDA-only timer replaced on CPU."""
    if not (zlab_dir / "dflash" / "model.py").is_file():
        sys.exit(f"no dflash/model.py under {zlab_dir}: git clone https://github.com/z-lab/dflash and pass --zlab-dir to it")
    sys.path.insert(0, str(zlab_dir))
    import dflash.model as zlab

    if not torch.cuda.is_available():
        zlab._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize()
    zlab.DynamicCache = _AbsoluteCropCache
    return zlab


def _absolute_crop_cache():
    from transformers import DynamicCache

    class AbsoluteCropCache(DynamicCache):
        """`crop(length)` keeps the first `length` tokens (what z-lab's loop expects)."""

        def crop(self, length: int) -> None:
            remove = length - self.get_seq_length()
            if remove < 0:
                super().crop(remove)

    return AbsoluteCropCache


_AbsoluteCropCache = _absolute_crop_cache()


# ----------------------------------------------------------------------------- pairs


def demo_pair() -> tuple[Path, Path, list[list[int]]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEMO / "target")
    lines = (DEMO / "heldout_prompts.jsonl").read_text().splitlines()
    prompts = [tokenizer(json.loads(line)["prompt"], add_special_tokens=False)["input_ids"] for line in lines if line.strip()]
    return DEMO / "target", DEMO / "drafter", prompts


def cycle_pair(
    root: Path, count: int, num_layers: int = 8, hidden: int = 256, prompt_len: int = 20, max_positions: int = 1024
) -> tuple[Path, Path, list[list[int]]]:
    """A trained cycle target (default hidden 256, 8 layers) and its distilled drafter, made once under root."""
    from trtllm_dflash.testing import tiny

    target_dir, drafter_dir = root / "target", root / "drafter"
    generator = torch.Generator().manual_seed(1)
    if not (drafter_dir / "model.safetensors").is_file():
        from transformers import AutoModelForCausalLM

        from trtllm_dflash.modeling.drafter import DFlashDrafter
        from trtllm_dflash.training.trainer import DrafterTrainer, TrainConfig

        torch.manual_seed(0)
        config = tiny.tiny_target_config("qwen3", vocab_size=128, num_layers=num_layers, hidden_size=hidden)
        config.max_position_embeddings = max_positions
        target = AutoModelForCausalLM.from_config(config)
        optimizer = torch.optim.AdamW(target.parameters(), lr=2e-3)
        for _ in range(150):
            batch = tiny.cycle_sequences(16, 24, generator)
            loss = target(input_ids=batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        target.eval()
        target.save_pretrained(target_dir, safe_serialization=True)
        drafter_config = tiny.tiny_drafter_config(
            config, num_layers=2, block_size=8, target_layer_ids=(1, num_layers // 2, num_layers - 2), mask_token_id=0
        )
        drafter = DFlashDrafter(drafter_config)
        trainer = DrafterTrainer(target, drafter, TrainConfig(steps=200, lr=3e-3, anchors=16, seed=0))

        def batches():
            while True:
                batch = tiny.cycle_sequences(8, 96, generator)
                yield batch, torch.ones_like(batch)

        trainer.train(batches())
        trainer.close()
        save_drafter(drafter, drafter_dir)
    prompts = tiny.cycle_sequences(count, prompt_len, torch.Generator().manual_seed(7)).tolist()
    return target_dir, drafter_dir, prompts


# ----------------------------------------------------------------------------- the two loops


def target_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """The target's own greedy continuation (plain transformers, one token per forward)."""
    from transformers import DynamicCache

    ids = torch.tensor([prompt], device=model.device)
    cache, out = DynamicCache(), []
    with torch.inference_mode():
        for _ in range(new_tokens):
            logits = model(ids, past_key_values=cache, use_cache=True).logits[:, -1]
            token = int(logits.argmax(-1))
            out.append(token)
            ids = torch.tensor([[token]], device=model.device)
    return out


def run_zlab(zlab, draft, target, prompt: list[int], new_tokens: int, block_size: int | None = None):
    """(wall s, tokens, acceptance lengths, time to first token s) of z-lab's `dflash_generate`;
    `block_size=1` is its loop without a drafter (autoregressive)."""
    started = time.perf_counter()
    stats = zlab.dflash_generate(
        draft,
        target,
        torch.tensor([prompt], device=target.device),
        max_new_tokens=new_tokens,
        stop_token_ids=None,
        temperature=0.0,
        block_size=block_size,
        return_stats=True,
    )
    elapsed = time.perf_counter() - started
    return elapsed, stats.output_ids[0, len(prompt) :].tolist(), list(stats.acceptance_lengths), stats.time_to_first_token


def run_ours(pipe: DFlashPipeline, prompt: list[int], new_tokens: int):
    """(wall s, tokens, acceptance lengths, time to first token s) of our public path."""
    started = time.perf_counter()
    out = pipe.generate([prompt], max_new_tokens=new_tokens, stop_token_ids=(), max_batch=1)[0]
    elapsed = time.perf_counter() - started
    return elapsed, out.token_ids, out.acceptance_lengths, out.time_to_first_token


def compare(name: str, zlab, target_dir: Path, drafter_dir: Path, prompts: list[list[int]], args) -> dict:
    from transformers import AutoModelForCausalLM

    pipe = DFlashPipeline.load(target_dir, drafter_dir, device=args.device, dtype=torch.float32, **ours_options(args))
    # z-lab gets its own copy of the target (ours carries forward hooks for the taps)
    zlab_target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(args.device).eval()
    zlab_draft = zlab.DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.float32).to(args.device).eval()
    expected = [target_greedy(zlab_target, p, args.max_new_tokens) for p in prompts]

    run_ours(pipe, prompts[0], args.max_new_tokens)  # warm-up both (allocation, first-call costs)
    run_zlab(zlab, zlab_draft, zlab_target, prompts[0], args.max_new_tokens)
    times = {"ours": 0.0, "zlab": 0.0}
    steps = {"ours": [], "zlab": []}
    mismatches = {"ours": 0, "zlab": 0}
    for repeat in range(args.repeats):
        for i, prompt in enumerate(prompts):
            order = ("ours", "zlab") if (i + repeat) % 2 == 0 else ("zlab", "ours")
            for who in order:
                if who == "ours":
                    elapsed, tokens, accepted, _ = run_ours(pipe, prompt, args.max_new_tokens)
                else:
                    elapsed, tokens, accepted, _ = run_zlab(zlab, zlab_draft, zlab_target, prompt, args.max_new_tokens)
                times[who] += elapsed
                steps[who] += accepted
                mismatches[who] += tokens != expected[i]
    generations = args.repeats * len(prompts)
    result = {
        "pair": name,
        "generations": generations,
        "ours_s": round(times["ours"], 3),
        "zlab_s": round(times["zlab"], 3),
        "speedup_vs_zlab": round(times["zlab"] / times["ours"], 3),
        "tau_ours": round(sum(steps["ours"]) / len(steps["ours"]), 2),
        "tau_zlab": round(sum(steps["zlab"]) / len(steps["zlab"]), 2),
        "ours_identical_to_greedy": mismatches["ours"] == 0,
        "zlab_identical_to_greedy": mismatches["zlab"] == 0,
    }
    print(
        f"{name}: {generations} generations, ours {times['ours']:.3f} s, z-lab {times['zlab']:.3f} s, "
        f"ours {result['speedup_vs_zlab']:.2f}x z-lab's speed; tau ours {result['tau_ours']} z-lab {result['tau_zlab']}; "
        f"identical to target greedy: ours {result['ours_identical_to_greedy']} z-lab {result['zlab_identical_to_greedy']}",
        flush=True,
    )
    if args.profile:
        result["breakdown"] = step_breakdown(pipe, prompts, args.max_new_tokens)
        print(f"{name} step breakdown (ms per step): {json.dumps(result['breakdown'])}", flush=True)
    return result


# ----------------------------------------------------------------------------- where our step time goes


def step_breakdown(pipe: DFlashPipeline, prompts: list[list[int]], new_tokens: int) -> dict:
    """Milliseconds per decode step in each phase, from wall clocks around the calls that exist.

    draft: the whole drafter pass (embedding, context projection, layers, draft LM head), of which
    context_kv (fc + hidden_norm, where a separate call), drafter_kv (the K/V projections of block
    and context rows; in the fused step also the block's queries) and draft_attention (block
    attention, including appending the new context K/V to the draft cache); verify: the target's
    forward pass with its cache writes, of which masks and taps (where a separate call);
    verify_op: the verification; rest: everything else in a step (draft sampling, the host read,
    cache bookkeeping, Python per step). The prefill's target pass counts in verify too.
    """
    from trtllm_dflash.modeling import drafter as drafter_module

    runtime = pipe.runtime
    clocks: dict[str, float] = {}
    names = {
        "draft_forward": "draft",
        "target_forward": "verify",
        "verify": "verify_op",
        "attention_masks": "masks",
        "commit": "commit",
        "features": "taps",
        "context_hidden": "context_kv",
        "project_keys_values": "drafter_kv",
        "project_step": "drafter_kv",
        "block_attention": "draft_attention",
    }
    owners = [runtime, runtime.taps, runtime.drafter, drafter_module.ops]
    owners += [layer.self_attn for layer in runtime.drafter.layers]
    originals = [(obj, attr, getattr(obj, attr)) for obj in owners for attr in names if attr in dir(obj)]

    def timed(name, fn):
        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                clocks[name] = clocks.get(name, 0.0) + time.perf_counter() - started

        return wrapper

    for obj, attr, fn in originals:
        setattr(obj, attr, timed(names[attr], fn))
    decoder = pipe.decoder(1)
    total, steps = 0.0, 0
    try:
        for prompt in prompts:
            pipe.generate([prompt], max_new_tokens=new_tokens, stop_token_ids=(), max_batch=1)  # warm
        clocks.clear()
        for prompt in prompts:
            decoder.stats.clear()
            started = time.perf_counter()
            pipe.generate([prompt], max_new_tokens=new_tokens, stop_token_ids=(), max_batch=1)
            total += time.perf_counter() - started
            steps += len(decoder.stats)
    finally:
        for obj, attr, fn in originals:
            setattr(obj, attr, fn)
    per_step = {name: round(1000 * seconds / steps, 3) for name, seconds in sorted(clocks.items())}
    per_step["step_total"] = round(1000 * total / steps, 3)
    known = per_step.get("draft", 0) + per_step.get("verify", 0) + per_step.get("verify_op", 0)
    per_step["rest"] = round(per_step["step_total"] - known, 3)
    per_step["steps"] = steps
    return per_step


# ----------------------------------------------------------------------------- cost against the context


def context_curve(zlab, root: Path, contexts: list[int], args) -> list[dict]:
    """Per-step cost of ours and z-lab's loop, DFlash and AR, at each context length.

    The pair is a Qwen3-architecture one that is not shipped (6-layer target, hidden 192; 2-layer
    z-lab-layout drafter, block 8), trained on token cycles like `cycle`, with room for 4,096
    positions. Prompts are cycle windows of each context length. AR is z-lab's loop at block 1
    against our pipeline without a drafter. The four runs of one prompt are interleaved (the order
    rotates), so the ratios are taken side by side. Per step: each generation's decode time (its
    wall time less its time to first token, i.e. less the target's prefill; the drafter's first
    pass over the prompt's context counts as decode on both sides) divided by its verify steps.
    The speedups are z-lab's time over ours, for the whole generation and for decode alone;
    `*_prefill_ms` is the mean time to first token.
    """
    from transformers import AutoModelForCausalLM

    target_dir, drafter_dir, _ = cycle_pair(root, 1, num_layers=6, hidden=192, max_positions=4096)
    pipes = {
        "dflash": DFlashPipeline.load(target_dir, drafter_dir, device=args.device, dtype=torch.float32, **ours_options(args)),
        "ar": DFlashPipeline.load(target_dir, device=args.device, dtype=torch.float32, **ours_options(args)),
    }
    zlab_target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(args.device).eval()
    zlab_draft = zlab.DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.float32).to(args.device).eval()
    runs = {
        "ours_dflash": lambda p: run_ours(pipes["dflash"], p, args.max_new_tokens),
        "zlab_dflash": lambda p: run_zlab(zlab, zlab_draft, zlab_target, p, args.max_new_tokens),
        "ours_ar": lambda p: run_ours(pipes["ar"], p, args.max_new_tokens),
        "zlab_ar": lambda p: run_zlab(zlab, zlab_draft, zlab_target, p, args.max_new_tokens, block_size=1),
    }
    warm = testing_prompts(1, 64, seed=3)[0]
    for run in runs.values():
        run(warm)
    rows = []
    for context in contexts:
        prompts = testing_prompts(args.prompts, context, seed=context)
        seconds = {name: 0.0 for name in runs}
        decode = {name: 0.0 for name in runs}
        steps = {name: 0 for name in runs}
        outputs: dict[str, list] = {name: [] for name in runs}
        committed = 0
        names = list(runs)
        for repeat in range(args.repeats):
            for i, prompt in enumerate(prompts):
                shift = (i + repeat * len(prompts)) % len(names)
                for name in names[shift:] + names[:shift]:
                    elapsed, tokens, accepted, first = runs[name](prompt)
                    seconds[name] += elapsed
                    decode[name] += elapsed - first
                    steps[name] += len(accepted) if accepted else len(tokens)
                    committed += sum(accepted) if name == "ours_dflash" else 0
                    outputs[name].append(tokens)
        same = all(outputs[name] == outputs["zlab_ar"] for name in runs)
        row = {"context": context, "generations": args.repeats * len(prompts), "identical_outputs": same}
        runtime = pipes["dflash"].runtime
        row["ours_attention"] = "fused" if runtime.fused is not None else runtime.attention
        for name in runs:
            row[f"{name}_decode_ms_per_step"] = round(1000 * decode[name] / steps[name], 2)
        for name in runs:
            row[f"{name}_prefill_ms"] = round(1000 * (seconds[name] - decode[name]) / row["generations"], 1)
        for kind in ("dflash", "ar"):
            row[f"{kind}_decode_speedup_vs_zlab"] = round(decode[f"zlab_{kind}"] / decode[f"ours_{kind}"], 3)
            row[f"{kind}_total_speedup_vs_zlab"] = round(seconds[f"zlab_{kind}"] / seconds[f"ours_{kind}"], 3)
        row["tau_ours"] = round(committed / steps["ours_dflash"], 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def ours_options(args) -> dict:
    return {"attention": args.attention, "cuda_graphs": args.cuda_graphs}


def testing_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    from trtllm_dflash.testing import tiny

    return tiny.cycle_sequences(count, length, torch.Generator().manual_seed(seed)).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zlab-dir", type=Path, required=True, help="a checkout of github.com/z-lab/dflash")
    parser.add_argument("--pairs", default="demo,cycle", help="comma-separated: demo, cycle")
    parser.add_argument("--prompts", type=int, default=12, help="prompts per pair")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "dflash-bench-reference-loop")
    parser.add_argument("--profile", action="store_true", help="also print our step-time breakdown")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: both loops run there, float32")
    parser.add_argument("--attention", default="auto", help="our target attention: auto, hf or dflash (TorchRuntime's)")
    parser.add_argument("--cuda-graphs", action="store_true", help="our draft and verify passes replayed from CUDA graphs")
    parser.add_argument(
        "--contexts",
        help="comma-separated context lengths (e.g. 150,1000,2000,3500): the per-step cost curve on the "
        "`long` pair, DFlash and AR, instead of --pairs",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    zlab = import_zlab(args.zlab_dir)
    print(
        f"torch {torch.__version__}, {args.device}, ours {ours_options(args)}, "
        f"{torch.get_num_threads()} threads, batch 1, greedy, {args.max_new_tokens} new tokens",
        flush=True,
    )
    if args.contexts:
        results = context_curve(zlab, args.work_dir / "long", [int(c) for c in args.contexts.split(",")], args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
        return
    results = []
    for name in args.pairs.split(","):
        if name == "demo":
            target_dir, drafter_dir, prompts = demo_pair()
        elif name == "cycle":
            target_dir, drafter_dir, prompts = cycle_pair(args.work_dir / "cycle", args.prompts)
        else:
            sys.exit(f"unknown pair {name!r}: use demo or cycle")
        results.append(compare(name, zlab, target_dir, drafter_dir, prompts[: args.prompts], args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
