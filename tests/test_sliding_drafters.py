"""Sliding-window draft layers as published, step for step against a reference written here.

Speculative decoding stays lossless when a drafter runs wrong, so equal tokens prove little: these
tests compare the acceptance length of every verify step with `reference_generate` below, a
recompute-everything loop written from the published definition and nothing of ours but the
weights: z-lab's `DFlashDraftModel` (every layer `is_causal = False`; a `sliding_attention` layer
hands `sliding_window` W to flash attention, whose window (W - 1, W - 1) lets a block query at
position q see a key at position k iff |q - k| <= W - 1, context and block alike), ModelOpt's /
DeepSpec's `dflash_config.use_swa` + `swa_window_size` (TensorRT-LLM's `dspark_layer_window_size`:
the sliding layers when layer_types is given, every layer otherwise), and z-lab's `dflash_generate`
loop (greedy; acceptance = leading drafts equal to the target's argmax, plus the bonus).

The pair is the shipped demo target with its trained drafters (V1 and V2), their config.json
rewritten to sliding variants with a window of 12 and prompts of 27-40 tokens, so the window cuts
the context and, at 12 < 8 + 12, reaches into the block from both sides only on long contexts.
Runtimes checked: the torch runtime (batch of 3 ragged rows); the drafter graph module the ONNX
export traces, with its own masks and with the block-attention plugin op (two cached steps of a
ragged batch); and, under --runslow (make test-all; ~2 minutes of exports), the exported ONNX
graphs (V1 and V2 native masks, the plugin nodes on their CPU evaluators) and a TensorRT-RTX
engine build of the sliding drafter graph.
The plugin kernel itself is checked against the same rule in tests/test_plugin_attention.py.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from support import rms, rope  # the drafter's norm and RoPE written from the spec

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request
from trtllm_dflash.demo import DEMO_DIR
from trtllm_dflash.ops import reference_dflash2
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.sampling_params import SamplingParams

WINDOW = 12
NEW_TOKENS = 40
SLIDING, FULL = "sliding_attention", "full_attention"
DTYPE = torch.float64

# config.json changes on top of the demo drafter's (3 layers, all full_attention)
VARIANTS = {
    "sliding": {"layer_types": [SLIDING, FULL, SLIDING], "sliding_window": WINDOW},
    "use_swa+layer_types": {"layer_types": [SLIDING, FULL, SLIDING], "dflash_config": {"use_swa": True, "swa_window_size": WINDOW}},
    "use_swa": {"layer_types": None, "dflash_config": {"use_swa": True, "swa_window_size": WINDOW}},
}


# ----------------------------------------------------------------------------- the reference


def layer_windows(raw: dict) -> list[int | None]:
    """Each layer's window W (None: unbounded), read from config.json as the references read it."""
    types = raw.get("layer_types")
    dflash = raw.get("dflash_config") or {}
    windows = []
    for i in range(raw["num_hidden_layers"]):
        sliding = bool(types) and types[i] == SLIDING
        if dflash.get("use_swa"):
            windows.append(dflash["swa_window_size"] if (sliding or not types) else None)
        else:
            windows.append(raw["sliding_window"] if sliding else None)
    return windows


