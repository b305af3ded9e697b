"""A real build on CPU: ONNX graphs checked against the torch runtime, TensorRT-RTX engines AOT.

One build (module fixture) of the embedded demo pair for an RTX PRO 6000 (SM 12.0), or of a tiny
random pair while the demo is not installed, with the same command a user runs:
`dflash-trt build --model demo --gpu rtx-pro-6000 --out DIR`. The tests then check the graphs'
numerics and a full speculative decode through them against the torch runtime, the engines
and the manifest, re-runs, determinism and bad inputs that must not damage the build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import invoke

from trtllm_dflash.demo import DEMO_DIR

HAVE_DEMO = (DEMO_DIR / "target" / "config.json").is_file() and (DEMO_DIR / "drafter" / "config.json").is_file()


TINY_RECIPE = """\
# a tiny random pair built like the demo recipe (demo/rtx-pro-6000.yaml): FP16, plugin-free graphs
model: {{name: {target}, checkpoint: {target}}}
drafter: {{checkpoint: {drafter}, block_size: 4}}
gpu: rtx-pro-6000
backend: trt
quantization: {{weights: fp16, kv_cache: fp16, drafter: fp16}}
limits: {{max_batch_size: 4, max_input_len: 64, max_seq_len: 128}}
triton: {{max_batch_size: 4}}
trt: {{flavour: tensorrt-rtx, use_plugins: false}}
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    """The checkpoints being built: the demo pair, or a tiny random Llama pair (block 4) until it ships."""
    if HAVE_DEMO:
        return {"args": ["--model", "demo"], "target": DEMO_DIR / "target", "drafter": DEMO_DIR / "drafter"}
    from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("pair")
    target = make_tiny_target(root / "target", "llama", seed=2, num_layers=2, tokenizer=True)
    drafter = make_tiny_drafter(root / "drafter", target, seed=3, block_size=4, num_layers=2, target_layer_ids=(0, 1))
    recipe = root / "tiny-rtx.yaml"
    recipe.write_text(TINY_RECIPE.format(target=target.resolve(), drafter=drafter.resolve()))
    return {
        "args": ["--recipe", str(recipe)],
        "target": target,
        "drafter": drafter,
        "local": ["--model", str(target), "--drafter", str(drafter)],
    }


@pytest.fixture(scope="module")
def build(pair, tmp_path_factory, request) -> Path:
    """The build these tests check (and may damage): a copy of the session's demo build, on which
    the same command then runs again (skipping every stage), or a fresh build of the tiny pair."""
    out = tmp_path_factory.mktemp("build") / "out"
    gpu = ["--gpu", "rtx-pro-6000"] if HAVE_DEMO else []
    if HAVE_DEMO:
        shutil.copytree(request.getfixturevalue("demo_build"), out, symlinks=True)
    result = invoke("build", *pair["args"], *gpu, "--out", str(out))
    assert result.exit_code == 0, (result.output, result.exception)
    return out


@pytest.fixture(scope="module")
def manifest(build) -> dict:
    return json.loads((build / "manifest.json").read_text())


@pytest.fixture(scope="module")
def reference(build, manifest, pair):
    """The torch runtime on the weights the graphs hold (rounded to the graph dtype), in float32."""
    from trtllm_dflash.builder.export import DTYPES
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    dtype = manifest["stages"]["export"]["summary"]["dtype"]
    target = load_target(pair["target"], dtype=DTYPES[dtype])
    drafter = load_drafter(pair["drafter"], target)
    return TorchRuntime(target.model.float(), drafter.float())


@pytest.fixture(scope="module")
def onnx_runtime(build):
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    return OnnxRuntime(build / "export", "native")


# ----------------------------------------------------------------------------- graphs vs torch


def test_graphs_reproduce_logits_and_taps_for_prefill_verify_and_draft(onnx_runtime, reference, manifest):
    from trtllm_dflash.builder.validate import TOLERANCE, compare_runtimes

    block = manifest["stages"]["export"]["summary"]["block_size"]
    results = {r.name: r for r in compare_runtimes(onnx_runtime, reference, block, prompt_lengths=(9, 5), seed=1)}
    for name in (
        "prefill.logits",
        "prefill.features",
        "verify.logits",
        "verify.features",
        "draft.logits (empty draft cache)",
        "draft.logits (filled draft cache)",
        "target_cache.key[0]",
        "draft_cache.key[0]",
    ):
        assert results[name].rel < TOLERANCE, (name, results[name])
    for name in ("prefill.logits", "verify.logits", "draft.logits (filled draft cache)"):
        assert results[name].argmax_agree == 1.0
    # taps are the outputs of the drafter's target_layer_ids: [b, T, taps * hidden]
    taps = len(reference.drafter_config.target_layer_ids) * reference.drafter_config.hidden_size
    out = onnx_runtime.target_forward(slice(0, 1), torch.tensor([[5, 6, 7]]), torch.tensor([0]), 3)
    assert out.features.shape == (1, 3, taps)


