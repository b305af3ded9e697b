"""Bytes per verify step, counted from the built graphs (`trtllm_dflash/builder/traffic.py`).

One build of a tiny Gemma 3 pair (a sliding layer with window 8 and a full layer; BF16 graphs
of both variants) through the real checkpoints -> quantize -> export stages. The acceptance
check of issue 12: the plugin target's bytes do not change when the capacity doubles at a
fixed context, while the native target's grow with it. Then the hand computation of the tiny
graph, the closed form against the walked graphs, the export stage's traffic.json and the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_dflash.builder import traffic
from trtllm_dflash.builder.traffic import Step

pytest.importorskip("onnxscript", reason="needs the export extra: pip install 'trtllm-dflash[export]'")

WINDOW = 8  # testing.TINY_SLIDING_WINDOW: layer 0 slides, layer 1 is full
KV_HEADS, HEAD_DIM, HIDDEN, VOCAB, BF16 = 2, 16, 64, 128, 2
SLOT = KV_HEADS * HEAD_DIM * BF16  # bytes of one K (or V) slot of one row of one layer
RECIPE = """\
model: {{name: {target}, checkpoint: {target}}}
drafter: {{checkpoint: {drafter}, block_size: 4}}
gpu: h100
backend: trt
quantization: {{weights: bf16, kv_cache: bf16, drafter: bf16}}
limits: {{max_batch_size: 4, max_input_len: 32, max_seq_len: 64}}
triton: {{max_batch_size: 4}}
trt: {{flavour: tensorrt, use_plugins: true}}
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    """OUT of `dflash-trt build` after its export stage (checkpoints, quantize, export), both variants."""
    from trtllm_dflash.builder.pipeline import make_stages, write_manifest
    from trtllm_dflash.builder.spec import resolve_spec
    from trtllm_dflash.builder.stages import StageRunner
    from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("traffic")
    target = make_tiny_target(root / "target", "gemma3", seed=7, num_layers=2, tokenizer=True)
    drafter = make_tiny_drafter(root / "drafter", target, seed=1, block_size=4, num_layers=1, target_layer_ids=(0, 1))
    recipe = root / "tiny.yaml"
    recipe.write_text(RECIPE.format(target=target, drafter=drafter))
    spec = resolve_spec(recipe=str(recipe))
    stages = [stage for stage in make_stages(spec, target, drafter) if stage.name in ("checkpoints", "quantize", "export")]
    runner = StageRunner(root / "out")
    with runner:
        result = runner.run(stages, lambda r: write_manifest(runner.out, spec, r))
    assert not result.blocked and set(result.records) == {"checkpoints", "quantize", "export"}
    return root / "out"


def step(**sizes) -> Step:
    return Step(**{"batch": 2, "context": 20, "capacity": 64, "block": 4, **sizes})


def category(report: traffic.StepTraffic, name: str) -> dict[str, int]:
    return report.by_category()[name]


def item(report: traffic.StepTraffic, graph: str, what: str) -> traffic.Item:
    found = [i for i in report.items if i.graph == graph and i.what.startswith(what)]
    assert len(found) == 1, (what, [i.what for i in report.items if i.graph == graph])
    return found[0]


# ----------------------------------------------------------------------------- the acceptance check


def test_plugin_target_bytes_do_not_grow_with_capacity_native_bytes_do(build):
    small = traffic.explain(build, step(capacity=32))
    large = traffic.explain(build, step(capacity=64))
    plugin_small, plugin_large = small["plugin"], large["plugin"]
    assert plugin_small.graph_total("target") == plugin_large.graph_total("target") > 0
    assert category(plugin_small, "target cache") == category(plugin_large, "target cache")
    assert plugin_small.total == plugin_large.total  # the plugin drafter's reads follow the context too
    # the native graphs read every bound slot: 32 more slots x batch 2 x (K + V) x 2 target layers
    native_small, native_large = small["native"], large["native"]
    grown = category(native_large, "target cache")["read"] - category(native_small, "target cache")["read"]
    assert grown == 32 * 2 * 2 * 2 * SLOT
    assert native_large.graph_total("target") > native_small.graph_total("target")
    assert category(native_large, "draft cache")["read"] > category(native_small, "draft cache")["read"]