def _attention(w: dict, prefix: str, raw: dict, h, ctx, window, start):
    """One draft layer's attention: block queries over [context; block] keys, non-causal, windowed."""
    eps, heads, kv_heads, dim = raw["rms_norm_eps"], raw["num_attention_heads"], raw["num_key_value_heads"], raw["head_dim"]
    S, B = ctx.shape[0], h.shape[0]
    q_pos, k_pos = torch.arange(start, start + B), torch.arange(start + B)
    q = rms((h @ w[prefix + "q_proj.weight"].T).view(B, heads, dim), w[prefix + "q_norm.weight"], eps)
    k = torch.cat([ctx, h]) @ w[prefix + "k_proj.weight"].T
    v = torch.cat([ctx, h]) @ w[prefix + "v_proj.weight"].T
    k = rms(k.view(S + B, kv_heads, dim), w[prefix + "k_norm.weight"], eps)
    v = v.view(S + B, kv_heads, dim)
    q, k = rope(q, q_pos, raw["rope_theta"]), rope(k, k_pos, raw["rope_theta"])
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim)
    if window is not None:  # |q - k| <= W - 1, both sides, context and block alike
        scores = scores.masked_fill((k_pos.view(1, -1) - q_pos.view(-1, 1)).abs() > window - 1, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(B, -1)
    return out @ w[prefix + "o_proj.weight"].T


def _mlp(w: dict, prefix: str, h):
    gate, up = h @ w[prefix + "gate_proj.weight"].T, h @ w[prefix + "up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[prefix + "down_proj.weight"].T


def _conv(w: dict, prefix: str, raw: dict, a):
    """DFlash V2's grouped dynamic convolutions of one sublayer: (pre-applied input, post function)."""
    dflash = raw["dflash_config"]
    kernel, groups = dflash["conv_kernel_size"], raw["hidden_size"] // dflash["conv_group_size"]
    coef = (a @ w[prefix + "kernel_projection.weight"].T).view(a.shape[0], 2, kernel, groups)
    base = w[prefix + "base_kernel"]
    pre = reference_dflash2.grouped_dynamic_conv(a, coef[:, 0], base[0])
    return pre, lambda out, residual: reference_dflash2.grouped_dynamic_conv(out, coef[:, 1], base[1], residual)


def reference_draft(w: dict, raw: dict, ctx_features, block_embeds, anchor: int, start: int, lm_head) -> list[int]:
    """The drafts for block positions 1..B-1 (greedy), recomputed from the context features."""
    eps = raw["rms_norm_eps"]
    v2 = "DFlash2DraftModel" in raw["architectures"]
    ctx = rms(ctx_features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    x = block_embeds
    for i, window in enumerate(layer_windows(raw)):
        p = f"layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"], eps)
        if v2:
            a, post = _conv(w, p + "attention_conv.", raw, a)
            x = post(_attention(w, p + "self_attn.", raw, a, ctx, window, start), x)
            a, post = _conv(w, p + "mlp_conv.", raw, rms(x, w[p + "post_attention_layernorm.weight"], eps))
            x = post(_mlp(w, p + "mlp.", a), x)
        else:
            x = x + _attention(w, p + "self_attn.", raw, a, ctx, window, start)
            x = x + _mlp(w, p + "mlp.", rms(x, w[p + "post_attention_layernorm.weight"], eps))
    hidden = rms(x, w["norm.weight"], eps)[1:]
    unary = lm_head(hidden)
    if not v2:
        return unary.argmax(-1).tolist()
    z = hidden @ w["candidate_selector.hidden_projection.weight"].T
    tokens, _, _ = reference_dflash2.candidate_select(
        unary[None],
        z[None],
        torch.tensor([anchor]),
        w["candidate_selector.predecessor_codebook"],
        w["candidate_selector.successor_codebook"],
        torch.zeros(1),
        torch.zeros(1, dtype=torch.long),
        torch.arange(start + 1, start + block_embeds.shape[0])[None],
        raw["dflash_config"]["selector_top_k"],
    )
    return tokens[0].tolist()


def target_forward(model, taps: list[int], tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, tapped features) of `tokens`. Tap i is the output of decoder layer i (DFLASH.md);
    Hugging Face's hidden_states[i + 1] is that except for the last layer, whose entry transformers
    returns after the final norm, and the demo drafter taps the last layer (7 of 8): so the outputs
    are read from the layers themselves."""
    outputs = {}
    hooks = [
        model.model.layers[i].register_forward_hook(lambda m, a, o, i=i: outputs.__setitem__(i, o[0] if isinstance(o, tuple) else o))
        for i in taps
    ]
    try:
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0]
    finally:
        for hook in hooks:
            hook.remove()
    return logits, torch.cat([outputs[i][0] for i in taps], dim=-1)


def reference_generate(target, drafter_dir: Path, prompt: list[int], max_new: int) -> tuple[list[int], list[int]]:
    """z-lab's dflash_generate, greedy, recomputing the target and the drafter from scratch each
    step: (generated tokens, acceptance length of every verify step)."""
    raw = json.loads((drafter_dir / "config.json").read_text())
    weights = {k: v.to(DTYPE) for k, v in load_drafter(drafter_dir, target, dtype=DTYPE).state_dict().items()}
    block, mask = raw["block_size"], raw["dflash_config"]["mask_token_id"]
    taps = raw["dflash_config"]["target_layer_ids"]
    model = target.model
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()

    def forward(tokens):
        return target_forward(model, taps, tokens)

    tokens = list(prompt)
    logits, _ = forward(tokens)
    tokens.append(int(logits[-1].argmax()))
    accepted = []
    with torch.no_grad():
        while len(tokens) - len(prompt) < max_new:
            start = len(tokens) - 1  # the anchor's position; context = positions 0..start-1
            anchor = tokens[-1]
            _, features = forward(tokens[:start])
            block_embeds = embed(torch.tensor([anchor] + [mask] * (block - 1))).to(DTYPE)
            drafts = reference_draft(weights, raw, features.to(DTYPE), block_embeds, anchor, start, lm_head)
            logits, _ = forward(tokens + drafts)
            posterior = logits[start : start + block].argmax(-1).tolist()
            n = 0
            while n < block - 1 and drafts[n] == posterior[n]:
                n += 1
            tokens += drafts[:n] + [posterior[n]]
            accepted.append(n + 1)
    return tokens[len(prompt) : len(prompt) + max_new], accepted


# ----------------------------------------------------------------------------- fixtures


def sliding_variant(source: Path, dest: Path, changes: dict) -> Path:
    """A copy of the drafter at `source` with `changes` merged into its config.json (None deletes)."""
    shutil.copytree(source, dest)
    raw = json.loads((dest / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        elif isinstance(value, dict):
            raw[key] = {**raw.get(key, {}), **value}
        else:
            raw[key] = value
    (dest / "config.json").write_text(json.dumps(raw, indent=2))
    return dest


@pytest.fixture(scope="module")
def target():
    return load_target(DEMO_DIR / "target", dtype=DTYPE)


@pytest.fixture(scope="module")
def prompts():
    """Three ragged prompts (27, 33 and 40 tokens), all longer than the window."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "target")
    texts = [json.loads(line)["prompt"] for line in (DEMO_DIR / "heldout_prompts.jsonl").read_text().splitlines()[:3]]
    ids = [tokenizer(text)["input_ids"] for text in texts]
    assert all(len(i) >= 40 for i in ids)
    return [ids[0][:40], ids[1][:27], ids[2][:33]]


def decode(runtime, prompts: list[list[int]], **params):
    decoder = Decoder(runtime, max_batch=len(prompts), max_context=128)
    return decoder.generate([Request(list(p), SamplingParams(max_new_tokens=NEW_TOKENS, **params)) for p in prompts])


def assert_reference_steps(results, target, drafter_dir: Path, prompts) -> list[list[int]]:
    """Every row's tokens and per-step acceptance lengths equal the reference loop's."""
    expected = [reference_generate(target, drafter_dir, p, NEW_TOKENS) for p in prompts]
    assert [r.token_ids for r in results] == [tokens for tokens, _ in expected]
    assert [r.acceptance_lengths for r in results] == [steps for _, steps in expected]
    assert max(max(steps) for _, steps in expected) > 2  # the drafter really drafts
    return [steps for _, steps in expected]


# ----------------------------------------------------------------------------- the torch runtime


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_v1_sliding_drafters_accept_what_the_reference_accepts(tmp_path, target, prompts, variant):
    drafter_dir = sliding_variant(DEMO_DIR / "drafter", tmp_path / variant, VARIANTS[variant])
    runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target, dtype=DTYPE))
    assert_reference_steps(decode(runtime, prompts), target, drafter_dir, prompts)