def _decode(runtime, prompts, **params):
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams

    decoder = Decoder(runtime, max_batch=len(prompts), max_context=96)
    return decoder.generate([Request(list(p), SamplingParams(max_new_tokens=40, **params)) for p in prompts])


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]


def test_chunked_prefill_through_the_graphs_equals_a_whole_one(onnx_runtime):
    """A chunk is a prefill starting at the row's prefilled length: the graphs take it through `starts`."""
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams

    def decode(chunk: int):
        decoder = Decoder(onnx_runtime, max_batch=2, max_context=96, prefill_chunk=chunk)  # the third prompt joins mid-stream
        results = decoder.generate([Request(list(p), SamplingParams(max_new_tokens=20)) for p in PROMPTS])
        return [(r.token_ids, r.acceptance_lengths) for r in results]

    assert decode(4) == decode(0)


def test_a_batch_with_a_gap_between_its_slots_runs_the_graphs_once_per_run(onnx_runtime, reference):
    """The graphs take contiguous cache rows: when the middle request finishes first, slots 0 and 2
    decode on as two calls per pass (runtime/base.py `contiguous_slots`), the same tokens as the
    torch runtime, which indexes its slots directly."""
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams

    def decode(runtime):
        decoder = Decoder(runtime, max_batch=3, max_context=96)
        limits = (20, 2, 20)
        for prompt, limit in zip(PROMPTS, limits):
            decoder.submit(Request(list(prompt), SamplingParams(max_new_tokens=limit)))
        done, gapped = {}, 0
        while decoder.has_work:
            gapped += decoder.live_slots.run is None and len(decoder.live) > 1
            done.update({e.request_id: e.result.token_ids for e in decoder.step() if e.finished})
        return [done[i] for i in range(3)], gapped

    (graphs, gapped), (torch_tokens, _) = decode(onnx_runtime), decode(reference)
    assert gapped > 0 and graphs == torch_tokens


def test_speculative_decode_through_the_graphs_equals_the_torch_runtime(onnx_runtime, reference):
    greedy_onnx = _decode(onnx_runtime, PROMPTS)
    greedy_torch = _decode(reference, PROMPTS)
    assert [r.token_ids for r in greedy_onnx] == [r.token_ids for r in greedy_torch]
    # lossless: the target alone (autoregressive, torch) gives the same greedy tokens
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    autoregressive = _decode(TorchRuntime(reference.model), PROMPTS)
    assert [r.token_ids for r in greedy_onnx] == [r.token_ids for r in autoregressive]
    # sampling (counter RNG, same seeds): the same tokens, with multi-token steps and rollbacks
    sampled_onnx = _decode(onnx_runtime, PROMPTS, temperature=1.0, seed=11)
    sampled_torch = _decode(reference, PROMPTS, temperature=1.0, seed=11)
    assert [r.token_ids for r in sampled_onnx] == [r.token_ids for r in sampled_torch]
    assert [r.acceptance_lengths for r in sampled_onnx] == [r.acceptance_lengths for r in sampled_torch]
    steps = [tau for r in sampled_onnx + greedy_onnx for tau in r.acceptance_lengths]
    assert max(steps) > 1 and min(steps) == 1  # drafts were accepted and rejected


