"""DFlash V2's kernels (Triton's CPU interpreter) against `reference_dflash2`, their ONNX nodes
evaluated by onnx.reference, their export through the custom translation table, and their
TensorRT launch plans.

The selector must agree exactly: the same candidates (ties to the smaller id), the same greedy
and sampled tokens (the counter RNG bit for bit); its probabilities to float32 rounding.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

pytest.importorskip("triton")

from trtllm_dflash import ops
from trtllm_dflash.errors import DFlashError  # noqa: E402
from trtllm_dflash.ops import reference_dflash2
from trtllm_dflash.ops.kernels import dflash2_launch  # noqa: E402
from trtllm_dflash.plugins import dflash2_nodes, kernel_audit, onnx_nodes, tensorrt_plugins  # noqa: E402

CHUNK, TILE = 256, 128  # small selection chunks, so tiny vocabularies span several


def conv_inputs(seed=0, lead=(3,), steps=5, hidden=256, groups=16, kernel_size=2, dtype=torch.float32, residual=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, steps, hidden, generator=g).to(dtype)
    delta = torch.randn(*lead, steps, kernel_size, groups, generator=g).to(dtype)
    base = torch.randn(kernel_size, hidden, generator=g).to(dtype)
    res = torch.randn(*lead, steps, hidden, generator=g) if residual else None
    return x, delta, base, res


def select_inputs(seed=0, batch=3, steps=6, vocab=700, rank=32, temperature=(0.0, 1.0, 0.7)):
    g = torch.Generator().manual_seed(seed)
    unary = torch.randn(batch, steps, vocab, generator=g) * 2
    z = torch.randn(batch, steps, rank, generator=g)
    predecessor = torch.randn(vocab, rank, generator=g) * 0.4
    successor = torch.randn(vocab, rank, generator=g) * 0.4
    anchor = torch.randint(0, vocab, (batch,), generator=g)
    seed_ = torch.tensor([11, -5, 2**40])[:batch]
    positions = torch.arange(batch * steps).view(batch, steps) * 3 + 17
    return unary, z, anchor, predecessor, successor, torch.tensor(temperature[:batch]), seed_, positions


# ----------------------------------------------------------------------------- grouped conv


@pytest.mark.parametrize("steps", [2, 7, 16])
@pytest.mark.parametrize("kernel_size", [2, 3])
@pytest.mark.parametrize("residual", [False, True])
def test_conv_float32_matches_the_reference(steps, kernel_size, residual):
    x, delta, base, res = conv_inputs(steps=steps, kernel_size=kernel_size, residual=residual)
    got = dflash2_launch.grouped_dynamic_conv(x, delta, base, res)
    want = reference_dflash2.grouped_dynamic_conv(x, delta, base, res)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden, groups", [(256, 16), (48, 3)])  # rows on the channel tile, and not
def test_conv_bfloat16_within_rounding(residual, hidden, groups):
    x, delta, base, res = conv_inputs(seed=1, lead=(2, 2), steps=9, hidden=hidden, groups=groups, dtype=torch.bfloat16, residual=residual)
    got = dflash2_launch.grouped_dynamic_conv(x, delta, base, res)
    want = reference_dflash2.grouped_dynamic_conv(x, delta, base, res)
    assert got.dtype == want.dtype == (torch.float32 if residual else torch.bfloat16)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=8e-3)  # one bf16 rounding


def test_conv_taps_stay_inside_each_block():
    """Row 0 of a block sees only its own x (no tap reads the previous block's last rows)."""
    x, delta, base, _ = conv_inputs(seed=2, lead=(2,), steps=4, kernel_size=3)
    got = dflash2_launch.grouped_dynamic_conv(x, delta, base)
    coefficient = base[0] + delta[1, 0, 0].repeat_interleave(16)
    torch.testing.assert_close(got[1, 0], coefficient * x[1, 0], atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------- selector


def kernel_select(*args, top_k=16):
    return dflash2_launch.candidate_select(*args, top_k, chunk_v=CHUNK, block_v=TILE)


@pytest.mark.parametrize("vocab", [700, 512])  # not a multiple of the chunk (nor of 16), and a multiple
def test_selector_matches_the_reference(vocab):
    args = select_inputs(steps=4, vocab=vocab)
    tokens, cand, probs = kernel_select(*args)
    want_tokens, want_cand, want_probs = reference_dflash2.candidate_select(*args, 16)
    assert torch.equal(cand, want_cand)
    assert torch.equal(tokens, want_tokens)  # greedy row 0, sampled rows 1 and 2
    torch.testing.assert_close(probs, want_probs, atol=1e-6, rtol=1e-5)
    assert torch.equal(probs[0], (cand[0] == tokens[0, :, None]).float())  # greedy: one-hot q
    torch.testing.assert_close(probs[1:].sum(-1), torch.ones(2, probs.shape[1]))


def test_sampled_walks_match_over_many_seeds():
    unary, *rest = select_inputs(seed=3, batch=3, steps=6, vocab=300, temperature=(1.0, 1.5, 0.6))
    cand = reference_dflash2.candidates(unary, 16)
    args = [cand, unary.gather(-1, cand), *rest]
    for seed in range(6):
        args[7] = torch.tensor([seed, seed * 977 + 1, -seed])
        tokens, probs = dflash2_launch.candidate_walk(*args)
        want_tokens, want_probs = reference_dflash2.candidate_walk(*args)
        assert torch.equal(tokens, want_tokens), seed
        torch.testing.assert_close(probs, want_probs, atol=1e-6, rtol=1e-5)


def test_ties_go_to_the_smaller_id():
    """Equal logits across chunks and at the k-th place: the smaller ids are the candidates, first;
    equal scores (zero codebooks) pick the smallest id."""
    unary, z, anchor, predecessor, successor, temperature, seed, positions = select_inputs(seed=4, batch=2, steps=3, vocab=600)
    tied = [590, 3, 300, 257, 40]  # in three chunks
    unary[:, :, tied] = 50.0
    unary[:, :, 100:120] = 40.0  # 20 equal logits for the last 11 candidate places
    predecessor, successor = predecessor * 0, successor * 0
    args = (unary, z, anchor, predecessor, successor, torch.zeros(2), seed, positions)
    tokens, cand, probs = kernel_select(*args)
    assert cand[0, 0].tolist() == sorted(tied) + list(range(100, 111))
    assert torch.equal(cand, reference_dflash2.candidate_select(*args, 16)[1])
    assert (tokens == 3).all()
    assert torch.equal(tokens, reference_dflash2.candidate_select(*args, 16)[0])


def test_topk_stages_match_their_references():
    unary = select_inputs(seed=5, vocab=2 * CHUNK + 5)[0]  # the last chunk has 5 logits: 11 empty slots
    values, ids = dflash2_launch.topk_partials(unary, 16, CHUNK, TILE)
    want_values, want_ids = reference_dflash2.topk_partials(unary, 16, CHUNK)
    assert torch.equal(ids, want_ids) and torch.equal(values, want_values)
    assert (ids[..., 2, 5:] == reference_dflash2.EMPTY_ID).all()
    cand, cand_unary = dflash2_launch.topk_merge(values, ids, 16)
    assert torch.equal(cand, reference_dflash2.candidates(unary, 16))
    assert torch.equal(cand_unary, unary.gather(-1, cand))


def test_ops_run_the_kernels_when_enabled(monkeypatch):
    calls = []
    real_select, real_conv = dflash2_launch.candidate_select, dflash2_launch.grouped_dynamic_conv
    monkeypatch.setattr(dflash2_launch, "candidate_select", lambda *a: calls.append("select") or real_select(*a))
    monkeypatch.setattr(dflash2_launch, "grouped_dynamic_conv", lambda *a: calls.append("conv") or real_conv(*a))
    args = select_inputs(seed=6, batch=2, steps=2, vocab=64, rank=16)
    conv = conv_inputs(steps=3, hidden=32, groups=2)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    expected = ops.candidate_select(*args, 16), ops.grouped_dynamic_conv(*conv)
    assert calls == []  # CPU without the interpreter: the reference
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    got = ops.candidate_select(*args, 16), ops.grouped_dynamic_conv(*conv)
    assert calls == ["select", "conv"]
    assert all(torch.equal(a, b) for a, b in zip(got[0][:2], expected[0][:2]))
    torch.testing.assert_close(got[1], expected[1], atol=1e-6, rtol=1e-6)
    ops.candidate_select(*select_inputs(seed=6, batch=2, steps=2, vocab=64, rank=24), 16)  # rank 24: not covered
    assert calls == ["select", "conv"]


def test_uncovered_shapes_are_a_one_line_error():
    args = select_inputs(rank=24)
    with pytest.raises(DFlashError, match="do not cover") as error:
        dflash2_launch.candidate_select(*args, 16)
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- ONNX nodes


def single_node_model(spec, inputs, outputs, **attributes) -> onnx.ModelProto:
    node = onnx_nodes.make_node(spec, list(spec.inputs), list(spec.outputs), **attributes)

    def info(name, x):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.numpy().dtype), list(x.shape))

    graph = helper.make_graph(
        [node], spec.op_type, [info(n, x) for n, x in zip(spec.inputs, inputs)], [info(n, x) for n, x in zip(spec.outputs, outputs)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(onnx_nodes.DOMAIN, 1)])
    onnx.checker.check_model(model)
    return model