def test_the_window_changes_what_is_drafted(tmp_path, target, prompts):
    """The test can fail: causal sliding layers (the old reading) draft differently from the
    reference, and so does the drafter without its window."""
    drafter_dir = sliding_variant(DEMO_DIR / "drafter", tmp_path / "sliding", VARIANTS["sliding"])
    expected = [reference_generate(target, drafter_dir, p, NEW_TOKENS)[1] for p in prompts]
    full = decode(TorchRuntime(target.model, load_drafter(DEMO_DIR / "drafter", target, dtype=DTYPE)), prompts)
    assert [r.acceptance_lengths for r in full] != expected
    drafter = load_drafter(drafter_dir, target, dtype=DTYPE)
    for layer in drafter.layers:  # what the drafter did before: causal inside the block on sliding layers
        if layer.self_attn.attention.window:
            layer.self_attn.attention = type(layer.self_attn.attention)(layer.self_attn.attention.window, causal=True)
    causal = decode(TorchRuntime(target.model, drafter), prompts)
    assert [r.acceptance_lengths for r in causal] != expected


def test_a_window_wider_than_the_context_drafts_exactly_what_full_attention_drafts(tmp_path, target, prompts):
    wide = sliding_variant(DEMO_DIR / "drafter", tmp_path / "wide", {"layer_types": [SLIDING] * 3, "sliding_window": 4096})
    results = {}
    for name, path in (("wide", wide), ("full", DEMO_DIR / "drafter")):
        drafter = load_drafter(path, target, dtype=DTYPE)
        results[name] = decode(TorchRuntime(target.model, drafter), prompts)
    assert [r.acceptance_lengths for r in results["wide"]] == [r.acceptance_lengths for r in results["full"]]
    # and one drafting step, output for output
    outs = {}
    for name, path in (("wide", wide), ("full", DEMO_DIR / "drafter")):
        drafter = load_drafter(path, target, dtype=DTYPE)
        runtime = TorchRuntime(target.model, drafter)
        runtime.allocate(1, 128)
        prefill = runtime.target_forward(slice(0, 1), torch.tensor([prompts[0]]), torch.tensor([0]), len(prompts[0]))
        block = torch.tensor([[prompts[0][-1]] + [drafter.config.mask_token_id] * 7])
        outs[name] = runtime.draft_forward(
            slice(0, 1), block, prefill.features[:, :-1], torch.tensor([len(prompts[0]) - 1]), torch.tensor([0])
        )
    torch.testing.assert_close(outs["wide"], outs["full"], rtol=1e-12, atol=1e-12)