def test_bench_on_the_build_runs_its_graphs_and_matches_the_torch_runtime(build, reference):
    """`dflash-trt bench --build DIR` on CPU: the build's ONNX graphs, AR vs DFlash, lossless."""
    from trtllm_dflash.bench.measure import BenchConfig, run_bench
    from trtllm_dflash.bench.systems import open_system
    from trtllm_dflash.errors import DFlashError

    backend = open_system(build=build)
    assert backend.name == "onnxruntime" and backend.describe()["artifacts"].endswith("export")
    prompts = ["def __init__(self, name):", "import os\nimport sys\n"]
    report = run_bench(backend, prompts, BenchConfig(max_new_tokens=12, block_sizes=[2, backend.block_size], concurrency=[2], warmup=False))
    assert report["summary"]["lossless"] is True and report["concurrency"][0]["identical_outputs"] == 2
    graphs = backend.run(prompts, True, backend.block_size, 1, 12)
    expected = _decode(reference, [backend.encode(p) for p in prompts])
    assert [r.token_ids[:12] for r in expected] == [r.token_ids for r in graphs.results]
    with pytest.raises(DFlashError, match="beyond the build's bound"):
        backend.run(prompts, True, backend.block_size + 1, 1, 4)


def test_native_graphs_use_only_standard_onnx_ops(build):
    import onnx

    for name in ("target", "drafter"):
        model = onnx.load(str(build / "export" / "native" / f"{name}.onnx"), load_external_data=False)
        domains = {node.domain for node in model.graph.node}
        assert domains <= {"", "ai.onnx"}, domains


# ----------------------------------------------------------------------------- the plugin variant, determinism


@pytest.fixture(scope="module")
def plugin_export(build, pair, tmp_path_factory) -> Path:
    """The build's export plus the plugin variant of the drafter (the demo recipe builds plugin-free engines)."""
    from trtllm_dflash.builder import plugin_graphs
    from trtllm_dflash.builder.export import DTYPES, Bounds, export_drafter, write_graphs_json
    from trtllm_dflash.checkpoints import load_drafter, load_target

    root = tmp_path_factory.mktemp("plugin") / "export"
    shutil.copytree(build / "export", root)
    info = json.loads((root / "graphs.json").read_text())
    target = load_target(pair["target"], dtype=DTYPES[info["dtype"]])
    drafter = load_drafter(pair["drafter"], target)
    plugin, translations = plugin_graphs.export_options("plugin")
    model = target.model
    graph = export_drafter(
        drafter,
        model.get_input_embeddings(),
        model.get_output_embeddings(),
        root / "plugin" / "drafter.onnx",
        info["dtype"],
        Bounds(**info["bounds"]),
        "plugin",
        plugin,
        translations,
    )
    info["variants"]["plugin"] = {"target": {**info["variants"]["native"]["target"], "dir": "native"}, "drafter": graph.to_dict()}
    write_graphs_json(root, info)
    return root


def test_plugin_graph_holds_the_tensorrt_plugin_node(plugin_export, reference):
    import onnx

    from trtllm_dflash.plugins import onnx_nodes

    model = onnx.load(str(plugin_export / "plugin" / "drafter.onnx"))
    nodes = [n for n in model.graph.node if n.domain == onnx_nodes.DOMAIN]
    assert [n.op_type for n in nodes] == ["DFlashBlockAttention"] * reference.drafter_config.num_hidden_layers
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes["plugin_namespace"] == b"dflash" and attributes["plugin_version"] == b"2" and attributes["aot"] == 1
    assert attributes["scale"] == pytest.approx(reference.drafter_config.head_dim**-0.5)


def test_plugin_graphs_evaluated_with_the_nodes_cpu_evaluators_match_torch(plugin_export, reference, manifest):
    from trtllm_dflash.builder.validate import TOLERANCE, compare_runtimes, greedy_tokens
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    plugin = OnnxRuntime(plugin_export, "plugin")  # the drafter on onnx.reference + the plugin evaluator
    assert plugin.drafter_session.backend == "reference" and plugin.target_session.backend == "onnxruntime"
    block = manifest["stages"]["export"]["summary"]["block_size"]
    results = {r.name: r for r in compare_runtimes(plugin, reference, block, prompt_lengths=(6, 3), seed=3)}
    for name in ("draft.logits (empty draft cache)", "draft.logits (filled draft cache)", "draft_cache.key[0]"):
        assert results[name].rel < TOLERANCE, results[name]
    prompts = PROMPTS[:2]
    assert greedy_tokens(plugin, prompts, 12) == greedy_tokens(reference, prompts, 12)