def test_plugin_reads_grow_with_the_context_and_a_sliding_layer_stops_at_its_window(build):
    short, longer, longest = (traffic.explain(build, step(context=c, capacity=60))["plugin"] for c in (10, 20, 40))
    reads = [category(r, "target cache")["read"] for r in (short, longer, longest)]
    assert reads[0] < reads[1] < reads[2]
    sliding = [item(r, "target", "cache_key_0:").read for r in (short, longer, longest)]
    full = [item(r, "target", "cache_key_1:").read for r in (short, longer, longest)]
    assert sliding == [2 * (WINDOW + 4 - 1) * SLOT] * 3  # the window's reach, whatever the context
    assert full == [2 * (c + 4) * SLOT for c in (10, 20, 40)]
    # native reads do not follow the context at all
    native = [category(traffic.explain(build, step(context=c, capacity=60))["native"], "target cache")["read"] for c in (10, 40)]
    assert native[0] == native[1]


def test_native_target_writes_logits_and_the_plugin_target_returns_only_its_result(build):
    report = traffic.explain(build, step())
    native, plugin = report["native"], report["plugin"]
    logits = 2 * 4 * VOCAB * BF16  # batch x block x vocab, bf16
    assert item(native, "target", "output logits").written == logits
    assert item(native, "runtime", "target logits read").read == logits
    assert not [i for i in plugin.items if i.graph == "target" and i.what == "output logits"]
    assert item(plugin, "target", "output result").written == 2 * 5 * 8
    assert not [i for i in plugin.items if i.graph == "runtime" and "target" in i.what and "logits" in i.what]
    # inside the plugin engine the logits still go LM head -> verify node once
    inside = item(plugin, "target", "logits inside the engine")
    assert inside.read == inside.written == logits


# ----------------------------------------------------------------------------- by hand


def test_tiny_graph_numbers_equal_a_hand_computation(build):
    import torch

    from trtllm_dflash.checkpoints import load_target

    s = step()  # batch 2, context 20, capacity 64, block 4 (new rows 4)
    report = traffic.explain(build, s)
    native, plugin = report["native"], report["plugin"]
    kv = 2 * SLOT  # K + V of one slot, one layer
    # plugin target: sliding layer reads min(20 + 4, 8 + 4 - 1) = 11 slots, full layer 24; each writes 4
    assert category(plugin, "target cache") == {"read": 2 * (11 + 24) * kv, "written": 2 * 2 * 4 * kv}
    # native target: both layers read all 64 bound slots; new K/V written by the engine, then scattered
    assert category(native, "target cache") == {"read": 2 * 2 * 64 * kv + 2 * 2 * 4 * kv, "written": 2 * (2 * 2 * 4 * kv)}
    # drafter (1 layer): plugin reads the 20 context slots, writes 4 in place; native reads 64
    append = {"read": 2 * 2 * 4 * kv, "written": 2 * 4 * kv}  # the runtime's append_rows
    assert category(plugin, "draft cache") == {"read": 2 * 20 * kv + append["read"], "written": 2 * 4 * kv * 2 + append["written"]}
    assert category(native, "draft cache") == {"read": 2 * 64 * kv + append["read"], "written": 2 * 4 * kv + append["written"]}
    # weights: every parameter once (bf16), the embedding table only at the looked-up rows
    target = load_target(build.parent / "target", dtype=torch.bfloat16).model
    params = sum(p.numel() for p in target.parameters()) * BF16
    rows = item(native, "target", "embedding rows").read
    assert rows == 2 * 4 * HIDDEN * BF16
    dense = item(native, "target", "initializers").read
    assert abs(dense - params) / params < 0.02, (dense, params)  # + folded constants, - a folded norm


