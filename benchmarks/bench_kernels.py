"""GPU benchmark of the DFlash plugin kernels (not a test: it needs an NVIDIA GPU and measures time).

For each kernel it reports the time against the memory-bandwidth floor that the kernel's
unavoidable traffic implies (bytes that must be read or written / the copy bandwidth measured on
the same GPU in the same run), and for block attention the time of torch's
scaled_dot_product_attention on the same shapes. Shapes default to the Qwen3-8B DFlash drafter:
32 query heads, 8 KV heads, head_dim 128, block 16, contexts 1k/8k/32k, batch 1/8/32.

    python benchmarks/bench_kernels.py                 # prints a markdown report
    python benchmarks/bench_kernels.py --markdown out.md

Times are medians of `triton.testing.do_bench` (the L2 cache is flushed before every run), so each
kernel is measured with its inputs coming from HBM, as in a decoding step.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys

import torch

from trtllm_dflash.plugins import kernels, reference
from trtllm_dflash.plugins.kernels import launch


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write both count)."""
    from triton.testing import do_bench

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * nbytes / (ms * 1e-3)


def bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def attention_rows(args, bandwidth: float) -> list[dict]:
    heads, kv_heads, head_dim, block, new = args.heads, args.kv_heads, args.head_dim, args.block, args.new_rows
    dtype = getattr(torch, args.dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for context in args.contexts:
        for batch in args.batches:
            capacity = context + block
            k_cache = torch.randn(batch, capacity, kv_heads, head_dim, dtype=dtype, device="cuda")
            v_cache = torch.randn_like(k_cache)
            q = torch.randn(batch, block, heads, head_dim, dtype=dtype, device="cuda")
            k_block, v_block = (torch.randn(batch, block, kv_heads, head_dim, dtype=dtype, device="cuda") for _ in range(2))
            k_new, v_new = (torch.randn(batch, new, kv_heads, head_dim, dtype=dtype, device="cuda") for _ in range(2))
            counts = torch.full((batch,), new, dtype=torch.int64, device="cuda")
            lens = torch.full((batch,), context - new, dtype=torch.int64, device="cuda")  # the step ends at `context`
            scale = head_dim**-0.5

            def ours():
                return launch.block_attention(q, k_block, v_block, k_new, v_new, counts, k_cache, v_cache, lens, scale, 0)

            ours()  # appends the new rows, so the cache holds this step's context for torch too
            # the same attention with torch: [b, heads, tokens, D] operands prepared outside the timing
            keys = torch.cat([k_cache[:, :context], k_block], dim=1).transpose(1, 2).contiguous()
            values = torch.cat([v_cache[:, :context], v_block], dim=1).transpose(1, 2).contiguous()
            queries = q.transpose(1, 2).contiguous()

            def sdpa():
                return torch.nn.functional.scaled_dot_product_attention(queries, keys, values, scale=scale, enable_gqa=True)

            torch.testing.assert_close(ours().float(), sdpa().transpose(1, 2).float(), atol=3e-2, rtol=3e-2)
            # bytes that must move: context K/V read, block K/V + queries read, outputs + appended rows written
            floor_bytes = size * (2 * batch * context * kv_heads * head_dim + 2 * batch * block * kv_heads * head_dim
                                  + 2 * batch * block * heads * head_dim + 2 * batch * new * kv_heads * head_dim)
            ms_ours, ms_sdpa = bench(ours), bench(sdpa)
            floor_ms = floor_bytes / bandwidth * 1e3
            group = heads // kv_heads
            m_tiles = launch.attention_config(head_dim, block, group).m_tiles(block, group)
            splits = launch.default_kv_splits(batch, kv_heads, m_tiles, capacity, q.device)
            rows.append(dict(context=context, batch=batch, splits=splits, ours=ms_ours, sdpa=ms_sdpa, floor=floor_ms))
            del k_cache, v_cache, keys, values
            torch.cuda.empty_cache()
    return rows


def verify_rows(args, bandwidth: float) -> list[dict]:
    rows = []
    block, vocab = args.block, args.vocab
    for logits_dtype in ("float32", "bfloat16"):
        for mode in ("greedy", "temperature", "top-k+top-p"):
            for batch in args.batches:
                dtype = getattr(torch, logits_dtype)
                logits = (torch.randn(batch, block, vocab, device="cuda") * 3).to(dtype)
                tokens = torch.randint(0, vocab, (batch, block), device="cuda")
                temperature = torch.full((batch,), 0.0 if mode == "greedy" else 0.8, device="cuda")
                top_k = torch.full((batch,), 50 if mode == "top-k+top-p" else 0, device="cuda")
                top_p = torch.full((batch,), 0.9 if mode == "top-k+top-p" else 1.0, device="cuda")
                seed, start = torch.arange(batch, device="cuda"), torch.zeros(batch, dtype=torch.int64, device="cuda")
                draft = None
                if mode != "greedy":
                    draft = torch.softmax(torch.randn(batch, block - 1, vocab, device="cuda"), -1)

                def ours():
                    return launch.verify_block(logits, tokens, draft, temperature, top_k, top_p, seed, start)

                got = ours()
                expected = reference.verify_block_packed(*(x.cpu() if torch.is_tensor(x) else x for x in (logits, tokens, draft, temperature, top_k, top_p, seed, start)))
                agree = bool(torch.equal(got.cpu(), expected))
                floor_bytes = logits.numel() * logits.element_size() + (draft.numel() * 4 if draft is not None else 0)
                ms = bench(ours)
                rows.append(dict(dtype=logits_dtype, mode=mode, batch=batch, ours=ms, floor=floor_bytes / bandwidth * 1e3, agree=agree))
    return rows


def report(args, bandwidth, attention, verify) -> str:
    props = torch.cuda.get_device_properties(0)
    import triton

    lines = [
        f"### Plugin kernels on {props.name} ({props.multi_processor_count} SMs), {datetime.date.today().isoformat()}",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}, {platform.node()}  ",
        f"Measured copy bandwidth: {bandwidth / 1e9:.0f} GB/s (device-to-device, read + write). Floor = bytes that must move / that bandwidth.",
        "",
        f"Block attention, {args.heads} heads / {args.kv_heads} KV heads / head_dim {args.head_dim} / block {args.block}, {args.dtype}, "
        f"{args.new_rows} new context rows appended per step:",
        "",
        "| context | batch | KV splits | ours (ms) | floor (ms) | % of floor | torch SDPA (ms) | SDPA / ours |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in attention:
        lines.append(f"| {r['context']} | {r['batch']} | {r['splits']} | {r['ours']:.4f} | {r['floor']:.4f} | "
                     f"{100 * r['floor'] / r['ours']:.0f}% | {r['sdpa']:.4f} | {r['sdpa'] / r['ours']:.2f}x |")
    lines += [
        "",
        f"Block verification (both kernels), block {args.block}, vocab {args.vocab}; floor = logits (+ draft probabilities) read once:",
        "",
        "| logits | rows | batch | ours (ms) | floor (ms) | % of floor | equal to reference |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in verify:
        lines.append(f"| {r['dtype']} | {r['mode']} | {r['batch']} | {r['ours']:.4f} | {r['floor']:.4f} | "
                     f"{100 * r['floor'] / r['ours']:.0f}% | {'yes' if r['agree'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--new-rows", type=int, default=4, help="context rows appended per step (accepted + 1)")
    parser.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 8192, 32768])
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--markdown", help="also append the report to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: this benchmark needs an NVIDIA GPU with a CUDA build of torch; run it on a GPU machine", file=sys.stderr)
        sys.exit(2)
    if not kernels.triton_available():
        print("error: triton is not installed; pip install 'trtllm-dflash[kernels]'", file=sys.stderr)
        sys.exit(2)
    bandwidth = copy_bandwidth()
    text = report(args, bandwidth, attention_rows(args, bandwidth), verify_rows(args, bandwidth))
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
