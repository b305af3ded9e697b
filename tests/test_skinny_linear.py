"""The skinny projection kernels (ops/kernels/skinny_linear.py, in Triton's interpreter) against
F.linear, and the runtime's choice between them and cuBLAS (runtime/linear_choice.py): the fixed
choice decodes the tokens and acceptance lengths of F.linear through the fused GPU pass (its
kernels interpreted), the measured one keeps F.linear off CUDA and says why."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support import shuffled_programs

pytest.importorskip("triton")

from trtllm_dflash.errors import DFlashError  # noqa: E402
from trtllm_dflash.ops.kernels import skinny_launch, tile_counters  # noqa: E402
from trtllm_dflash.runtime import linear_choice  # noqa: E402
from trtllm_dflash.runtime.torch_runtime import relative_error  # noqa: E402

# float32: accumulation order; bf16: one rounding of the output
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows,n,k,splits,bias",
    [
        (1, 96, 200, 1, False),  # an AR row; N and K not multiples of the tiles (masked)
        (16, 130, 512, 3, True),  # a verify block; three K splits summed by each tile's last
        (20, 64, 1024, 4, True),  # rows past one 16-row tile
        (40, 70, 256, 2, False),  # 64-row tiles
    ],
)
def test_the_kernels_compute_f_linear(dtype, rows, n, k, splits, bias):
    g = torch.Generator().manual_seed(rows + n)
    x = torch.randn(2, rows // 2, k, generator=g).to(dtype) if rows % 2 == 0 else torch.randn(rows, k, generator=g).to(dtype)
    weight = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    assert skinny_launch.unsupported_reason(x, weight, b) is None
    got = skinny_launch.skinny_linear(x, weight, b, splits=splits)
    want = F.linear(x.float(), weight.float(), None if b is None else b.float())
    assert got.shape == want.shape and got.dtype == dtype
    assert relative_error(got, want) < TOLERANCE[dtype]


def test_the_last_split_sums_the_partials_in_split_order_and_leaves_the_counters_zero(monkeypatch):
    """One launch: each tile's last K split sums every split's float32 partial in split order, then
    the bias, bit for bit what summing the splits' own products in that order gives; its tile
    counters are zero again after the launch, so the next launch (other tiles, other splits) is
    exact too. The programs run in a random order. Past MAX_TILES tiles the launch runs unsplit."""
    g = torch.Generator().manual_seed(5)
    x, weight, bias = torch.randn(16, 640, generator=g), torch.randn(200, 640, generator=g), torch.randn(200, generator=g)
    chunks = [(0, 256), (256, 512), (512, 640)]  # 3 splits of 2 BLOCK_K tiles (the last one short)
    want = torch.zeros(16, 200)
    for lo, hi in chunks:
        want += skinny_launch.skinny_linear(x[:, lo:hi].contiguous(), weight[:, lo:hi].contiguous(), splits=1)
    want += bias
    with shuffled_programs(1):  # any split may be a tile's last, as on a GPU
        got = skinny_launch.skinny_linear(x, weight, bias, splits=3)
    assert torch.equal(got, want)
    counters = tile_counters._COUNTERS[torch.device("cpu")]
    assert not counters.any()
    assert torch.equal(skinny_launch.skinny_linear(x, weight, bias, splits=3), got)
    assert relative_error(skinny_launch.skinny_linear(x[:3], weight[:70], None, splits=5), F.linear(x[:3], weight[:70])) < 1e-6
    assert not counters.any()
    monkeypatch.setattr(tile_counters, "MAX_TILES", 3)  # 200 columns are 4 tiles of 64
    assert torch.equal(skinny_launch.skinny_linear(x, weight, bias, splits=3), skinny_launch.skinny_linear(x, weight, bias, splits=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,splits", [(1, 1), (16, 3)])
def test_the_gated_kernel_is_the_activation_kernel_then_the_projection_bit_for_bit(monkeypatch, dtype, rows, splits):
    """`gated`: the down projection of a fused gate/up projection, silu(gate) * up formed as the
    kernel loads it: the bits of fused_ops.silu_mul's kernel followed by the plain skinny kernel
    over the same K tiles (the gated form's are narrower, GATED_BLOCK_K).
    LinearChoices.gated takes the call where the pick is skinny, and hands it back (None) where not."""
    from trtllm_dflash.modeling import fused_ops

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * 300, generator=g) * 3).to(dtype)  # K = 300: masked tiles
    weight, bias = torch.randn(70, 300, generator=g).to(dtype), torch.randn(70, generator=g).to(dtype)
    with monkeypatch.context() as patch:  # the plain kernel over the gated form's K tiles: the same accumulation order
        patch.setattr(skinny_launch, "BLOCK_K", skinny_launch.GATED_BLOCK_K)
        want = skinny_launch.skinny_linear(fused_ops.silu_mul(gate_up), weight, bias, splits=splits)
    assert skinny_launch.unsupported_reason(gate_up, weight, bias, gated=True) is None
    assert torch.equal(skinny_launch.skinny_linear(gate_up, weight, bias, splits=splits, gated=True), want)
    assert "half of x's last dim" in skinny_launch.unsupported_reason(gate_up[:, :300], weight, bias, gated=True)
    assert (
        relative_error(want, F.linear(F.silu(gate_up[:, :300].float()) * gate_up[:, 300:].float(), weight.float(), bias.float()))
        < linear_choice.TOLERANCE[dtype]  # the activation rounded to the dtype too
    )

    assert torch.equal(
        linear_choice.fixed("skinny").gated(gate_up, weight, bias), skinny_launch.skinny_linear(gate_up, weight, bias, gated=True)
    )
    assert linear_choice.fixed("torch").gated(gate_up, weight, bias) is None
    assert linear_choice.fixed("skinny").gated(gate_up[:1].expand(65, -1), weight, bias) is None  # past MAX_ROWS: F.linear's
    # fused_ops.silu_mul_linear: one launch with a gated choice, the activation then the projection without
    assert torch.equal(
        fused_ops.silu_mul_linear(gate_up, weight, bias, linear_choice.fixed("skinny")),
        linear_choice.fixed("skinny").gated(gate_up, weight, bias),
    )
    torch.testing.assert_close(fused_ops.silu_mul_linear(gate_up, weight, bias), F.linear(fused_ops.silu_mul(gate_up), weight, bias))


def test_k_splits_fill_the_sms_and_keep_each_split_long():
    # Qwen3-8B's o_proj at batch 1 on 132 SMs: 64 column tiles, so 5 splits of 4096 / 5 -> 7 tiles of 128
    assert skinny_launch.k_splits(16, 4096, 4096, 132) == 5
    assert skinny_launch.k_splits(16, 24576, 4096, 132) == 1  # gate/up: 384 column tiles fill the GPU
    assert skinny_launch.k_splits(1, 4096, 512, 132) == 1  # K too short to split into 4-tile chunks
    assert skinny_launch.block_m(1) == 16 and skinny_launch.block_m(17) == 32 and skinny_launch.block_m(64) == 64
    # what the measured choice times: none, half, the natural count, double (each split one 128-wide tile at least)
    assert skinny_launch.split_candidates(16, 4096, 4096, 132) == [1, 2, 5, 10]
    assert skinny_launch.split_candidates(1, 4096, 256, 132) == [1, 2]


def test_what_the_kernels_do_not_cover_is_named():
    weight = torch.randn(8, 32)
    assert "rows" in skinny_launch.unsupported_reason(torch.randn(65, 32), weight)
    assert "dtype" in skinny_launch.unsupported_reason(torch.randn(2, 32, dtype=torch.float64), weight)
    assert "weight" in skinny_launch.unsupported_reason(torch.randn(2, 32), weight.t())


def test_the_fixed_choice_runs_the_kernels_only_where_they_cover_the_call(monkeypatch):
    """Where the kernels run (here: Triton's interpreter, asked for) and cover the call; a CPU
    without the interpreter asked for keeps F.linear (the interpreter would crawl)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = []
    real = skinny_launch.skinny_linear
    monkeypatch.setattr(skinny_launch, "skinny_linear", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    choices = linear_choice.fixed("skinny")
    weight = torch.randn(24, 64)
    small, big = torch.randn(3, 64), torch.randn(100, 64)
    torch.testing.assert_close(choices(small, weight), F.linear(small, weight), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(choices(big, weight), F.linear(big, weight))
    assert calls == [small.shape]  # 100 rows: F.linear
    assert linear_choice.fixed("torch")(small, weight) is not None and len(calls) == 1
    monkeypatch.delenv("TRITON_INTERPRET")
    torch.testing.assert_close(linear_choice.fixed("skinny")(small, weight), F.linear(small, weight))
    assert len(calls) == 1
    with pytest.raises(DFlashError, match="unknown linear choice 'fast'"):
        linear_choice.fixed("fast")


def test_measured_choices_pick_per_rows_and_shape(monkeypatch):
    choices = linear_choice.LinearChoices(
        fixed=None,
        choices=(
            linear_choice.Choice(1, (8, 32), "skinny", 0.2, 0.1, splits=2),
            linear_choice.Choice(16, (8, 32), "torch", 0.2, 0.3, splits=1),
            linear_choice.Choice(1, (6, 32), "torch", 0.1, 0.2, splits=1),
        ),
    )
    assert choices.pick(1, (8, 32)) == "skinny" and choices.pick(9, (8, 32)) == "torch" and choices.pick(1, (6, 32)) == "torch"
    assert choices.pick(17, (8, 32)) == "torch" and choices.pick(1, (5, 32)) == "torch"  # not measured: F.linear
    assert choices.pick(1, (8, 32), gated=True) == "torch"  # the gated form is measured on its own
    assert "rows 1 x 8x32: skinny (torch 0.2000 ms; skinny 0.1000 ms (2 K splits))" in choices.describe()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launched = []
    real = skinny_launch.skinny_linear
    monkeypatch.setattr(skinny_launch, "skinny_linear", lambda *a, **k: launched.append(k["splits"]) or real(*a, **k))
    x, weight = torch.randn(1, 32), torch.randn(8, 32)
    torch.testing.assert_close(choices(x, weight), F.linear(x, weight), atol=1e-5, rtol=1e-5)
    assert launched == [2]  # at the measured K split count
    gated = linear_choice.LinearChoices(fixed=None, choices=(linear_choice.Choice(1, (8, 32), "skinny", 0.2, 0.1, splits=3, gated=True),))
    gate_up = torch.randn(1, 64)
    assert gated(x, weight) is not None and launched == [2]  # the plain call: not measured, F.linear
    got = gated.gated(gate_up, weight)
    assert launched == [2, 3]  # the gated form at its own measured split count
    torch.testing.assert_close(got, F.linear(F.silu(gate_up[:, :32]) * gate_up[:, 32:], weight), atol=1e-5, rtol=1e-5)
    assert choices.gated(gate_up, weight) is None  # measured plain only: the caller runs the activation, then F.linear


def test_measuring_off_cuda_keeps_f_linear_and_says_why():
    weight, bias = torch.randn(24, 64), torch.randn(24)
    down = (torch.randn(8, 32), None)  # a down projection: measured on silu(gate) * up too
    choices = linear_choice.measure([(weight, bias), (weight, None), (torch.randn(8, 64), None)], rows=[1, 16, 128], gated=[down])
    keys = [(c.rows, c.shape, c.gated) for c in choices.choices]
    assert keys == [(r, shape, gated) for r in (1, 16) for shape, gated in (((24, 64), False), ((8, 64), False), ((8, 32), True))]
    assert all(c.chosen == "torch" and c.torch_ms > 0 and "needs CUDA" in c.refused for c in choices.choices)
    assert "rows 1 x 8x32, gated: torch" in choices.describe()


def test_each_candidate_is_timed_as_a_chain_of_calls_on_copies_of_the_weight_in_its_launch_kind():
    """As a pass runs a projection: after another kernel (where a dependent launch can overlap the
    one ahead), each call streaming its own weight, launched as the choice's kind asks."""
    from trtllm_dflash.ops.kernels import dependent_launch

    weight = torch.randn(8, 32)
    for dependent in (False, True):
        seen = []
        copies = linear_choice.chain_copies(weight)
        ms = linear_choice.timed_in_chain(lambda w: seen.append((w, dependent_launch.requested())), copies, dependent)
        assert ms > 0
        chain = seen[-linear_choice.CHAIN :]  # time_call warms up, then times whole chains
        assert len(seen) % linear_choice.CHAIN == 0 and [requested for _, requested in seen] == [dependent] * len(seen)
        assert len({w.data_ptr() for w, _ in chain}) == linear_choice.CHAIN and all(torch.equal(w, weight) for w, _ in chain)


def test_a_call_takes_the_choice_measured_for_its_launch_kind():
    """Where both launch kinds were measured, a call inside `dependent_launches` takes the dependent
    one; a kind not measured falls back to the ordinary launches' choice. Off Hopper only ordinary
    launches exist, and only they are measured."""
    from trtllm_dflash.ops.kernels.dependent_launch import dependent_launches

    ordinary = linear_choice.Choice(1, (8, 32), "torch", 0.2, 0.3, splits=2)
    dependent = linear_choice.Choice(1, (8, 32), "skinny", 0.2, 0.1, splits=3, dependent=True)
    other_shape = linear_choice.Choice(1, (6, 32), "skinny", 0.2, 0.1, splits=1)
    choices = linear_choice.LinearChoices(fixed=None, choices=(ordinary, dependent, other_shape))
    assert choices.pick(1, (8, 32)) == "torch" and choices.pick(1, (6, 32)) == "skinny"
    with dependent_launches(True):
        assert choices.pick(1, (8, 32)) == "skinny" and choices._measured(1, (8, 32)).splits == 3
        assert choices.pick(1, (6, 32)) == "skinny"  # measured with ordinary launches only
    assert "rows 1 x 8x32, dependent launches: skinny" in choices.describe()
    assert linear_choice.launch_kinds(torch.device("cpu")) == (False,)
    measured = linear_choice.measure([(torch.randn(8, 32), None)], rows=[1], launch_kinds=(False, True))
    assert [(c.rows, c.dependent) for c in measured.choices] == [(1, False), (1, True)]


def test_the_runtime_on_the_skinny_kernels_decodes_like_f_linear(monkeypatch):
    """The fused GPU pass (its kernels interpreted) with every decode projection, both LM heads and
    the drafter's step on the skinny kernels (the down projections gated): the tokens and
    acceptance lengths of F.linear."""
    from trtllm_dflash.bench import gpu_step
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    target, drafter = gpu_step.make_models(gpu_step.TINY, torch.device("cpu"), torch.float32)
    calls = []
    real = skinny_launch.skinny_linear
    monkeypatch.setattr(
        skinny_launch, "skinny_linear", lambda *a, **k: calls.append((tuple(a[1].shape), k.get("gated", False))) or real(*a, **k)
    )
    g = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (5, 8)]
    params = [SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=4, temperature=0.8, top_k=20, seed=3)]
    runs = {}
    for choice in ("torch", "skinny"):
        runtime = TorchRuntime(target, drafter, attention="dflash", linear_choice=choice)
        decoder = Decoder(runtime, max_batch=2, max_context=48)
        runs[choice] = [(r.token_ids, r.acceptance_lengths) for r in decoder.generate([Request(p, s) for p, s in zip(prompts, params)])]
        runtime.taps.remove()
    assert runs["skinny"] == runs["torch"]
    lm_head = tuple(target.get_output_embeddings().weight.shape)
    layer = runtime.fused.layers[0]
    down = tuple(runtime.fused.decoder.layers[0].mlp.down_proj.weight.shape)
    plain = {lm_head, tuple(layer.qkv.shape), tuple(layer.gate_up.shape), tuple(drafter.fc.weight.shape)}
    assert {(shape, False) for shape in plain} | {(down, True)} <= set(calls)  # the down projections gated: no activation kernel