def test_weight_rules_on_a_hand_built_graph(tmp_path):
    """FP8 Q/DQ weights count one byte each, a Cast-only initializer at the cast's dtype, a
    Gather-only table per looked-up row; a Shape-only reader of a cache reads nothing."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    fp8 = helper.make_tensor("w_fp8", TensorProto.FLOAT8E4M3FN, [16, 8], np.zeros(128, dtype=np.float32).tolist())
    scale = numpy_helper.from_array(np.ones((), dtype=np.float32), "w_scale")
    folded = numpy_helper.from_array(np.zeros((8, 4), dtype=np.float32), "w_cast")  # 4 bytes stored, read as fp16
    table = numpy_helper.from_array(np.zeros((100, 16), dtype=np.float32), "table")
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["x"]),
        helper.make_node("DequantizeLinear", ["w_fp8", "w_scale"], ["w"]),
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Cast", ["w_cast"], ["w16"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["h"], ["h16"], to=TensorProto.FLOAT16),
        helper.make_node("MatMul", ["h16", "w16"], ["features"]),
        helper.make_node("Shape", ["past_key_0"], ["unused_shape"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("past_key_0", TensorProto.FLOAT16, ["batch", "past", 2, 4]),
        ],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT16, ["batch", "tokens", 4])],
        [fp8, scale, folded, table],
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    info = {
        "variant": "native",
        "file": "g.onnx",
        "inputs": [{"name": "input_ids", "dims": ["batch", "tokens"]}, {"name": "past_key_0", "dims": ["batch", "past", 2, 4]}],
    }
    summary = traffic.summarize_graph(path, info, "target")
    assert summary.dense_weight_bytes == 16 * 8 * 1 + 4 + 8 * 4 * 2
    assert summary.gathered == (("input_ids", 16 * 4),)
    assert summary.caches == (traffic.CacheTensor("past_key_0", 2 * 4 * 2, "unused"),)
    items = traffic.graph_items(summary, step())
    assert item_sum(items, "embedding rows") == 2 * 4 * 16 * 4  # batch x block rows of 64 bytes
    assert item_sum(items, "output features") == 2 * 4 * 4 * 2


def item_sum(items, what: str) -> int:
    return sum(i.read + i.written for i in items if i.what.startswith(what))


def test_closed_form_matches_the_walked_graphs(build):
    """The closed form (what the Qwen3-8B figures use) gives the walked graphs' bytes, weights aside."""
    walked = traffic.load_build(build)
    shape = traffic.ModelShape(
        target_layers=(traffic.LayerShape(KV_HEADS, HEAD_DIM, HEAD_DIM, WINDOW), traffic.LayerShape(KV_HEADS, HEAD_DIM, HEAD_DIM, 0)),
        target_weight_bytes=walked["native"][0].dense_weight_bytes,
        target_row_bytes=HIDDEN * BF16,
        drafter_layers=(traffic.LayerShape(KV_HEADS, HEAD_DIM, HEAD_DIM, 0),),
        drafter_weight_bytes=walked["native"][1].dense_weight_bytes,
        drafter_row_bytes=HIDDEN * BF16,
        vocab=VOCAB,
        features=2 * HIDDEN,
        act_bytes=BF16,
    )
    for s in (step(), step(context=40, capacity=60, sampled=1, new_rows=2)):
        graphs = traffic.explain(build, s)
        closed = traffic.explain_model(shape, s)
        for variant in ("native", "plugin"):
            got, expected = closed[variant].by_category(), graphs[variant].by_category()
            weights_delta = graphs[variant].by_category()["weights"]["read"] - got["weights"]["read"]
            assert abs(weights_delta) < 200, (variant, weights_delta)  # the variants fold a few constants differently
            for name in traffic.CATEGORIES[1:]:
                assert got[name] == expected[name], (variant, name, got[name], expected[name])


