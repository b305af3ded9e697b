"""Ahead-of-time builds for the deployment GPUs (no GPU needed), the TensorRT launch plans, and the
`dflash-trt plugins build` command."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

pytest.importorskip("triton")

from trtllm_dflash.builder.kernel_space import recipe_kernel_space  # noqa: E402
from trtllm_dflash.errors import DFlashError, MissingDependencyError  # noqa: E402
from trtllm_dflash.plugins import aot, onnx_nodes, tensorrt_plugins  # noqa: E402

EXPECTED_PTX = {"sm_90a": ("8.0", "sm_90a"), "sm_100a": ("8.7", "sm_100a"), "sm_103a": ("8.8", "sm_103a"), "sm_120": ("8.7", "sm_120a")}
NODES = {spec.op_type: spec for spec in onnx_nodes.NODES}
V1_NODES = {spec.op_type for spec in onnx_nodes.V1_NODES}  # what a (V1) drafter and its target launch


def entry_params(ptx: str) -> int:
    header = ptx.split(".entry", 1)[1].split(")", 1)[0]
    return len(re.findall(r"\.param ", header))


def test_unknown_arch_is_a_one_line_error(tmp_path, run_main):
    out = tmp_path / "kernels"
    code, _, err = run_main("plugins", "build", "--arch", "sm_90a,sm_75", "--out", str(out))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown GPU architecture 'sm_75'; use one of sm_90a, sm_100a")
    assert not out.exists()


def _build(run_main, out, cache, *extra):
    code, _, err = run_main("plugins", "build", "--out", str(out), "--cache-dir", str(cache), *extra)
    assert code == 0, err
    summary = re.search(r"built (\d+) kernels .* in ([\d.]+) s: (\d+) compiled \((\d+) jobs\), (\d+) from the cache", " ".join(err.split()))
    assert summary, err
    kernels, seconds, compiled, jobs, cached = summary.groups()
    return int(kernels), float(seconds), int(compiled), int(jobs), int(cached)


def test_a_rebuild_with_nothing_changed_compiles_nothing(tmp_path, run_main):
    """The second build takes every kernel from the cache (seconds), gives the same files, and a
    changed key (another arch) compiles only what is new."""
    args = ("--recipe", "demo/rtx-pro-6000")
    kernels, _, compiled, jobs, cached = _build(run_main, tmp_path / "a", tmp_path / "cache", *args)
    assert kernels == compiled > 0 and cached == 0 and jobs >= 1
    kernels2, seconds, compiled, _, cached = _build(run_main, tmp_path / "b", tmp_path / "cache", *args)
    assert (kernels2, compiled, cached) == (kernels, 0, kernels)  # every kernel from the cache (no clock: see DEVELOPERS.md)
    first, second = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("a", "b"))
    assert first == second
    for entry in second["kernels"]:
        assert (tmp_path / "a" / entry["cubin"]).read_bytes() == (tmp_path / "b" / entry["cubin"]).read_bytes()
    _, _, compiled, _, cached = _build(run_main, tmp_path / "c", tmp_path / "cache", *args, "--arch", "sm_120,sm_90a")
    assert (compiled, cached) == (kernels, kernels)
    assert not list((tmp_path / "cache").glob(".tmp-*"))


def test_recipe_picks_only_its_drafter_variants():
    from trtllm_dflash.recipes.loader import resolve_recipe

    space = recipe_kernel_space(resolve_recipe("qwen3-8b/h100"))
    assert space.arch == "sm_90a" and space.head_dims == (128,) and space.groups == (4,)  # 32 q heads / 8 kv heads
    assert 16 in space.blocks and space.dtypes == ("bfloat16",)
    variants = aot.kernel_variants(**space.options())
    assert {v.node for v in variants} == V1_NODES
    assert len(variants) < len(aot.kernel_variants()) // 4
    assert {dict(v.constexprs).get("HEAD_DIM", 128) for v in variants} == {128}
    # the target's layers: 32 q heads / 8 KV heads, head dim 128, bf16, no sinks; the 64-row tile of a 16-token block
    target = [dict(v.constexprs) for v in variants if v.node == "DFlashTargetAttention"]
    assert {(c["HEAD_DIM_K"], c["HEAD_DIM_V"], c["HAS_SINKS"]) for c in target} == {(128, 128, False)}
    assert 64 in {c["BLOCK_M"] for c in target}


def test_recipe_target_variants_follow_the_targets_layers():
    from trtllm_dflash.recipes.loader import resolve_recipe

    gpt_oss = recipe_kernel_space(resolve_recipe("gpt-oss-20b/h100"))  # 64 q heads / 8 KV, head dim 64, sinks
    assert (gpt_oss.target_head_dims, gpt_oss.target_groups, gpt_oss.target_sinks) == (((64, 64),), (8,), (True,))
    variants = [v for v in aot.kernel_variants(**gpt_oss.options()) if v.node == "DFlashTargetAttention"]
    assert variants and all(dict(v.constexprs)["HAS_SINKS"] for v in variants)
    gemma = recipe_kernel_space(resolve_recipe("gemma-4-31b-it/b300"))  # global layers' head dim 512: native path
    assert gemma.target_head_dims == ((256, 256),) and gemma.target_groups == (2,)
    kimi = recipe_kernel_space(resolve_recipe("kimi-k2.5/b300"))  # MLA: not this kernel
    assert kimi.target_head_dims == () and not any(v.node == "DFlashTargetAttention" for v in aot.kernel_variants(**kimi.options()))


def test_target_head_dims_on_the_command_line(tmp_path, run_main):
    code, _, err = run_main("plugins", "build", "--arch", "sm_90a", "--target-head-dim", "192x128", "--out", str(tmp_path / "k"))
    assert code == 2 and "--target-head-dim '192x128' is not a supported head dim" in err
    code, _, err = run_main("plugins", "build", "--recipe", "qwen3-8b/h100", "--attention-sinks", "--out", str(tmp_path / "k"))
    assert code == 2 and "--attention-sinks cannot be combined" in err
    variants = aot.kernel_variants(
        head_dims=(64,),
        dtypes=("bfloat16",),
        blocks=(16,),
        groups=(1,),
        target_head_dims=((128, 64),),
        target_groups=(8,),
        target_sinks=(False, True),
    )
    target = {
        (c["HEAD_DIM_K"], c["HEAD_DIM_V"], c["BLOCK_M"], c["HAS_SINKS"])
        for v in variants
        if v.node == "DFlashTargetAttention"
        for c in [dict(v.constexprs)]
    }
    assert target == {(128, 64, 128, False), (128, 64, 128, True)}


def test_cache_key_changes_with_what_makes_the_kernel():
    variant = aot.verify_variants("float32")[0]
    key = aot.cache_key(variant, aot.ARCHES["sm_90a"], "3.9.0")
    assert key == aot.cache_key(variant, aot.ARCHES["sm_90a"], "3.9.0")
    assert key != aot.cache_key(variant, aot.ARCHES["sm_100a"], "3.9.0")
    assert key != aot.cache_key(variant, aot.ARCHES["sm_90a"], "3.9.1")
    assert key != aot.cache_key(aot.verify_variants("bfloat16")[0], aot.ARCHES["sm_90a"], "3.9.0")


def test_recipe_and_explicit_variant_flags_do_not_mix(tmp_path, run_main):
    code, _, err = run_main("plugins", "build", "--recipe", "qwen3-8b/h100", "--head-dim", "64", "--out", str(tmp_path / "k"))
    assert code == 2 and "--head-dim cannot be combined" in err
    code, _, err = run_main("plugins", "build", "--out", str(tmp_path / "k"))
    assert code == 2 and "no architecture given" in err


def test_arch_names_and_output_directory_rules(tmp_path):
    assert [a.name for a in aot.parse_arches("sm_120a, SM_90A,sm_90a")] == ["sm_120", "sm_90a"]
    with pytest.raises(DFlashError, match="no architecture"):
        aot.parse_arches(" , ")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DFlashError, match="not empty"):
        aot.check_output_dir(tmp_path)


def test_cli_builds_ptx_and_cubin_for_every_listed_arch(tmp_path, run_main):
    out = tmp_path / "kernels"
    code, _, err = run_main(
        "plugins",
        "build",
        "--arch",
        "sm_90a,sm_100a,sm_103a,sm_120",
        "--out",
        str(out),
        "--head-dim",
        "64",
        "--dtype",
        "float16",
        "--block-size",
        "2",
        "--gqa-group",
        "1",
        "--logits-dtype",
        "float32",
        "-j",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert code == 0, err
    assert "sm_103a  PTX ISA 8.8  driver >= 575.51.03" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["min_tensorrt"] == aot.MIN_TENSORRT and manifest["triton_version"]
    for arch, (isa, target) in EXPECTED_PTX.items():
        assert manifest["arches"][arch]["ptx_isa"] == isa
        entries = [e for e in manifest["kernels"] if e["arch"] == arch]
        assert {e["node"] for e in entries} == V1_NODES  # every kernel, for every arch
        for entry in entries:
            ptx = (out / entry["ptx"]).read_text()
            assert re.search(rf"^\.version {re.escape(isa)}$", ptx, re.MULTILINE)  # a CUDA 13.0 (R580) driver takes <= 9.0
            assert re.search(rf"^\.target {target}$", ptx, re.MULTILINE)
            assert entry["ptx_isa"] == isa and entry["ptx_target"] == target and entry["min_driver"]
            assert (out / entry["cubin"]).read_bytes()[:4] == b"\x7fELF"
            assert entry["num_warps"] * 32 == entry["threads_per_block"] and entry["shared_memory"] >= 0
            # TensorRT passes the node's inputs, the int32 scalars, then the node's outputs: nothing else
            spec = NODES[entry["node"]]
            scalars = sum(1 for p in entry["params"] if p.endswith(":i32"))
            assert entry_params(ptx) == len(entry["params"]) == len(spec.inputs) + scalars + len(spec.outputs)
    assert not list(tmp_path.glob(".*partial"))


QWEN3_8B = dict(batch=2, block=16, heads=32, kv_heads=8, head_dim=128, capacity=4096, new=5, vocab=151936)


def shapes_for(node: str, s=QWEN3_8B, splits=4):
    b, block, rows = s["batch"], s["block"], s["block"] * s["heads"] // s["kv_heads"]
    attention = dict(
        q=(b, block, s["heads"], s["head_dim"]),
        k_ctx_new=(b, s["new"], s["kv_heads"], s["head_dim"]),
        k_cache=(b, s["capacity"], s["kv_heads"], s["head_dim"]),
    )
    return {
        "DFlashBlockAttention": attention,
        "DFlashBlockAttentionSplit": attention,
        "DFlashAttentionMerge": dict(partial_out=(b, s["kv_heads"], splits, rows, s["head_dim"]), like=attention["q"]),
        "DFlashVerifyPartials": dict(target_logits=(b, block, s["vocab"])),
        "DFlashVerifyPositions": dict(target_logits=(b, block, s["vocab"]), chunk_max=(b, block, 38)),
        "DFlashVerifyCommit": dict(block_tokens=(b, block), stop_ids=(b, 3)),
        "DFlashTargetAttention": dict(
            q=attention["q"],
            k_new=(b, block, s["kv_heads"], s["head_dim"]),
            v_new=(b, block, s["kv_heads"], s["head_dim"]),
            k_cache=attention["k_cache"],
            v_cache=attention["k_cache"],
            starts=(b,),
            sinks=(s["heads"],),
        ),
        # a V2 drafter of hidden 4096 (256 groups of 16), 2 conv taps, a 262,144 vocabulary, rank 256
        "DFlash2GroupedConv": dict(x=(b, block, 4096), delta=(b, block, 2, 256), base=(2, 4096), residual=(b, block, 4096)),
        "DFlash2TopKPartials": dict(unary=(b, block - 1, 262144)),
        "DFlash2TopKMerge": dict(partial_values=(b, block - 1, 64, 16)),
        "DFlash2CandidateSelect": dict(cand=(b, block - 1, 16), z=(b, block - 1, 256)),
    }[node if node != "DFlashTargetAttentionSplit" else "DFlashTargetAttention"]


@pytest.mark.parametrize("node", list(NODES))
def test_tensorrt_launch_plans_match_the_kernel_abi(node):
    dtypes = dict(
        q="bfloat16",
        k_cache="bfloat16",
        like="bfloat16",
        target_logits="float32",
        k_new="bfloat16",
        v_new="bfloat16",
        v_cache="bfloat16",
        starts="int64",
        sinks="float32",
        x="bfloat16",
        delta="bfloat16",
        base="bfloat16",
        residual="float32",
        unary="bfloat16",
        z="bfloat16",
    )
    attributes = dict(scale=128**-0.5, window=0, kv_splits=4, has_draft_probs=1, has_residual=1, top_k=16)
    plan = tensorrt_plugins.plan_launch(node, shapes_for(node), dtypes, attributes)
    spec = NODES[node]
    assert plan.variant.node == node
    assert len(plan.variant.signature) == len(spec.inputs) + len(plan.scalars) + len(spec.outputs)
    expected_grid = {
        "DFlashBlockAttention": (1, 8, 2),  # 16 x 4 query rows in one 64-row tile
        "DFlashBlockAttentionSplit": (4, 8, 2),
        "DFlashAttentionMerge": (1, 8, 2),
        "DFlashVerifyPartials": (38, 16, 2),  # 151936 logits in chunks of 4096
        "DFlashVerifyPositions": (16, 2, 1),
        "DFlashVerifyCommit": (2, 1, 1),
        "DFlashTargetAttention": (1, 8, 2),  # 16 x 4 query rows in one 64-row tile per KV head and row
        "DFlashTargetAttentionSplit": (4, 8, 2),
        "DFlash2GroupedConv": (32, 2, 1),  # 4096 channels in tiles of 128, one program row per block
        "DFlash2TopKPartials": (64, 30, 1),  # 262144 logits in chunks of 4096, 2 x 15 positions
        "DFlash2TopKMerge": (30, 1, 1),
        "DFlash2CandidateSelect": (2, 1, 1),
    }[node]
    assert tuple(plan.grid) == expected_grid
    if node.startswith("DFlashBlockAttention"):
        block, num_new, capacity, kv_heads, group, window, causal, scale_bits, splits = plan.scalars
        assert (block, num_new, capacity, kv_heads, group, window, causal) == (16, 5, 4096, 8, 4, 0, 0)
        assert struct.unpack("<f", struct.pack("<i", scale_bits))[0] == pytest.approx(128**-0.5)
        assert splits == (4 if node.endswith("Split") else 1)
    if node.startswith("DFlashTargetAttention"):
        tokens, capacity, kv_heads, group, window, scale_bits, *splits = plan.scalars
        assert splits == ([4] if node.endswith("Split") else [])
        assert (tokens, capacity, kv_heads, group, window) == (16, 4096, 8, 4, 0)
        assert struct.unpack("<f", struct.pack("<i", scale_bits))[0] == pytest.approx(128**-0.5)


def test_verification_plans_follow_the_vocabulary():
    """Chunks from the vocabulary; aligned-row variants only for a vocabulary that is a multiple of 16."""
    for vocab, chunks, divisible in ((151936, 38, True), (32001, 8, False)):
        partials = tensorrt_plugins.plan_launch(
            "DFlashVerifyPartials", dict(target_logits=(4, 16, vocab)), dict(target_logits="bfloat16"), {}
        )
        assert tuple(partials.grid) == (chunks, 16, 4) and partials.scalars == (16, vocab)
        assert dict(partials.variant.constexprs)["VOCAB_DIVISIBLE"] is divisible
        shapes = dict(target_logits=(4, 16, vocab), chunk_max=(4, 16, chunks))
        positions = tensorrt_plugins.plan_launch("DFlashVerifyPositions", shapes, dict(target_logits="bfloat16"), dict(has_draft_probs=0))
        assert tuple(positions.grid) == (16, 4, 1) and positions.scalars == (16, vocab, 0, chunks)
        assert dict(positions.variant.constexprs)["VOCAB_DIVISIBLE"] is divisible
        assert partials.variant in aot.kernel_variants() and positions.variant in aot.kernel_variants()


def test_target_attention_plans_prefill_sinks_and_value_dims():
    shapes = shapes_for("DFlashTargetAttention", {**QWEN3_8B, "block": 40})  # a 40-token prefill
    shapes["v_new"], shapes["v_cache"] = (2, 40, 8, 64), (2, 4096, 8, 64)
    dtypes = dict(q="float16", k_new="float16", v_new="float16", k_cache="float16", v_cache="float16", starts="int64", sinks="float32")
    plan = tensorrt_plugins.plan_launch("DFlashTargetAttention", shapes, dtypes, dict(scale=0.1, window=128, has_sinks=1))
    constexprs = dict(plan.variant.constexprs)
    assert (constexprs["HEAD_DIM_K"], constexprs["HEAD_DIM_V"], constexprs["BLOCK_M"], constexprs["HAS_SINKS"]) == (128, 64, 64, True)
    assert tuple(plan.grid) == (3, 8, 2)  # 160 packed rows in the 64-row tile of the largest block
    assert plan.scalars[:5] == (40, 4096, 8, 4, 128)
    with pytest.raises(DFlashError, match="starts is int32, expected int64"):
        tensorrt_plugins.plan_launch("DFlashTargetAttention", shapes, {**dtypes, "starts": "int32"}, {})


def test_registering_with_tensorrt_needs_tensorrt():
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match="pip install 'trtllm-dflash\\[trt\\]'"):
            tensorrt_plugins.register_plugins("sm_90a")
    else:
        pytest.skip("TensorRT is installed here; the GPU tests cover the registration")


def test_a_prebuilt_directory_without_the_kernel_is_a_clear_error(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"kernels": []}))
    variant = aot.commit_variant()
    with pytest.raises(DFlashError, match="rebuild it with `dflash-trt plugins build`"):
        tensorrt_plugins.compiled_kernel(variant, aot.ARCHES["sm_90a"], prebuilt=Path(tmp_path))