def test_export_is_deterministic(build, pair, tmp_path):
    from trtllm_dflash.builder.export import DTYPES, Bounds, export_drafter
    from trtllm_dflash.checkpoints import load_drafter, load_target

    info = json.loads((build / "export" / "graphs.json").read_text())
    target = load_target(pair["target"], dtype=DTYPES[info["dtype"]])
    drafter = load_drafter(pair["drafter"], target)
    torch.manual_seed(123)  # the exporter's example inputs must not leak into the graph
    export_drafter(
        drafter,
        target.model.get_input_embeddings(),
        target.model.get_output_embeddings(),
        tmp_path / "drafter.onnx",
        info["dtype"],
        Bounds(**info["bounds"]),
    )
    first = (build / "export" / "native" / "drafter.onnx").read_bytes()
    assert hashlib.sha256((tmp_path / "drafter.onnx").read_bytes()).hexdigest() == hashlib.sha256(first).hexdigest()


# ----------------------------------------------------------------------------- engines and manifest


def test_engines_are_real_tensorrt_rtx_plans_recorded_in_the_manifest(build, manifest):
    assert manifest["complete"] is True
    assert {n for n, s in manifest["stages"].items() if s["status"] == "complete"} == {
        "checkpoints",
        "quantize",
        "export",
        "validate",
        "engines",
        "repository",
    }
    engines = manifest["stages"]["engines"]
    assert engines["summary"]["flavour"] == "tensorrt-rtx" and engines["summary"]["compute_capability"] == "12.0"
    assert manifest["tools"]["tensorrt_flavour"] == "tensorrt-rtx"
    assert manifest["tools"]["tensorrt_rtx"] == engines["summary"]["tensorrt_version"]
    for tool in ("torch", "transformers", "modelopt", "onnx", "triton"):
        assert manifest["tools"][tool], tool
    assert manifest["tools"]["ptx_isa"]["sm_120"]["ptx_isa"] and manifest["tools"]["ptx_isa"]["sm_90a"]["min_driver"]
    for graph in ("target", "drafter"):
        engine = build / "engines" / "native" / f"{graph}.engine"
        graph_file = build / "export" / "native" / f"{graph}.onnx"
        recorded = engines["files"][f"native/{graph}.engine"]
        assert recorded["sha256"] == hashlib.sha256(engine.read_bytes()).hexdigest()
        assert engine.stat().st_size > 0.5 * graph_file.stat().st_size  # the weights are in the engine
        profiles = engines["summary"]["engines"]["native"][graph]["profiles"]
        assert profiles[0]["batch"][2] == manifest["recipe"]["limits"]["max_batch_size"]  # bounded by the recipe
    target_profiles = engines["summary"]["engines"]["native"]["target"]["profiles"]
    block = manifest["stages"]["export"]["summary"]["block_size"]
    assert target_profiles[0]["tokens"][2] == block  # verify steps
    assert target_profiles[1]["tokens"][2] == manifest["recipe"]["limits"]["max_input_len"]  # prefill
    assert manifest["stages"]["validate"]["summary"]["status"] == "passed"
    assert set(manifest["inputs"]) == {"target", "drafter"}
    assert manifest["engines"] == "engines"  # what `dflash-trt repo --build` serves


def test_rebuild_skips_every_unchanged_stage(build, pair, manifest):
    gpu = ["--gpu", "rtx-pro-6000"] if HAVE_DEMO else []
    result = invoke("build", *pair["args"], *gpu, "--out", str(build))
    assert result.exit_code == 0, result.output
    for stage in ("checkpoints", "quantize", "export", "validate", "engines", "repository"):
        assert f"= {stage}: unchanged" in result.output
    again = json.loads((build / "manifest.json").read_text())
    assert {n: s["outputs_sha256"] for n, s in again["stages"].items()} == {n: s["outputs_sha256"] for n, s in manifest["stages"].items()}


