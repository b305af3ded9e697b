"""Quantized drafters in ModelOpt's export layout (FP8, NVFP4): loaded, dequantized exactly, decoding
the target's own output, with their acceptance beside the unquantized drafter's.

Three writers: our build's own NVFP4 path (ModelOpt's `mtq.quantize` with the build's drafter config
and calibration forward, then the build's `write_quantized_drafter`; ModelOpt only collects amax
while calibrating, which runs on CPU), real ModelOpt FP8 PTQ exported with ModelOpt's own
quant_utils, and the tiny ModelOpt-layout writer (`testing.write_modelopt_drafter`), whose bytes are
checked against ModelOpt's own packing (NVFP4QTensor.quantize, to_quantized_weight).

The reference dequantization here decodes the bits itself (E2M1: sign, 2 exponent bits, 1 mantissa
bit; E4M3: bias 7, subnormals) and multiplies in float64, where code x block scale x tensor scale
is exact (2 + 4 + 24 significant bits), then rounds once to float32: the loader must give exactly
that float32.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_dflash.builder import validate
from trtllm_dflash.checkpoints import load_drafter, load_target, safetensors_header
from trtllm_dflash.errors import CheckpointError
from trtllm_dflash.modeling.fp4 import dequantize_nvfp4, quantize_nvfp4
from trtllm_dflash.testing.tiny import MODELOPT_QUANTIZED_LINEARS, cycle_sequences, write_modelopt_drafter

NEW_TOKENS = 24


# ----------------------------------------------------------------------------- reference dequantization


def ref_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 code -> value from its bits, float64: exponent 0 is subnormal (m x 0.5)."""
    codes = codes.long()
    sign = torch.where((codes >> 3) & 1 == 1, -1.0, 1.0).double()
    exponent, mantissa = (codes >> 1) & 3, (codes & 1).double()
    normal = (1.0 + mantissa / 2) * torch.pow(2.0, (exponent - 1).double())
    return sign * torch.where(exponent == 0, mantissa * 0.5, normal)


def ref_e4m3(raw: torch.Tensor) -> torch.Tensor:
    """E4M3 (fn) bytes -> value from the bits, float64; the NaN pattern (S.1111.111) raises."""
    bits = raw.view(torch.uint8).long()
    assert not bool(((bits & 0x7F) == 0x7F).any()), "NaN block scale"
    sign = torch.where((bits >> 7) & 1 == 1, -1.0, 1.0).double()
    exponent, mantissa = (bits >> 3) & 15, (bits & 7).double()
    normal = (1.0 + mantissa / 8) * torch.pow(2.0, (exponent - 7).double())
    return sign * torch.where(exponent == 0, mantissa / 8 * 2.0**-6, normal)


