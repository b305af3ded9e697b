"""What a grammar costs a DFlash step (issue 42): the mask per step, and tau and tokens/s with and without one.

    python benchmarks/bench_grammar.py [--rounds 3] [--tokens 96]

1. Mask cost per step at batch 8: the masks of one block (8 positions, the demo drafter's) for 8
   rows, each in the middle of a JSON answer, filled as the decoding loop fills them
   (runtime/grammar.py `block_masks`: fill, walk the drafts, roll back) with xgrammar, and the same
   fills with llguidance (fill + consume + rollback per position); then applying them to float32
   logits `[8, 8, V]` with xgrammar's CPU kernel (`BlockMasks.apply`). Two vocabularies: the
   demo tokenizer's 4,096 tokens, and a synthetic byte-level BPE vocabulary of Qwen3's size,
   151,936 tokens (random 1-10 character pieces of code-like text: no Qwen3 tokenizer is on this
   machine, and nothing is downloaded).
2. The demo pair end to end (torch runtime, CPU, 1 thread, greedy): a JSON-schema workload
   (completion prompts, `response_format` json_schema) and a tool-call workload (chat prompts with
   two tools, a forced call), batch 1 and 8, DFlash and autoregressive, with and without the
   grammar; interleaved rounds, medians; tokens compared between DFlash and autoregressive.

Needs the `grammar` extra (and llguidance for its column: `pip install llguidance`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "count", "tags"],
}
ANSWER = '{"name": "an example name", "count": 1234, "tags": ["alpha", "beta", "gamma", "delta", "epsilon"]}'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_code",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
]
JSON_PROMPTS = [
    "config = ",
    "def make_item():\n    return ",
    "item = json.loads('",
    "# the answer as JSON\n",
    "payload = ",
    "DEFAULTS = ",
    "data = dict(",
    "record = ",
]
CHAT_PROMPTS = [
    "What is the weather in Paris?",
    "Find the function that parses JSON.",
    "Weather in Tokyo for 3 days?",
    "Search for the tokenizer code.",
    "Is it raining in Oslo?",
    "Where is fibonacci defined?",
    "Forecast for Rome",
    "grep for TODO",
]


def synthetic_tokenizer(size: int):
    """A byte-level BPE tokenizer with `size` tokens: the 256 bytes, then random code-like pieces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte_chars))}
    rng, alphabet = random.Random(0), "abcdefghijklmnopqrstuvwxyz_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 (){}[]:,.\"'=+-*/#\n"
    to_byte_level = {b: c for b, c in zip(range(256), [chr(b) for b in range(256)])}
    mapping = {chr(b): c for b, c in zip(range(256), _bytes_to_unicode())}
    while len(vocab) < size - 1:
        piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 10)))
        vocab.setdefault("".join(mapping[ch] for ch in piece), len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    del to_byte_level
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def mask_cost(tokenizer, rounds: int, rows: int = 8, positions: int = 8) -> dict[str, float]:
    """Milliseconds per step for the masks of `rows` rows x `positions` block positions."""
    from trtllm_dflash.contracts.grammar_spec import GrammarSpec
    from trtllm_dflash.runtime.grammar import GrammarCompiler, block_masks

    ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    vocab = len(tokenizer)
    compiler = GrammarCompiler(tokenizer, vocab, [tokenizer.eos_token_id])
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    results: dict[str, list[float]] = {"xgrammar fill": [], "llguidance fill": [], "apply": []}
    logits = torch.randn(rows, positions, vocab)
    starts = [len(ids) * (r + 1) // (rows + 2) for r in range(rows)]  # each row somewhere inside the answer
    states = []
    for start in starts:
        state = compiler.state(spec)
        state.catch_up(ids[:start])
        states.append(state)
    blocks = [ids[start - 1 : start + positions - 1] for start in starts]
    try:
        import llguidance
        import llguidance.hf
        from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

        lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        matchers = []
        for start in starts:
            matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))
            for token in ids[:start]:
                assert matcher.consume_token(token), matcher.get_error()
            matchers.append(matcher)
        llmask = allocate_token_bitmask(rows * positions, vocab)
    except ImportError:
        matchers = []
    for _ in range(rounds):
        started = time.perf_counter()
        masks = block_masks(states, blocks, positions, vocab)
        filled = time.perf_counter()
        masks.apply(logits)
        results["xgrammar fill"].append((filled - started) * 1e3)
        results["apply"].append((time.perf_counter() - filled) * 1e3)
        if matchers:
            started = time.perf_counter()
            for row, matcher in enumerate(matchers):
                walked = 0
                for t in range(positions):
                    fill_next_token_bitmask(matcher, llmask, row * positions + t)
                    if t == positions - 1 or not matcher.consume_token(blocks[row][t + 1]):
                        break
                    walked += 1
                matcher.rollback(walked)
            results["llguidance fill"].append((time.perf_counter() - started) * 1e3)
    return {name: statistics.median(times) for name, times in results.items() if times}