def test_qwen3_8b_closed_form_numbers_in_the_docs():
    from trtllm_dflash.catalog.models import resolve_model

    shape = traffic.ModelShape.from_catalog(resolve_model("qwen3-8b"))
    s = Step(batch=64, context=8192, capacity=16384, block=16)
    report = traffic.explain_model(shape, s)
    native, plugin = report["native"], report["plugin"]
    slot = 36 * 2 * 8 * 128 * 2  # K + V of every layer: 144 KiB per token
    assert category(native, "target cache")["read"] == 64 * 16384 * slot + 64 * 16 * slot  # + the scatter's read
    assert category(plugin, "target cache")["read"] == 64 * (8192 + 16) * slot
    assert round(native.total / 1e9, 1) == 196.4 and round(plugin.total / 1e9, 1) == 108.8
    doubled = traffic.explain_model(shape, Step(batch=64, context=8192, capacity=32768, block=16))
    assert doubled["plugin"].total == plugin.total and doubled["native"].total > native.total
    assert "196.4" in (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()


# ----------------------------------------------------------------------------- the build and the CLI


def test_export_stage_writes_traffic_json_and_the_manifest_summary(build):
    written = json.loads((build / "export" / "traffic.json").read_text())
    graphs = json.loads((build / "export" / "graphs.json").read_text())
    expected = traffic.default_step(graphs["bounds"])
    assert written["step"]["batch"] == 4 and written["step"]["capacity"] == 64 and written["step"]["block"] == 4
    recomputed = traffic.explain(build, expected)
    assert {v: t["total"] for v, t in written["variants"].items()} == {v: t.total for v, t in recomputed.items()}
    manifest = json.loads((build / "manifest.json").read_text())
    summary = manifest["stages"]["export"]["summary"]["bytes_per_verify_step"]
    assert summary == {v: t.total for v, t in recomputed.items()} and summary["plugin"] < summary["native"]


def test_cli_prints_the_table_and_json(build, run_main):
    code, out, err = run_main("explain-bytes", str(build), "--context", "20", "--capacity", "64", "--batch", "2")
    assert code == 0, err
    for text in ("target cache", "draft cache", "native read", "plugin written", "plugin / native", "batch 2, context 20"):
        assert text in out
    code, out, err = run_main("explain-bytes", str(build / "export"), "--variant", "plugin", "--json", "--sampled", "1")
    assert code == 0, err
    data = json.loads(out)
    assert list(data["variants"]) == ["plugin"] and data["variants"]["plugin"]["step"]["sampled"] == 1
    assert data["variants"]["plugin"]["total"] == data["variants"]["plugin"]["read"] + data["variants"]["plugin"]["written"]


def test_cli_refuses_what_is_not_a_build_in_one_line(build, run_main, tmp_path):
    code, out, err = run_main("explain-bytes", str(tmp_path))
    assert code == 2 and "is not a dflash-trt build" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_main("explain-bytes", str(build), "--context", "80", "--capacity", "64")
    assert code == 2 and "does not fit a cache of 64 slots" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_main("explain-bytes", str(build), "--variant", "fancy")
    assert code == 2 and "unknown --variant" in err


def test_cli_model_closed_form(run_main):
    code, out, err = run_main("explain-bytes", "--model", "qwen3-8b", "--json")
    assert code == 0, err
    data = json.loads(out)["variants"]
    assert data["native"]["step"]["block"] == 16 and data["plugin"]["total"] < data["native"]["total"]


def test_build_explain_bytes_prints_the_builds_table(build):
    """What `dflash-trt build --explain-bytes` prints after the export: the table at the build's bounds."""
    import io

    from rich.console import Console

    from trtllm_dflash.cli.explain_bytes import print_build_traffic

    buffer = io.StringIO()
    print_build_traffic(build, Console(file=buffer, width=200))
    text = buffer.getvalue()
    assert "target cache" in text and "native:" in text and "plugin:" in text and "plugin / native:" in text