def ref_nvfp4_exact(packed: torch.Tensor, block_scale: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """`weight` uint8 [out, in/2] (element 2j in the low nibble, 2j+1 in the high one) -> float64, exact."""
    low, high = packed.long() & 0x0F, packed.long() >> 4
    codes = torch.stack((low, high), dim=-1).flatten(-2)  # [out, in]
    scale = ref_e4m3(block_scale).repeat_interleave(16, dim=-1)
    return ref_e2m1(codes) * scale * tensor_scale.double()


def ref_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """The exact value rounded once to float32."""
    return ref_nvfp4_exact(packed, block_scale, tensor_scale).float()


def ref_fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (ref_e4m3(weight) * scale.double().reshape(-1, 1) if scale.numel() > 1 else ref_e4m3(weight) * scale.double()).float()


def reference_state(quantized_dir: Path) -> dict[str, torch.Tensor]:
    """Every drafter tensor as the reference dequantizes it (scales and input/KV scales dropped)."""
    state = load_file(str(quantized_dir / "model.safetensors"))
    out = {}
    for name, tensor in state.items():
        if re.search(r"\.(weight_scale|weight_scale_2|input_scale|k_scale|v_scale)$", name):
            continue
        module = name.removesuffix(".weight")
        if tensor.dtype == torch.uint8:
            out[name] = ref_nvfp4(tensor, state[f"{module}.weight_scale"], state[f"{module}.weight_scale_2"])
        elif tensor.dtype == torch.float8_e4m3fn:
            out[name] = ref_fp8(tensor, state[f"{module}.weight_scale"])
        else:
            out[name] = tensor.float()
    return out


def test_reference_decoders_cover_every_code():
    """The bit decoders against the format tables: all 16 E2M1 codes, all 255 finite E4M3 bytes."""
    from trtllm_dflash.modeling.fp4 import E2M1_VALUES

    assert ref_e2m1(torch.arange(16)).tolist() == list(E2M1_VALUES)
    raw = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    assert torch.equal(ref_e4m3(raw), raw.view(torch.float8_e4m3fn).double())
    assert (
        ref_e4m3(torch.tensor([0x7E], dtype=torch.uint8)).item() == 448.0
        and ref_e4m3(torch.tensor([1], dtype=torch.uint8)).item() == 2.0**-9
    )


# ----------------------------------------------------------------------------- the writers against ModelOpt's packing


def _weights(seed: int = 0) -> torch.Tensor:
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(seed)) * 0.05
    w[3] = 0.0  # all-zero blocks get block scale 1.0
    w[5, :16] *= 40  # one block far above the others: its neighbours' scales shrink
    return w


