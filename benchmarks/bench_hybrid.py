"""Hybrid targets (Gated DeltaNet + full attention) under DFlash, on this machine, side by side.

Part 1, one verify step: a hybrid target (qwen3_5: 3 linear-attention layers per full-attention
layer) against a dense target (qwen3) of the same hidden size, depth and vocabulary, both with
random weights, at the same batch, context and block. Reported per model: median time of the
verify pass (target_forward over the block; the hybrid keeps each position's delta-rule update),
of the rollback (`commit`: each row forms the state after its kept tokens), the rollback's share
of the verify step, and the same verify pass with transformers' own chunked kernel keeping only
the final state (no rollback possible): what our block kernel plus the rollback cost, or save.

Part 2, a trained tiny hybrid pair: a qwen3_5 target trained on two token cycles plus a drafter
distilled from it (`trtllm_dflash.testing.tiny.make_cycle_pair`), DFlash vs autoregressive decoding
of the same prompts, interleaved rounds, greedy; a dense qwen3 pair trained the same way beside it.

    python benchmarks/bench_hybrid.py --json benchmarks/results/hybrid-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _config(family: str, args, intermediate_size: int | None = None):
    from trtllm_dflash.testing.tiny import tiny_target_config

    config = tiny_target_config(family, vocab_size=args.vocab, num_layers=args.layers, hidden_size=args.hidden)
    config.tie_word_embeddings = False
    if intermediate_size:
        config.intermediate_size = intermediate_size
    return config


def equal_size_configs(args) -> dict:
    """The hybrid, and a dense model whose MLP is widened to the hybrid's parameter count."""
    from transformers import AutoModelForCausalLM

    hybrid, dense = _config("qwen3_5", args), _config("qwen3", args)
    with torch.device("meta"):
        missing = _parameters(AutoModelForCausalLM.from_config(hybrid)) - _parameters(AutoModelForCausalLM.from_config(dense))
    widen = round(missing / (3 * args.hidden * args.layers))
    return {"qwen3_5": hybrid, "qwen3": _config("qwen3", args, dense.intermediate_size + widen)}