def evaluate(model, inputs):
    feeds = {i.name: x.numpy() for i, x in zip(model.graph.input, inputs)}
    return ReferenceEvaluator(model, new_ops=onnx_nodes.evaluators()).run(None, feeds)


def test_nodes_evaluate_like_the_reference_and_the_kernels():
    onnx_nodes.register_schemas()
    x, delta, base, res = conv_inputs(seed=7, residual=True)
    for has_residual in (1, 0):
        inputs = [x, delta, base, res if has_residual else torch.zeros(1)]
        want = reference_dflash2.grouped_dynamic_conv(x, delta, base, res if has_residual else None)
        (out,) = evaluate(single_node_model(dflash2_nodes.GROUPED_CONV, inputs, [want], has_residual=has_residual), inputs)
        np.testing.assert_array_equal(out, want.numpy())

    args = select_inputs(seed=8, batch=2, steps=3, vocab=dflash2_launch.SELECT_CHUNK_V + 40)  # two chunks of the nodes' size
    unary = args[0]
    partials = reference_dflash2.topk_partials(unary, 16, dflash2_launch.SELECT_CHUNK_V)
    values, ids = evaluate(single_node_model(dflash2_nodes.TOPK_PARTIALS, [unary], list(partials), top_k=16), [unary])
    kernel_values, kernel_ids = dflash2_launch.topk_partials(unary, 16)  # the nodes' chunk size
    np.testing.assert_array_equal(values, kernel_values.numpy())
    np.testing.assert_array_equal(ids, kernel_ids.numpy())
    merge_inputs = [torch.from_numpy(values), torch.from_numpy(ids)]
    want_cand = reference_dflash2.candidates(unary, 16)
    cand, cand_unary = evaluate(
        single_node_model(dflash2_nodes.TOPK_MERGE, merge_inputs, [want_cand, unary.gather(-1, want_cand)], top_k=16), merge_inputs
    )
    np.testing.assert_array_equal(cand, want_cand.numpy())
    walk_inputs = [torch.from_numpy(cand), torch.from_numpy(cand_unary), *args[1:]]
    tokens, probs = reference_dflash2.candidate_select(*args, 16)[::2]
    got_tokens, got_probs = evaluate(single_node_model(dflash2_nodes.CANDIDATE_SELECT, walk_inputs, [tokens, probs]), walk_inputs)
    np.testing.assert_array_equal(got_tokens, tokens.numpy())
    np.testing.assert_array_equal(got_probs, probs.numpy())