def test_nvfp4_codec_packs_like_modelopt():
    """quantize_nvfp4 (the tiny writer's codec) gives ModelOpt's NVFP4QTensor.quantize bytes exactly:
    codes, nibble order, E4M3 block scales and the tensor scale; and the dequantization is the
    correctly rounded one, within one float32 ulp of ModelOpt's (which rounds twice)."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    w = _weights()
    packed, block, tensor_scale = quantize_nvfp4(w)
    qtensor, mo_block, mo_scale = NVFP4QTensor.quantize(w.clone(), 16)
    assert packed.dtype == torch.uint8 and packed.shape == (48, 32)
    assert block.dtype == torch.float8_e4m3fn and block.shape == (48, 4) and tensor_scale.shape == ()
    assert torch.equal(packed, qtensor._quantized_data)
    assert torch.equal(block.view(torch.uint8), mo_block.view(torch.uint8))
    assert torch.equal(tensor_scale, mo_scale.reshape(()))
    ours = dequantize_nvfp4(packed, block, tensor_scale)
    assert torch.equal(ours, ref_nvfp4(packed, block, tensor_scale))
    theirs = qtensor.dequantize(dtype=torch.float32, scale=mo_block, double_scale=mo_scale, block_sizes={-1: 16})
    ulp = torch.finfo(torch.float32).eps * ours.abs()
    assert bool(((ours - theirs).abs() <= ulp).all())
    assert torch.equal(dequantize_nvfp4(packed, block, tensor_scale, torch.float64), ref_nvfp4_exact(packed, block, tensor_scale))
    # the nibble order is observable: swapping nibbles changes the values
    swapped = (packed >> 4) | (packed << 4)
    assert not torch.equal(dequantize_nvfp4(swapped, block, tensor_scale), ours)


def test_fp8_writer_packs_like_modelopt(tmp_path, trained_pair):
    """The tiny writer's FP8 bytes are ModelOpt's to_quantized_weight at ModelOpt's scale (amax / 448)."""
    from modelopt.torch.export.quant_utils import to_quantized_weight

    _, zlab_dir, _ = trained_pair
    out = write_modelopt_drafter(zlab_dir, tmp_path / "fp8", "FP8")
    source, written = load_file(str(zlab_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    name = "layers.0.self_attn.k_proj.weight"
    scale = written[name.replace(".weight", ".weight_scale")]
    assert scale.item() == (source[name].abs().amax() / 448.0).item()
    assert torch.equal(written[name].view(torch.uint8), to_quantized_weight(source[name], scale, "fp8").view(torch.uint8))


# ----------------------------------------------------------------------------- our build's writer and real ModelOpt PTQ


def _calibrated(trained_pair, config) -> tuple:
    """The trained drafter after ModelOpt's `mtq.quantize(config)`, calibrated with the build's own
    forward (builder/quantize_drafter.drafter_forward) on the target's hidden states."""
    import modelopt.torch.quantization as mtq

    from trtllm_dflash.builder.quantize_drafter import drafter_forward
    from trtllm_dflash.modeling.taps import HiddenTaps

    target_dir, zlab_dir, _ = trained_pair
    target = load_target(target_dir)
    drafter = load_drafter(zlab_dir, target)
    decoder = target.model.get_decoder()
    taps = HiddenTaps(decoder.layers, drafter.config.target_layer_ids)
    batches = cycle_sequences(4, 48, torch.Generator().manual_seed(7))

    def forward_loop(model) -> None:
        for ids in batches:
            decoder(input_ids=ids[None], use_cache=False)
            drafter_forward(model, target.model, ids[None], taps.features())

    try:
        with torch.no_grad():
            drafter = mtq.quantize(drafter, config, forward_loop=forward_loop)
    finally:
        taps.remove()
    return drafter, zlab_dir


@pytest.fixture(scope="module")
def build_nvfp4_dir(tmp_path_factory, trained_pair) -> Path:
    """The NVFP4 drafter as `dflash-trt build` writes it (`quantization.drafter: nvfp4`): ModelOpt
    NVFP4 PTQ with nvfp4.drafter_config() (fc kept), written by quantize_drafter.write_quantized_drafter."""
    from trtllm_dflash.builder import nvfp4
    from trtllm_dflash.builder.quantize_drafter import write_quantized_drafter

    drafter, zlab_dir = _calibrated(trained_pair, nvfp4.drafter_config())
    out = tmp_path_factory.mktemp("build-nvfp4") / "drafter"
    counts = write_quantized_drafter(drafter, zlab_dir, out)
    assert counts == {"quantized_linears": 2 * len(MODELOPT_QUANTIZED_LINEARS), "kept_linears": 1}  # fc kept
    return out


@pytest.fixture(scope="module")
def modelopt_fp8_dir(tmp_path_factory, trained_pair) -> Path:
    """Real ModelOpt FP8 PTQ of the drafter (fc kept), exported with ModelOpt's own quant_utils
    (the functions its HF export calls per linear): FP8 weight, weight_scale, input_scale."""
    import copy

    import modelopt.torch.quantization as mtq
    from modelopt.torch.export.quant_utils import (
        get_activation_scaling_factor,
        get_quantization_format,
        get_weight_scaling_factor,
        to_quantized_weight,
    )

    config = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    config["quant_cfg"] = list(config["quant_cfg"]) + [{"quantizer_name": "fc.*", "enable": False}]
    drafter, zlab_dir = _calibrated(trained_pair, config)
    state, quantized = {}, []
    for name, module in drafter.named_modules():
        if isinstance(module, torch.nn.Linear) and get_quantization_format(module) == "fp8":
            scale = get_weight_scaling_factor(module)
            state[f"{name}.weight"] = to_quantized_weight(module.weight.detach(), scale, "fp8")
            state[f"{name}.weight_scale"] = scale.float().reshape(())
            state[f"{name}.input_scale"] = get_activation_scaling_factor(module).float().reshape(())
            quantized.append(name)
    for key, tensor in drafter.state_dict().items():
        if "_quantizer." not in key and key not in state:
            state[key] = tensor.detach()
    out = tmp_path_factory.mktemp("modelopt-fp8") / "drafter"
    shutil.copytree(zlab_dir, out)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    quant = {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["fc"]}
    (out / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quant}))
    assert len(quantized) == 2 * len(MODELOPT_QUANTIZED_LINEARS)
    return out


