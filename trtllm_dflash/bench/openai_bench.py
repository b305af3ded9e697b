"""`dflash-trt bench --openai-url`: any OpenAI-compatible server, streamed, over a concurrency sweep.

Why apart from measure.py: that bench compares two decoding modes of one system it controls;
this one is a client of a server it does not know (ours, vLLM, SGLang, trtllm-serve), so all it
can see is what a user sees. Per concurrency level it keeps `concurrency` streaming requests in
flight (each user sends its next prompt when the last one ends) and reports:
- throughput (completion tokens / wall time) against per-user tokens/s (the Pareto curve);
- TTFT (request sent to first text) and inter-token latency percentiles, p50/p90/p99: ITL is
  the gap between streamed chunks (a DFlash step can bring several tokens in one chunk), TPOT
  the per-request (latency - TTFT) / (tokens - 1);
- mean tau where the server reports it (`usage.dflash.mean_acceptance_length`, ours does).
Token counts come from the server's usage (stream_options.include_usage).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from typing import Callable, Sequence

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import require
from trtllm_dflash.sampling_params import SamplingError, SamplingParams


@dataclasses.dataclass
class RequestTiming:
    """What one streamed request looked like from the client."""

    completion_tokens: int
    prompt_tokens: int
    latency: float  # request sent to last chunk
    ttft: float  # request sent to first text
    chunk_gaps: list[float]  # between consecutive text chunks
    tau: float | None
    text: str

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.completion_tokens - 1) if self.completion_tokens > 1 else None


def percentiles(values: Sequence[float], points: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    """p50/p90/p99 (linear interpolation between closest ranks), in the values' unit."""
    ordered = sorted(values)
    result: dict[str, float | None] = {}
    for p in points:
        if not ordered:
            result[f"p{p}"] = None
            continue
        rank = (len(ordered) - 1) * p / 100
        low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
        result[f"p{p}"] = ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
    return result


async def _one(client, model: str, prompt: str, max_new_tokens: int, chat: bool) -> RequestTiming:
    started = time.perf_counter()
    kwargs = dict(model=model, max_tokens=max_new_tokens, temperature=0.0, stream=True, stream_options={"include_usage": True})
    if chat:
        stream = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kwargs)
    else:
        stream = await client.completions.create(prompt=prompt, **kwargs)
    first, last, gaps, parts, usage = None, None, [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        text = (chunk.choices[0].delta.content if chat else chunk.choices[0].text) or ""
        if not text:
            continue
        now = time.perf_counter()
        if first is None:
            first = now
        else:
            gaps.append(now - last)
        last = now
        parts.append(text)
    end = time.perf_counter()
    if usage is None:
        raise DFlashError(
            f"the server at did not report usage for model {model!r}", "use a server that honours stream_options.include_usage"
        )
    extra = getattr(usage, "model_extra", None) or {}
    tau = (extra.get("dflash") or {}).get("mean_acceptance_length")
    return RequestTiming(
        int(usage.completion_tokens), int(usage.prompt_tokens), end - started, (first or end) - started, gaps, tau, "".join(parts)
    )


async def _level(
    client, model: str, prompts: list[str], concurrency: int, max_new_tokens: int, chat: bool
) -> tuple[list[RequestTiming], float]:
    queue: asyncio.Queue = asyncio.Queue()
    for index, prompt in enumerate(prompts):
        queue.put_nowait((index, prompt))
    results: dict[int, RequestTiming] = {}

    async def user() -> None:
        while not queue.empty():
            index, prompt = queue.get_nowait()
            results[index] = await _one(client, model, prompt, max_new_tokens, chat)

    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(min(concurrency, len(prompts)))))
    return [results[i] for i in range(len(prompts))], time.perf_counter() - started


def summarize(timings: list[RequestTiming], seconds: float) -> dict:
    """One (model, concurrency) row: throughput, per-user speed, latency percentiles in ms, tau."""
    tokens = sum(t.completion_tokens for t in timings)
    rates = [(t.completion_tokens - 1) / (t.latency - t.ttft) for t in timings if t.completion_tokens > 1 and t.latency > t.ttft]
    taus = [t.tau for t in timings if t.tau is not None]
    ms = lambda values: {k: (None if v is None else 1e3 * v) for k, v in percentiles(values).items()}  # noqa: E731
    return {
        "requests": len(timings),
        "completion_tokens": tokens,
        "seconds": seconds,
        "throughput": tokens / seconds if seconds > 0 else 0.0,
        "per_user_tokens_per_second": statistics.fmean(rates) if rates else 0.0,
        "ttft_ms": ms([t.ttft for t in timings]),
        "itl_ms": ms([g for t in timings for g in t.chunk_gaps]),
        "tpot_ms": ms([t.tpot for t in timings if t.tpot is not None]),
        "tau": statistics.fmean(taus) if taus else None,
    }