def test_torch_export_emits_the_v2_nodes(monkeypatch):
    class DraftStep(torch.nn.Module):
        def forward(self, x, delta, base, residual, unary, z, anchor, predecessor, successor, temperature, seed, positions):
            mixed = torch.ops.dflash.grouped_dynamic_conv(x, delta, base)
            stream = torch.ops.dflash.grouped_dynamic_conv(mixed, delta, base, residual)
            tokens, cand, probs = torch.ops.dflash.candidate_select(
                unary, z, anchor, predecessor, successor, temperature, seed, positions, 16
            )
            return stream, tokens, cand, probs

    args = (*conv_inputs(seed=9, residual=True), *select_inputs(seed=9, vocab=300))
    program = torch.onnx.export(
        DraftStep().eval(), args, dynamo=True, custom_translation_table=onnx_nodes.custom_translation_table(), verbose=False
    )
    model = program.model_proto
    assert [n.op_type for n in model.graph.node if n.domain == "dflash"] == [
        "DFlash2GroupedConv",
        "DFlash2GroupedConv",
        "DFlash2TopKPartials",
        "DFlash2TopKMerge",
        "DFlash2CandidateSelect",
    ]
    outputs = evaluate(model, list(args))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # compare with the kernels
    expected = DraftStep()(*args)
    np.testing.assert_allclose(outputs[0], expected[0].numpy(), atol=1e-5, rtol=1e-5)
    for got, want in zip(outputs[1:], expected[1:]):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- TensorRT plans


def test_launch_plans_pick_audited_variants():
    audited = set(kernel_audit.aot_variants())
    conv = tensorrt_plugins.plan_launch(
        "DFlash2GroupedConv", dict(x=(4, 16, 2000), delta=(4, 16, 2, 125), base=(2, 2000)), dict(x="float16"), dict(has_residual=0)
    )
    assert dict(conv.variant.constexprs)["ALIGNED"] is False and dict(conv.variant.signature)["out_ptr"] == "*fp16"
    assert tuple(conv.grid) == (16, 4, 1) and conv.scalars == (16, 2000)
    select = tensorrt_plugins.plan_launch("DFlash2CandidateSelect", dict(cand=(4, 15, 16), z=(4, 15, 256)), dict(z="bfloat16"), {})
    partials = tensorrt_plugins.plan_launch("DFlash2TopKPartials", dict(unary=(4, 15, 151936)), dict(unary="bfloat16"), dict(top_k=16))
    assert {conv.variant, select.variant, partials.variant} <= audited
    with pytest.raises(DFlashError, match="successor is float32, expected bfloat16"):
        tensorrt_plugins.plan_launch(
            "DFlash2CandidateSelect", dict(cand=(4, 15, 16), z=(4, 15, 256)), dict(z="bfloat16", successor="float32"), {}
        )
