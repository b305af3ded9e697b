"""The plugin variant of the target graph: in-place cache attention and verification inside.

Evaluated on CPU with the plugin nodes' evaluators (onnx.reference), driven by the same decoding
loop as the torch runtime, it must give the torch runtime's tokens: greedy and seeded sampling,
ragged batches of 4 prompts, decodes that cross many rollbacks and (gpt-oss) sliding windows with
attention sinks. The graph itself must hold no cache copy: each cache input is read only by the
target-attention nodes, and no logits leave it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtllm_dflash.builder.export import Bounds, UnsupportedTargetError, export_pair, export_verifying_target
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams

pytest.importorskip("onnxscript", reason="needs the export extra: pip install 'trtllm-dflash[export]'")

BOUNDS = Bounds(max_batch=4, max_input_len=64, max_seq_len=128, block_size=8)
FAMILY_PARAMS = ["gpt_oss", pytest.param("gemma3", marks=pytest.mark.slow), pytest.param("qwen3_moe", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name ("demo" or a family) -> its checkpoints and plugin export directory, exported once."""
    from trtllm_dflash import demo
    from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

    done: dict[str, dict[str, Path]] = {}

    def get(name: str) -> dict[str, Path]:
        if name not in done:
            root = tmp_path_factory.mktemp(name)
            if name == "demo":
                target_dir, drafter_dir = demo.target_dir(), demo.drafter_dir()
            else:
                target_dir = make_tiny_target(root / "target", name, seed=7)
                drafter_dir = make_tiny_drafter(root / "drafter", target_dir, seed=1, block_size=4, target_layer_ids=(1, 2))
            target = load_target(target_dir, dtype=torch.float32)
            export_pair(target.model, load_drafter(drafter_dir, target), root / "export", "fp32", BOUNDS, ("plugin",))
            done[name] = {"target": target_dir, "drafter": drafter_dir, "export": root / "export"}
        return done[name]

    return get


def runtimes(paths: dict[str, Path]):
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    target = load_target(paths["target"], dtype=torch.float32)
    return TorchRuntime(target.model, load_drafter(paths["drafter"], target)), OnnxRuntime(paths["export"], "plugin")


def decode(runtime, prompts: list[list[int]], params: list[SamplingParams], async_scheduling: bool = False):
    decoder = Decoder(runtime, max_batch=len(prompts), max_context=max(map(len, prompts)) + 64, async_scheduling=async_scheduling)
    results = decoder.generate([Request(prompt, p) for prompt, p in zip(prompts, params)])
    return [r.token_ids for r in results], [r.acceptance_lengths for r in results]


def demo_prompts(count: int = 4) -> list[list[int]]:
    from transformers import AutoTokenizer

    from trtllm_dflash import demo

    tokenizer = AutoTokenizer.from_pretrained(demo.target_dir())
    lines = (demo.DEMO_DIR / "heldout_prompts.jsonl").read_text().splitlines()
    prompts = [tokenizer(json.loads(line)["prompt"])["input_ids"] for line in lines[:count]]
    return [p[: 12 + 9 * i] for i, p in enumerate(prompts)]  # ragged: 12, 21, 30, 39 tokens


def test_demo_pair_greedy_through_the_plugin_target_graph_equals_the_torch_runtime(exported):
    reference, graphs = runtimes(exported("demo"))
    assert graphs.target_verifies
    prompts = demo_prompts()
    params = [SamplingParams(max_new_tokens=40)] * 4
    expected, expected_acceptance = decode(reference, prompts, params)
    got, acceptance = decode(graphs, prompts, params)
    assert got == expected and acceptance == expected_acceptance
    steps = [n for row in acceptance for n in row]
    assert sum(steps) / len(steps) > 2  # long accepted runs: the verify node committed real drafts


def test_demo_pair_seeded_sampling_through_the_plugin_target_graph_equals_the_torch_runtime(exported):
    reference, graphs = runtimes(exported("demo"))
    prompts = demo_prompts()
    params = [
        SamplingParams(max_new_tokens=32, temperature=0.8, seed=11),
        SamplingParams(max_new_tokens=32),  # a greedy row beside sampled ones
        SamplingParams(max_new_tokens=32, temperature=1.0, top_k=20, seed=12),
        SamplingParams(max_new_tokens=32, temperature=0.7, top_p=0.9, seed=13),
    ]
    expected = decode(reference, prompts, params)
    assert decode(graphs, prompts, params) == expected
    # the host a step behind, on a runtime that verifies inside its graph and reuses its output buffers
    assert decode(graphs, prompts, params, async_scheduling=True) == expected


def test_plugin_target_graph_validates_and_holds_no_cache_copy(exported):
    import onnx

    from trtllm_dflash.builder.validate import validate_graphs

    paths = exported("demo")
    reference, graphs = runtimes(paths)
    report = validate_graphs(graphs, reference, BOUNDS.block_size)
    names = {c["name"] for c in report["comparisons"]}
    assert {"prefill.bonus", "verify.accepted", "verify.bonus", "verify.features", "target_cache.key[0]"} <= names
    assert "verify.logits" not in names

    info = json.loads((paths["export"] / "graphs.json").read_text())["variants"]["plugin"]["target"]
    assert info["verifies"] and info["dir"] == "plugin"
    model = onnx.load(str(paths["export"] / "plugin" / "target.onnx"))
    outputs = [o.name for o in model.graph.output]
    assert outputs[:2] == ["result", "features"] and "logits" not in outputs
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    caches = [i.name for i in model.graph.input if i.name.startswith("cache_")]
    assert len(caches) == 16  # 8 layers x (keys, values)
    for name in caches:  # read by the attention node only (Shape reads no data): no Concat, Slice or copy
        assert readers[name] - {"Shape"} == {"DFlashTargetAttention"}, (name, readers[name])
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("DFlashTargetAttention") == 8 and ops.count("DFlashVerifyPositions") == 1


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_family_plugin_target_graph_decodes_like_the_torch_runtime(exported, family):
    """gpt-oss: attention sinks, sliding layers (window 8, crossed many times), MoE experts."""
    reference, graphs = runtimes(exported(family))
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, reference.vocab_size, (n,), generator=generator).tolist() for n in (3, 11, 6, 17)]
    greedy = [SamplingParams(max_new_tokens=30)] * 4
    assert decode(graphs, prompts, greedy) == decode(reference, prompts, greedy)
    sampled = [SamplingParams(max_new_tokens=24, temperature=0.9, seed=s) for s in range(4)]
    assert decode(graphs, prompts, sampled) == decode(reference, prompts, sampled)


def test_targets_the_op_cannot_run_are_refused_with_the_reason(tmp_path):
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.testing.tiny import tiny_target_config

    model = AutoModelForCausalLM.from_config(tiny_target_config("gemma4"))
    with pytest.raises(UnsupportedTargetError, match="reuse another layer's K/V") as error:
        export_verifying_target(model, [1, 2], tmp_path / "target.onnx", "fp32", BOUNDS)
    assert "\n" not in str(error.value) and str(error.value).endswith("use the native variant")
    assert not (tmp_path / "target.onnx").exists()