def test_v2_sliding_drafter_accepts_what_the_reference_accepts(tmp_path, target, prompts):
    drafter_dir = sliding_variant(DEMO_DIR / "drafter_v2", tmp_path / "v2", VARIANTS["sliding"])
    runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target, dtype=DTYPE))
    assert_reference_steps(decode(runtime, prompts), target, drafter_dir, prompts)


# ----------------------------------------------------------------------------- the ONNX graphs


BOUNDS_KW = dict(max_batch=4, max_input_len=48, max_seq_len=128, block_size=8)


def export_sliding_pair(root: Path, variant: str) -> tuple[Path, Path]:
    """The demo target and a sliding V1 drafter (use_swa on layers 0 and 2) exported in float32."""
    from trtllm_dflash.builder.export import Bounds, export_pair

    drafter_dir = sliding_variant(DEMO_DIR / "drafter", root / "drafter", VARIANTS["use_swa+layer_types"])
    target = load_target(DEMO_DIR / "target", dtype=torch.float32)
    export_pair(target.model, load_drafter(drafter_dir, target), root / "export", "fp32", Bounds(**BOUNDS_KW), variants=(variant,))
    return drafter_dir, root / "export"


@pytest.fixture(scope="module")
def native_export(tmp_path_factory) -> tuple[Path, Path]:
    return export_sliding_pair(tmp_path_factory.mktemp("sliding-native"), "native")