def test_build_nvfp4_drafter_is_in_modelopts_layout(build_nvfp4_dir):
    header = safetensors_header(build_nvfp4_dir / "model.safetensors")
    k_proj = "layers.0.self_attn.k_proj"
    assert header[f"{k_proj}.weight"]["dtype"] == "U8" and header[f"{k_proj}.weight"]["shape"] == [32, 32]
    assert header[f"{k_proj}.weight_scale"]["dtype"] == "F8_E4M3" and header[f"{k_proj}.weight_scale"]["shape"] == [32, 4]
    assert header[f"{k_proj}.weight_scale_2"]["dtype"] == "F32" and header[f"{k_proj}.weight_scale_2"]["shape"] == []
    assert header[f"{k_proj}.input_scale"]["dtype"] == "F32"
    assert header["fc.weight"]["dtype"] == "BF16"  # kept, as the build keeps it
    quant = json.loads((build_nvfp4_dir / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "NVFP4" and quant["exclude_modules"] == ["fc"]


# ----------------------------------------------------------------------------- loading: exact, every weight


@pytest.fixture(scope="module")
def quantized_dirs(tmp_path_factory, trained_pair, build_nvfp4_dir, modelopt_fp8_dir) -> dict[str, Path]:
    _, zlab_dir, _ = trained_pair
    root = tmp_path_factory.mktemp("quantized")
    return {
        "nvfp4 (build)": build_nvfp4_dir,
        "fp8 (ModelOpt PTQ)": modelopt_fp8_dir,
        "nvfp4 (writer)": write_modelopt_drafter(zlab_dir, root / "nvfp4", "NVFP4"),
        "fp8 (writer)": write_modelopt_drafter(zlab_dir, root / "fp8", "FP8"),
    }


@pytest.mark.parametrize("which", ["nvfp4 (build)", "fp8 (ModelOpt PTQ)", "nvfp4 (writer)", "fp8 (writer)"])
def test_quantized_drafter_is_dequantized_exactly(quantized_dirs, trained_pair, which):
    """Every tensor equals the reference bit for bit: quantized linears (k_proj / v_proj, which also
    project the context rows, included) dequantized, fc and norms as they were written."""
    target_dir, _, prompts = trained_pair
    path = quantized_dirs[which]
    drafter = load_drafter(path, dtype=torch.float32)
    expected = reference_state(path)
    got = drafter.state_dict()
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    quantized = [
        n
        for n, t in load_file(str(path / "model.safetensors")).items()
        if t.dtype in (torch.uint8, torch.float8_e4m3fn) and n.endswith(".weight")
    ]
    assert len(quantized) == 2 * len(MODELOPT_QUANTIZED_LINEARS)
    # the fused decoding path (one q/k/v matmul over the context rows and the block) reads the same weights
    target = load_target(target_dir)
    drafter = load_drafter(path, target, dtype=torch.float32)
    validate.decode_with(target.model, drafter, prompts[:1], 4)
    for i, layer in enumerate(drafter.layers):
        stacked = layer.self_attn._stacked["weight"]
        qkv = torch.cat([expected[f"layers.{i}.self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
        assert torch.equal(stacked, qkv.to(stacked.dtype))


def test_loader_matches_modelopts_dequantize(build_nvfp4_dir):
    """ModelOpt's own NVFP4QTensor.dequantize of the build's bytes: within one float32 ulp of ours."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    state = load_file(str(build_nvfp4_dir / "model.safetensors"))
    got = load_drafter(build_nvfp4_dir, dtype=torch.float32).state_dict()
    module = "layers.1.mlp.down_proj"
    packed = state[f"{module}.weight"]
    shape = (packed.shape[0], packed.shape[1] * 2)
    theirs = NVFP4QTensor(torch.Size(shape), torch.float32, packed).dequantize(
        dtype=torch.float32, scale=state[f"{module}.weight_scale"], double_scale=state[f"{module}.weight_scale_2"], block_sizes={-1: 16}
    )
    ours = got[f"{module}.weight"]
    assert bool(((ours - theirs).abs() <= torch.finfo(torch.float32).eps * ours.abs()).all())


# ----------------------------------------------------------------------------- decoding: lossless, tau reported


def test_quantized_drafters_decode_the_targets_output(quantized_dirs, trained_pair, capsys):
    """Greedy decoding with each quantized drafter gives the target's own greedy tokens (raised inside
    drafter_acceptance otherwise), batch of 4 ragged prompts; tau is reported beside the unquantized one's."""
    target_dir, zlab_dir, prompts = trained_pair
    target = load_target(target_dir, dtype=torch.float64)
    drafters = {"unquantized": load_drafter(zlab_dir, target)}
    drafters.update({name: load_drafter(path, target) for name, path in quantized_dirs.items()})
    report = validate.drafter_acceptance(target.model, drafters, prompts, NEW_TOKENS)
    assert report["outputs_equal_target"]
    with capsys.disabled():
        print(
            "\n  tau on the cycle pair (4 prompts, %d new tokens, float64): " % NEW_TOKENS
            + ", ".join(f"{name} {tau:.2f}" for name, tau in report["tau"].items())
        )
    tau = report["tau"]
    assert tau["unquantized"] > 4  # the drafter really drafts
    for name in quantized_dirs:
        assert 1.0 <= tau[name] <= NEW_TOKENS  # a quantized drafter drafts too; exactly how well is reported
    assert tau["fp8 (writer)"] >= tau["unquantized"] - 1.0  # FP8 keeps this drafter's acceptance close


def test_drafter_acceptance_refuses_a_drafter_whose_output_differs(trained_pair, monkeypatch):
    """The check can fail: a speculative decode whose tokens are not the target's own (one token
    changed after a real decode) raises."""
    target_dir, zlab_dir, prompts = trained_pair
    target = load_target(target_dir, dtype=torch.float64)
    drafter = load_drafter(zlab_dir, target)
    original = validate.decode_with

    def tampered(target_model, drafter_or_none, prompts, max_new_tokens):
        results = original(target_model, drafter_or_none, prompts, max_new_tokens)
        if drafter_or_none is not None:
            results[0].token_ids[-1] = (results[0].token_ids[-1] + 1) % 100
        return results

    monkeypatch.setattr(validate, "decode_with", tampered)
    with pytest.raises(validate.ValidationError, match="differs from the target's own output"):
        validate.drafter_acceptance(target.model, {"nvfp4": drafter}, prompts, 8)


def test_build_reports_the_quantized_drafters_acceptance(tmp_path, trained_pair, build_nvfp4_dir):
    """What the build's quantize stage runs after writing an NVFP4 drafter: tau of both drafters
    on the same prompts (calibration samples, here cycle text through the character tokenizer)."""
    from trtllm_dflash.recipes.schema import CalibrationSection
    from trtllm_dflash.testing.tiny import make_tiny_tokenizer

    target_dir, zlab_dir, _ = trained_pair
    target_copy = tmp_path / "target"
    shutil.copytree(target_dir, target_copy)
    tokenizer = make_tiny_tokenizer(target_copy)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    lines = [tok.decode(row.tolist()) for row in cycle_sequences(3, 20, torch.Generator().manual_seed(5))]
    calibration_file = tmp_path / "calibration.txt"
    calibration_file.write_text("\n".join(lines) + "\n")
    calibration = CalibrationSection(dataset=str(calibration_file), num_samples=3)
    report = validate.quantized_drafter_acceptance(target_copy, zlab_dir, build_nvfp4_dir, calibration, max_new_tokens=16)
    assert report["prompts"] == 3 and report["outputs_equal_target"] and report["device"] == "cpu"
    assert set(report["tau"]) == {"unquantized", "quantized"} and report["tau"]["unquantized"] > 2


# ----------------------------------------------------------------------------- bad input: one line, the problem and the fix


def _edit(path: Path, change) -> Path:
    state = load_file(str(path / "model.safetensors"))
    change(state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    return path


K = "layers.0.self_attn.k_proj"


@pytest.mark.parametrize(
    "algo,change,message",
    [
        ("NVFP4", lambda s: s.pop(f"{K}.weight_scale"), f"{K}.weight has no {K}.weight_scale"),
        ("NVFP4", lambda s: s.pop(f"{K}.weight_scale_2"), "has no .*weight_scale_2"),
        ("NVFP4", lambda s: s.update({f"{K}.weight_scale": s[f"{K}.weight_scale"][:, :2].contiguous()}), "do not match"),
        ("NVFP4", lambda s: s.update({f"{K}.weight_scale": s[f"{K}.weight_scale"].float()}), "F8_E4M3"),
        ("NVFP4", lambda s: s.update({f"{K}.weight_scale_2": torch.ones(32)}), "one scale per tensor"),
        ("NVFP4", lambda s: s.update({f"{K}.weight_scale_2": torch.tensor(-1.0)}), "non-finite or non-positive"),
        ("NVFP4", lambda s: s.update({f"{K}.weight_scale": torch.full((32, 4), float("nan")).to(torch.float8_e4m3fn)}), "non-finite"),
        ("FP8", lambda s: s.update({f"{K}.weight_scale": torch.ones(4)}), "weight_scale of shape"),
        ("FP8", lambda s: s.update({f"{K}.weight_scale": torch.tensor(float("inf"))}), "non-finite"),
    ],
)
def test_malformed_quantized_drafters_are_refused(tmp_path, trained_pair, algo, change, message):
    _, zlab_dir, _ = trained_pair
    path = _edit(write_modelopt_drafter(zlab_dir, tmp_path / "q", algo), change)
    with pytest.raises(CheckpointError, match=message) as info:
        load_drafter(path)
    assert info.value.fix and "\n" not in str(info.value)


def _set_quant(path: Path, quantization: dict | None, config_quant: dict | None = None) -> Path:
    (path / "hf_quant_config.json").unlink(missing_ok=True)
    if quantization is not None:
        (path / "hf_quant_config.json").write_text(json.dumps({"quantization": quantization}))
    config = json.loads((path / "config.json").read_text())
    config.pop("quantization_config", None)
    if config_quant is not None:
        config["quantization_config"] = config_quant
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "written,quantization,config_quant,message",
    [
        ("NVFP4", {"quant_algo": "W4A8_AWQ"}, None, "quantized with W4A8_AWQ, which this loader cannot dequantize"),
        (None, {"quant_algo": "NVFP4"}, None, "declares quant_algo NVFP4 but none of its weights"),
        (None, {"quant_algo": "FP8"}, None, "declares quant_algo FP8 but none of its weights"),
        ("NVFP4", None, None, "quantized tensor.* left after loading"),
        ("FP8", None, None, "quantized tensor.* left after loading"),
        ("NVFP4", {"quant_algo": "FP8"}, None, "declares quant_algo FP8 but none of its weights is stored as FP8"),
        (None, None, {"quant_method": "compressed-tensors"}, "quant_method 'compressed-tensors'"),
    ],
)
def test_quantization_configs_that_do_not_fit_are_refused(tmp_path, trained_pair, written, quantization, config_quant, message):
    _, zlab_dir, _ = trained_pair
    path = write_modelopt_drafter(zlab_dir, tmp_path / "q", written) if written else shutil.copytree(zlab_dir, tmp_path / "q")
    _set_quant(path, quantization, config_quant)
    with pytest.raises(CheckpointError, match=message) as info:
        load_drafter(path)
    assert info.value.fix and "\n" not in str(info.value)


def test_config_json_quantization_config_alone_is_read(tmp_path, trained_pair):
    """ModelOpt's config.json `quantization_config` (no hf_quant_config.json) names the algorithm too."""
    _, zlab_dir, _ = trained_pair
    path = write_modelopt_drafter(zlab_dir, tmp_path / "q", "NVFP4")
    _set_quant(path, None, {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})
    expected = reference_state(path)
    got = load_drafter(path, dtype=torch.float32).state_dict()
    assert all(torch.equal(got[name], tensor) for name, tensor in expected.items())