def decode_rates(rounds: int, tokens: int) -> list[dict]:
    from trtllm_dflash import DFlashPipeline, demo
    from trtllm_dflash.contracts.grammar_spec import GrammarSpec

    pipelines = {"dflash": DFlashPipeline.load(demo.target_dir(), demo.drafter_dir()), "ar": DFlashPipeline.load(demo.target_dir())}
    chat = [pipelines["ar"].apply_chat_template(p, {"tools": TOOLS}) for p in CHAT_PROMPTS]
    workloads = {
        "json schema": (JSON_PROMPTS, GrammarSpec("json_schema", json.dumps(SCHEMA))),
        "tool call": (
            chat,
            GrammarSpec("tool_calls", json.dumps({"format": "qwen_3", "tools": TOOLS, "tool_choice": "required", "parallel": False})),
        ),
    }
    rows = []
    for workload, (prompts, spec) in workloads.items():
        for batch in (1, 8):
            for grammar in (None, spec):
                times = {name: [] for name in pipelines}
                outputs = {}
                for _ in range(rounds):
                    for name, pipe in pipelines.items():  # interleaved
                        started = time.perf_counter()
                        outs = [
                            o
                            for i in range(0, len(prompts), batch)
                            for o in pipe.generate(prompts[i : i + batch], max_new_tokens=tokens, grammar=grammar, stop_token_ids=())
                        ]
                        times[name].append(time.perf_counter() - started)
                        outputs[name] = outs
                generated = {name: sum(len(o.token_ids) for o in outs) for name, outs in outputs.items()}
                taus = [o.mean_acceptance_length for o in outputs["dflash"]]
                rows.append(
                    {
                        "workload": workload,
                        "batch": batch,
                        "grammar": grammar is not None,
                        "dflash_tok_s": generated["dflash"] / statistics.median(times["dflash"]),
                        "ar_tok_s": generated["ar"] / statistics.median(times["ar"]),
                        "tau": statistics.mean(taus),
                        "same_tokens": [o.token_ids for o in outputs["dflash"]] == [o.token_ids for o in outputs["ar"]],
                    }
                )
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--skip-masks", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from trtllm_dflash import demo

    print("mask cost per step, batch 8 x 8 positions, ms (median; CPU, 1 thread):")
    for label, tokenizer in (
        ("demo 4,096", AutoTokenizer.from_pretrained(demo.target_dir())),
        ("synthetic 151,936", synthetic_tokenizer(151_936)),
    ):
        if not args.skip_masks:
            print(f"  {label}: {mask_cost(tokenizer, max(args.rounds, 5) * 4)}", flush=True)
    if not args.skip_decode:
        print("| workload | batch | grammar | DFlash tok/s | AR tok/s | DFlash / AR | tau | same tokens |")
        print("|---|---:|---|---:|---:|---:|---:|---|")
        for r in decode_rates(args.rounds, args.tokens):
            print(
                f"| {r['workload']} | {r['batch']} | {'yes' if r['grammar'] else 'no'} | {r['dflash_tok_s']:.1f} | {r['ar_tok_s']:.1f} | "
                f"{r['dflash_tok_s'] / r['ar_tok_s']:.2f}x | {r['tau']:.2f} | {r['same_tokens']} |"
            )


if __name__ == "__main__":
    main()