@pytest.mark.parametrize("plugin", [False, True], ids=["native-masks", "plugin-op"])
def test_the_drafter_graph_drafts_what_the_reference_drafts(tmp_path, target, prompts, plugin):
    """The module the ONNX export traces (graphs/drafter.py: its own masks, or the block-attention
    plugin op), two steps of a ragged batch of 2 (the second over the first's cached keys): every
    row's drafts are the reference's. (The exported graphs themselves: the slow tests below.)"""
    from trtllm_dflash.graphs.drafter import DrafterGraph

    drafter_dir = sliding_variant(DEMO_DIR / "drafter", tmp_path / "sliding", VARIANTS["use_swa+layer_types"])
    raw = json.loads((drafter_dir / "config.json").read_text())
    drafter = load_drafter(drafter_dir, target, dtype=DTYPE)
    model = target.model
    graph = DrafterGraph(drafter, model.get_input_embeddings(), model.get_output_embeddings(), plugin=plugin)
    weights = {k: v.to(DTYPE) for k, v in drafter.state_dict().items()}
    rows = [prompts[0], prompts[1][:20]]
    features = [target_forward(model, raw["dflash_config"]["target_layer_ids"], p)[1].to(DTYPE) for p in rows]
    config, mask = drafter.config, raw["dflash_config"]["mask_token_id"]
    cut = [len(rows[0]) - 9, len(rows[1]) - 3]  # step 1 sees the first `cut` positions, step 2 the rest
    empty = torch.zeros(2, 128, config.num_key_value_heads, config.head_dim, dtype=DTYPE)  # the graphs' cache capacity
    past_keys, past_values = [empty] * config.num_hidden_layers, [empty] * config.num_hidden_layers
    cache_lens = torch.zeros(2, dtype=torch.long)
    for step in range(2):
        ends = cut if step == 0 else [len(r) for r in rows]
        new = [end - int(start) for end, start in zip(ends, cache_lens)]
        ctx = torch.zeros(2, max(new), features[0].shape[-1], dtype=DTYPE)
        for r in range(2):
            ctx[r, : new[r]] = features[r][int(cache_lens[r]) : ends[r]]
        anchors = [rows[r][ends[r]] if ends[r] < len(rows[r]) else rows[r][-1] for r in range(2)]
        block = torch.tensor([[a] + [mask] * (config.block_size - 1) for a in anchors])
        with torch.no_grad():
            logits, keys, values = graph(block, ctx, torch.tensor(new), cache_lens, tuple(past_keys), tuple(past_values))
        for r in range(2):
            embeds = model.get_input_embeddings()(block[r]).to(DTYPE)
            expected = reference_draft(weights, raw, features[r][: ends[r]], embeds, anchors[r], ends[r], model.get_output_embeddings())
            assert logits[r].argmax(-1).tolist() == expected, (step, r)
        past_keys = [_grow(p, k, cache_lens, new, ends) for p, k in zip(past_keys, keys)]
        past_values = [_grow(p, v, cache_lens, new, ends) for p, v in zip(past_values, values)]
        cache_lens = torch.tensor(ends)


def _grow(past: torch.Tensor, new_rows: torch.Tensor, cache_lens: torch.Tensor, new: list[int], ends: list[int]) -> torch.Tensor:
    """The draft cache the next step reads: row r's slots [0, ends[r]) hold its context keys (or values)."""
    cache = torch.zeros_like(past)
    for r, start in enumerate(cache_lens.tolist()):
        cache[r, :start] = past[r, :start]
        cache[r, start : ends[r]] = new_rows[r, : new[r]]
    return cache