def test_corrupted_drafter_fails_with_one_line_and_keeps_the_build(build, pair, tmp_path):
    broken = tmp_path / "drafter"
    shutil.copytree(pair["drafter"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated download
    before = {p: p.read_bytes() for p in build.glob("*/stage.json")}
    args = [*pair["args"], "--drafter", str(broken)] + (["--gpu", "rtx-pro-6000"] if HAVE_DEMO else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-c", "from trtllm_dflash.cli.app import main; main()", "build", *args, "--out", str(build)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "model.safetensors" in errors[0] and "not a valid safetensors" in errors[0]
    assert {p: p.read_bytes() for p in build.glob("*/stage.json")} == before  # every finished stage intact
    assert not list(build.glob(".*.tmp-*"))


# ----------------------------------------------------------------------------- GPU-only parts


def test_stage_blocked_without_a_gpu_keeps_the_stages_that_ran(pair, tmp_path):
    """NVFP4 for a B200: ModelOpt's NVFP4 calibration needs CUDA, so on CPU the build stops there."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: NVFP4 calibration runs here")
    if HAVE_DEMO:
        args = ["--model", str(DEMO_DIR / "target"), "--drafter", str(DEMO_DIR / "drafter")]
    else:
        args = pair["local"]
    out = tmp_path / "out"
    result = invoke("build", *args, "--gpu", "b200", "--quant", "nvfp4", "--out", str(out))
    assert result.exit_code == 3, result.output
    assert "needs a CUDA GPU" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stages"]["checkpoints"]["status"] == "complete"
    assert manifest["stages"]["quantize"]["status"] == "blocked" and "CUDA" in manifest["stages"]["quantize"]["missing"]
    assert manifest["stages"]["export"] == {"status": "not run", "needs": "quantize"}
    assert not (out / "quantize").exists() and not (out / "engines").exists()


def test_tensorrt_runtime_matches_torch_on_a_gpu(build, reference):
    """The engines' greedy tokens equal the torch runtime's (the losslessness gate of docs/build.md)."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (RTX PRO 6000 / SM 12.x for these TensorRT-RTX engines); none here")
    pytest.importorskip("tensorrt_rtx_bindings", reason="needs TensorRT-RTX: pip install 'trtllm-dflash[rtx]'")
    major, _ = torch.cuda.get_device_capability()
    if major != 12:
        pytest.skip("the CI engines are built for SM 12.0; this GPU is another architecture")
    from trtllm_dflash.runtime.trt_runtime import TrtRuntime

    engine_tokens = [r.token_ids for r in _decode(TrtRuntime(build / "engines"), PROMPTS)]
    torch_tokens = [r.token_ids for r in _decode(reference, PROMPTS)]
    assert engine_tokens == torch_tokens


def test_append_rows_matches_the_reference_append():
    """The TensorRT runtime writes draft-cache rows without a host sync; same result as the reference."""
    from trtllm_dflash.ops.reference_attention import append_context
    from trtllm_dflash.runtime.trt_runtime import append_rows

    generator = torch.Generator().manual_seed(0)
    cache = torch.randn(3, 12, 2, 4, generator=generator)
    new = torch.randn(3, 5, 2, 4, generator=generator)
    lengths, counts = torch.tensor([0, 4, 7]), torch.tensor([5, 1, 3])
    expected_k, expected_v = cache.clone(), cache.clone()
    append_context(expected_k, expected_v, lengths, new, new, counts)
    got = cache.clone()
    append_rows(got, lengths, new, counts)
    assert torch.equal(got, expected_k)


def test_trtllm_recipe_writes_and_checks_the_tensorrt_llm_configuration(pair, tmp_path):
    """backend: trtllm builds no engines: checked LLM-API options and the tensorrt_llm repository."""
    import yaml

    recipe = tmp_path / "trtllm.yaml"
    recipe.write_text(
        f"model: {{name: {pair['target'].resolve()}, checkpoint: {pair['target'].resolve()}}}\n"
        f"drafter: {{checkpoint: {pair['drafter'].resolve()}, block_size: 4}}\n"
        "gpu: b300\nbackend: trtllm\nquantization: {weights: bf16, kv_cache: fp8}\n"
        "limits: {max_batch_size: 16, max_input_len: 256, max_seq_len: 512}\ntriton: {max_batch_size: 16}\n"
        "trtllm: {moe_backend: TRTLLM}\n"
    )
    out = tmp_path / "out"
    result = invoke("build", "--recipe", str(recipe), "--out", str(out))
    assert result.exit_code == 0, (result.output, result.exception)
    options = yaml.safe_load((out / "trtllm" / "llm_api.yaml").read_text())
    from trtllm_dflash.config import DrafterConfig

    drafter = DrafterConfig.from_dir(pair["drafter"])
    spec = options["speculative_config"]
    assert spec["decoding_type"] == "DFlash" and spec["max_draft_len"] == 3
    assert spec["mask_token_id"] == drafter.mask_token_id and spec["target_layer_ids"] == list(drafter.target_layer_ids)
    assert options["kv_cache_config"]["dtype"] == "fp8" and options["moe_config"] == {"backend": "TRTLLM"}
    assert (out / "repository" / "triton" / "tensorrt_llm" / "1" / "model.yaml").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["stages"]) == {"checkpoints", "quantize", "trtllm", "repository"} and manifest["complete"]