def run_openai_bench(
    url: str,
    models: Sequence[str],
    prompts: list[str],
    concurrency: Sequence[int],
    max_new_tokens: int,
    chat: bool = True,
    api_key: str = "unused",
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """The sweep over every model and concurrency level (models alternate per level); a JSON-ready report."""
    openai = require("openai", purpose="bench --openai-url")
    levels = sorted(set(int(c) for c in concurrency))
    if not levels or levels[0] < 1:
        raise DFlashError(f"concurrency levels must be >= 1, got {list(concurrency)}", "e.g. --concurrency 1,4,16")
    try:
        SamplingParams(max_new_tokens=max_new_tokens).validate()
    except SamplingError as exc:
        raise exc.renamed({"max_new_tokens": "--max-new-tokens"}) from None
    if not models:
        raise DFlashError("no model named", "pass --model NAME (comma-separated for several)")

    async def main() -> dict:
        async with openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=3600) as client:
            try:
                served = [m.id async for m in client.models.list()]
            except openai.APIConnectionError:
                raise DFlashError(
                    f"cannot reach an OpenAI-compatible server at {url}",
                    "start one (dflash-trt serve REPO --openai-port 8080) or fix --openai-url (http://host:port/v1)",
                ) from None
            missing = [m for m in models if m not in served]
            if missing:
                raise DFlashError(
                    f"model(s) {', '.join(missing)} not served at {url} (it serves {', '.join(served)})", "pass a served --model"
                )
            for model in models:  # warm-up: one short request each
                await _one(client, model, prompts[0], min(max_new_tokens, 8), chat)
            rows = []
            for index, level in enumerate(levels):
                requests = [prompts[i % len(prompts)] for i in range(max(len(prompts), level))]
                order = list(models) if index % 2 == 0 else list(reversed(models))
                for model in order:
                    timings, seconds = await _level(client, model, requests, level, max_new_tokens, chat)
                    rows.append({"model": model, "concurrency": level, **summarize(timings, seconds), "texts": [t.text for t in timings]})
                if progress:
                    progress("concurrency", index + 1, len(levels))
            return rows

    rows = asyncio.run(main())
    rows.sort(key=lambda r: (list(models).index(r["model"]), r["concurrency"]))
    return {
        "system": {"backend": "openai", "url": url, "models": list(models), "api": "chat" if chat else "completions"},
        "settings": {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "temperature": 0.0, "concurrency": levels},
        "rows": rows,
    }


def print_openai_report(report: dict, console) -> None:
    from rich.table import Table

    s, system = report["settings"], report["system"]
    console.print(
        f"[bold]{system['url']}[/] ({system['api']}): {s['prompts']} prompts, {s['max_new_tokens']} new tokens, temperature 0, streamed"
    )
    table = Table(title="throughput vs per-user speed; latencies in ms (p50 / p90 / p99)")
    for column in ("model", "users", "tok/s", "tok/s/user", "TTFT", "ITL (chunks)", "TPOT", "tau"):
        table.add_column(column, justify="right")
    fmt = lambda d: " / ".join("-" if d[k] is None else f"{d[k]:.1f}" for k in ("p50", "p90", "p99"))  # noqa: E731
    for row in report["rows"]:
        table.add_row(
            row["model"],
            str(row["concurrency"]),
            f"{row['throughput']:.1f}",
            f"{row['per_user_tokens_per_second']:.1f}",
            fmt(row["ttft_ms"]),
            fmt(row["itl_ms"]),
            fmt(row["tpot_ms"]),
            "-" if row["tau"] is None else f"{row['tau']:.2f}",
        )
    console.print(table)


def write_openai_plot(report: dict, out_dir) -> list:
    """pareto.png: throughput against per-user tokens/s, one line per model."""
    import matplotlib

    matplotlib.use("Agg")

    from trtllm_dflash.bench.report import _save, pareto_figure

    curves = []
    for model in report["system"]["models"]:
        rows = [r for r in report["rows"] if r["model"] == model]
        curves.append((model, "o", rows, [r["concurrency"] for r in rows]))
    fig = pareto_figure(curves, report["system"]["url"], "per-user tokens/s")
    out_dir.mkdir(parents=True, exist_ok=True)
    return [_save(fig, out_dir / "pareto.png")]