@pytest.mark.slow  # ~35 s: the demo target's and the drafter's ONNX export
def test_the_native_graphs_accept_what_the_reference_accepts(native_export, target, prompts):
    """The drafter graph's own masks (graphs/drafter.py) on onnxruntime, float32: the reference's
    acceptance lengths, step for step, for the batch of ragged rows."""
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    drafter_dir, export = native_export
    assert_reference_steps(decode(OnnxRuntime(export, "native"), prompts), target, drafter_dir, prompts)


@pytest.mark.slow  # ~18 s: the V2 drafter graph's export (V2 graphs against the torch runtime: test_dflash2_engines.py)
def test_the_native_v2_graphs_accept_what_the_reference_accepts(native_export, target, prompts, tmp_path):
    """The sliding V2 drafter's graph (its convolutions and selector scores, the same masks) beside the
    exported target graph: the reference's acceptance lengths, step for step."""
    import shutil as sh

    from trtllm_dflash.builder.export import Bounds, export_drafter, write_graphs_json
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    drafter_dir = sliding_variant(DEMO_DIR / "drafter_v2", tmp_path / "v2", VARIANTS["sliding"])
    export = sh.copytree(native_export[1], tmp_path / "export")  # the target graph is the same: only the drafter changes
    target32 = load_target(DEMO_DIR / "target", dtype=torch.float32)
    drafter = load_drafter(drafter_dir, target32)
    model = target32.model
    info = json.loads((export / "graphs.json").read_text())
    info["variants"]["native"]["drafter"] = export_drafter(
        drafter,
        model.get_input_embeddings(),
        model.get_output_embeddings(),
        export / "native" / "drafter.onnx",
        "fp32",
        Bounds(**BOUNDS_KW),
    ).to_dict()
    write_graphs_json(export, info)
    (export / "drafter" / "config.json").write_text(json.dumps(drafter.config.to_dict(), indent=2))
    assert_reference_steps(decode(OnnxRuntime(export, "native"), prompts), target, drafter_dir, prompts)


@pytest.mark.slow  # a plugin export of the demo pair (~35 s) and decoding through the nodes' CPU evaluators
def test_the_plugin_nodes_accept_what_the_reference_accepts(tmp_path, target, prompts):
    """The DFlash block-attention nodes (window and causal attributes) on their CPU evaluators."""
    import onnx

    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    drafter_dir, export = export_sliding_pair(tmp_path, "plugin")
    nodes = [n for n in onnx.load(str(export / "plugin" / "drafter.onnx")).graph.node if n.op_type == "DFlashBlockAttention"]
    windows = [next(a.i for a in n.attribute if a.name == "window") for n in nodes]
    assert windows == [WINDOW, 0, WINDOW]
    assert_reference_steps(decode(OnnxRuntime(export, "plugin"), prompts), target, drafter_dir, prompts)


@pytest.mark.slow  # the native export (~35 s); the engine build itself takes ~2 s
def test_tensorrt_rtx_builds_the_sliding_drafter_engine(native_export, tmp_path):
    """The sliding drafter's native graph parses and builds into a real TensorRT-RTX engine for
    SM 12.0, ahead of time on this CPU machine (running it needs the GPU)."""
    pytest.importorskip("tensorrt_rtx_bindings", reason="needs TensorRT-RTX: pip install 'trtllm-dflash[rtx]'")
    from trtllm_dflash.builder import engines
    from trtllm_dflash.builder.export import Bounds

    _, export = native_export
    info = json.loads((export / "graphs.json").read_text())["variants"]["native"]["drafter"]
    built = engines.build_engine(
        engines.load_flavour("tensorrt-rtx"),
        export / "native" / "drafter.onnx",
        tmp_path / "drafter.engine",
        info,
        engines.profiles("drafter", Bounds(**BOUNDS_KW)),
        (12, 0),
    )
    assert built["bytes"] == (tmp_path / "drafter.engine").stat().st_size > 0