def verify_step_times(family: str, config, args) -> dict:
    """Median verify / rollback times of one random target of `family`."""
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    runtime = TorchRuntime(model)
    batch, context, block = args.batch, args.context, args.block
    runtime.allocate(batch, context + block)
    rows = slice(0, batch)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab, (batch, context), generator=generator)
    lengths = torch.full((batch,), context)
    runtime.target_forward(rows, prompt, torch.zeros(batch, dtype=torch.long), context, logits_at=lengths - 1)
    tokens = torch.randint(0, args.vocab, (batch, block), generator=generator)
    starts = torch.full((batch,), context)
    kept = torch.randint(1, block + 1, (batch,), generator=generator)

    def one_step(capture: bool) -> tuple[float, float]:
        if runtime.linear_states is not None:
            runtime.linear_states.capture_positions = capture
        began = time.perf_counter()
        runtime.target_forward(rows, tokens, starts, context + block)
        verified = time.perf_counter()
        runtime.commit(rows, kept if capture else torch.full_like(kept, block))
        return verified - began, time.perf_counter() - verified

    for _ in range(3):  # warm up
        one_step(True)
    captured, final_only = [], []
    for _ in range(args.repeats):  # interleaved, so load changes hit both alike
        captured.append(one_step(True))
        final_only.append(one_step(False))
    verify = statistics.median(t for t, _ in captured)
    rollback = statistics.median(t for _, t in captured)
    return {
        "family": family,
        "parameters": _parameters(model),
        "linear_layers": len(runtime.linear_modules),
        "verify_ms": 1e3 * verify,
        "rollback_ms": 1e3 * rollback,
        "rollback_share": rollback / verify,
        "verify_final_state_only_ms": 1e3 * statistics.median(t for t, _ in final_only),
        "state_bytes_per_row": (runtime.linear_states.nbytes // batch) if runtime.linear_states else 0,
    }


def pair_speedup(family: str, root: Path, args) -> dict:
    """DFlash vs autoregressive tokens/s of a trained cycle pair, interleaved rounds."""
    from trtllm_dflash import DFlashPipeline
    from trtllm_dflash.testing.tiny import cycle_sequences, make_cycle_pair

    began = time.perf_counter()
    target, drafter = make_cycle_pair(root / family, block_size=args.pair_block, family=family)
    trained = time.perf_counter() - began
    prompts = cycle_sequences(args.pair_prompts, 16, torch.Generator().manual_seed(7)).tolist()
    spec = DFlashPipeline.load(target, drafter)
    ar = DFlashPipeline.load(target, None)
    kwargs = dict(max_new_tokens=args.pair_tokens, stop_token_ids=())
    spec.generate(prompts[:1], **kwargs)
    ar.generate(prompts[:1], **kwargs)
    spec_times, ar_times, lossless, taus = [], [], True, []
    for _ in range(args.rounds):
        for name in ("spec", "ar"):
            pipe = spec if name == "spec" else ar
            began = time.perf_counter()
            outputs = pipe.generate(prompts, max_batch=1, **kwargs)  # one request at a time: latency
            (spec_times if name == "spec" else ar_times).append(time.perf_counter() - began)
            if name == "spec":
                spec_tokens = [o.token_ids for o in outputs]
                taus += [o.mean_acceptance_length for o in outputs]
            else:
                lossless &= spec_tokens == [o.token_ids for o in outputs]
    tokens = len(prompts) * args.pair_tokens
    return {
        "family": family,
        "train_seconds": trained,
        "ar_tokens_per_s": tokens / statistics.median(ar_times),
        "dflash_tokens_per_s": tokens / statistics.median(spec_times),
        "speedup": statistics.median(ar_times) / statistics.median(spec_times),
        "tau": statistics.mean(taus),
        "lossless": lossless,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--pair-block", type=int, default=8)
    parser.add_argument("--pair-prompts", type=int, default=4)
    parser.add_argument("--pair-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()

    steps = [verify_step_times(family, config, args) for family, config in equal_size_configs(args).items()]
    table = Table(
        title=f"verify step: batch {args.batch}, context {args.context}, block {args.block}, hidden {args.hidden}, {args.layers} layers"
    )
    for column in (
        "target",
        "params",
        "linear layers",
        "verify ms",
        "rollback ms",
        "rollback share",
        "verify, final state only ms",
        "state bytes/row",
    ):
        table.add_column(column)
    for s in steps:
        table.add_row(
            s["family"],
            f"{s['parameters'] / 1e6:.2f} M",
            str(s["linear_layers"]),
            f"{s['verify_ms']:.2f}",
            f"{s['rollback_ms']:.3f}",
            f"{100 * s['rollback_share']:.1f}%",
            f"{s['verify_final_state_only_ms']:.2f}",
            str(s["state_bytes_per_row"]),
        )
    console.print(table)

    with tempfile.TemporaryDirectory() as tmp:
        pairs = [pair_speedup(family, Path(tmp), args) for family in ("qwen3_5", "qwen3")]
    table = Table(
        title=f"trained cycle pairs: DFlash vs AR, block {args.pair_block}, "
        f"{args.pair_prompts} prompts x {args.pair_tokens} tokens, batch 1"
    )
    for column in ("target", "AR tok/s", "DFlash tok/s", "speedup", "tau", "lossless", "train s"):
        table.add_column(column)
    for p in pairs:
        table.add_row(
            p["family"],
            f"{p['ar_tokens_per_s']:.1f}",
            f"{p['dflash_tokens_per_s']:.1f}",
            f"{p['speedup']:.2f}x",
            f"{p['tau']:.2f}",
            str(p["lossless"]),
            f"{p['train_seconds']:.0f}",
        )
    console.print(table)

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "command": "python benchmarks/bench_hybrid.py "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "json"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "torch": torch.__version__,
            "verify_step": steps,
            "pairs": pairs,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
