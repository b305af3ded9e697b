"""Detokenization cost per serving step, before and after incremental detokenization (issue 38).

Before (main at a055df4, `BatchingLoop._text_of`): every step decoded the request's whole output
and searched all of it for the stop strings. After: `served_model/detokenizer.py` decodes only the ids
since the last complete character and searches only where a stop could end. Both run here on the
same ids (a real text tokenized by the shipped demo tokenizer), steps of `--step` tokens (about a
DFlash step's tau), one stop string that never occurs, interleaved over `--repeats` rounds; the
table gives the mean cost of a step over the whole output and over its last 100 steps.

    python benchmarks/bench_detokenize.py --tokens 2000
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

from transformers import AutoTokenizer

from trtllm_dflash import demo
from trtllm_dflash.decoding import Request, SequenceResult
from trtllm_dflash.sampling_params import SamplingParams
from trtllm_dflash.served_model.batching_loop import BatchingLoop, Job
from trtllm_dflash.served_model.detokenizer import REPLACEMENT


def before(tokenizer, steps: list[list[int]], stops: list[str]) -> list[float]:
    """main's per-step work: the whole decode, the whole-text stop search, the held-back text."""
    times = []
    for ids in steps:
        started = time.perf_counter()
        full = tokenizer.decode(ids, skip_special_tokens=True)
        hits = [hit for s in stops if (hit := full.find(s, 0)) >= 0]
        assert not hits
        hold = max(len(s) for s in stops) - 1
        if full.endswith(REPLACEMENT):
            hold = max(hold, 1)
        full[: len(full) - hold]
        times.append(time.perf_counter() - started)
    return times


def after(tokenizer, steps: list[list[int]], stops: list[str]) -> list[float]:
    """The serving loop's per-step text work now: `BatchingLoop._text_of` itself, on a job fed as
    `_deliver` feeds it (no model behind the loop)."""
    loop = BatchingLoop.__new__(BatchingLoop)
    loop.tokenizer = tokenizer
    request = Request([1], SamplingParams(max_new_tokens=len(steps[-1]), stop=stops))
    job = Job(request, None, None, tokenizer)
    result = SequenceResult(request_id=None, prompt_ids=[1])
    times = []
    for ids in steps:
        result.token_ids = list(ids)
        started = time.perf_counter()
        text, _ = loop._text_of(job, result, finished=False)
        times.append(time.perf_counter() - started)
        assert text is not None
        job.text = text
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--step", type=int, default=4, help="tokens committed per step")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(demo.target_dir())
    import argparse as source_module  # a long real Python text, in the demo tokenizer's domain

    ids = tokenizer.encode(inspect.getsource(source_module), add_special_tokens=False)[: args.tokens]
    assert len(ids) == args.tokens, f"the text has only {len(ids)} tokens"
    steps = [ids[:k] for k in range(args.step, len(ids) + 1, args.step)]
    stops = ["<never in this text>"]
    runs = {"before": [], "after": []}
    for _ in range(args.repeats):
        for name, fn in (("before", before), ("after", after)):
            runs[name].append(fn(tokenizer, steps, stops))
    print(f"{args.tokens}-token output, {len(steps)} steps of {args.step} tokens, {args.repeats} interleaved rounds (medians)")
    print("| | mean per step, whole output (us) | mean per step, last 100 steps (us) | whole output (ms) |")
    print("|---|---:|---:|---:|")
    for name, rounds in runs.items():
        mean = statistics.median(statistics.fmean(r) for r in rounds) * 1e6
        last = statistics.median(statistics.fmean(r[-100:]) for r in rounds) * 1e6
        total = statistics.median(sum(r) for r in rounds) * 1e3
        print(f"| {name} | {mean:.0f} | {last:.0f} | {total:.1f} |")


if __name__ == "__main__":
    main()
