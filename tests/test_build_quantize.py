"""ModelOpt quantization of the target: FP8 PTQ on CPU (real ModelOpt), NVFP4 deferred to a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from trtllm_dflash.builder.stages import StageBlocked


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    from trtllm_dflash.builder.quantize import quantize_target
    from trtllm_dflash.recipes.precision import Precision
    from trtllm_dflash.recipes.schema import CalibrationSection
    from trtllm_dflash.testing.tiny import make_tiny_target

    root = tmp_path_factory.mktemp("fp8")
    target = make_tiny_target(root / "target", "llama", seed=2, num_layers=2, tokenizer=True)
    out = root / "quantized"
    summary = quantize_target(target, out, Precision("fp8", kv_cache="bf16"), CalibrationSection(num_samples=8, max_seq_len=64))
    return target, out, summary


def test_fp8_ptq_runs_on_cpu_and_exports_a_modelopt_checkpoint(fp8_checkpoint):
    _, out, summary = fp8_checkpoint
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert config["quantization_config"]["quant_algo"] == "FP8"
    # every decoder linear layer is stored in FP8 (2 layers x q, k, v, o, gate, up, down)
    assert summary["quantized_weights"] == 14 and summary["calibration_samples"] == 8
    assert (out / "tokenizer.json").is_file()


def test_fp8_checkpoint_loads_and_generates_close_to_the_original(fp8_checkpoint):
    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.checkpoints import load_target

    original_dir, out, _ = fp8_checkpoint
    original = load_target(original_dir).model
    quantized = load_target(out).model
    ids = torch.tensor([[5, 17, 40, 41, 42, 60, 61, 9]])
    with torch.no_grad():
        reference, fp8 = original(ids).logits, quantized(ids).logits
    relative = float((fp8 - reference).abs().max() / reference.abs().max())
    assert 0 < relative < 0.1  # rounded to FP8 (weights and activations), but the same model
    agree = float((fp8.argmax(-1) == reference.argmax(-1)).float().mean())
    assert agree >= 0.75
    outputs = DFlashPipeline.load(str(out)).generate(["hello"], max_new_tokens=12, stop_token_ids=())
    assert len(outputs[0].token_ids) == 12 and outputs[0].text


def test_nvfp4_is_deferred_to_a_gpu_with_the_reason():
    from trtllm_dflash.builder.quantize import require_cuda_for
    from trtllm_dflash.recipes.precision import Precision

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: NVFP4 calibration runs here")
    with pytest.raises(StageBlocked) as error:
        require_cuda_for(Precision("nvfp4"))
    assert "CUDA" in error.value.problem and "Blackwell" in error.value.fix
    require_cuda_for(Precision("fp8"))  # FP8 calibrates on CPU


def test_calibration_text_builtin_and_user_file(tmp_path):
    from trtllm_dflash.builder.quantize import calibration_texts
    from trtllm_dflash.errors import DFlashError
    from trtllm_dflash.recipes.schema import CalibrationSection

    builtin = calibration_texts(CalibrationSection(num_samples=100))
    assert len(builtin) >= 20 and any("def " in t and "\n" in t for t in builtin)  # code with real newlines
    user = tmp_path / "calib.jsonl"
    user.write_text('{"text": "first"}\n{"text": "second"}\n')
    assert calibration_texts(CalibrationSection(dataset=str(user), num_samples=1)) == ["first"]
    with pytest.raises(DFlashError, match="does not exist"):
        calibration_texts(CalibrationSection(dataset=str(tmp_path / "missing.txt")))


def test_fp8_target_exports_as_q_dq_graph_that_matches_torch_and_builds_with_tensorrt_rtx(fp8_checkpoint, tmp_path):
    """FP8 weights stay FP8 in the graph (DequantizeLinear), inputs are rounded by Q/DQ pairs."""
    from collections import Counter

    import onnx

    from trtllm_dflash.builder import engines
    from trtllm_dflash.builder.export import Bounds, TargetGraph, export_target
    from trtllm_dflash.checkpoints.modelopt import load_modelopt_model
    from trtllm_dflash.runtime.onnx_runtime import GraphSession

    _, out, _ = fp8_checkpoint
    bounds = Bounds(max_batch=2, max_input_len=16, max_seq_len=32, block_size=4)
    model = load_modelopt_model(out, "cpu", torch.float32, fp8_modules=True)
    info = export_target(model, [0, 1], tmp_path / "target.onnx", "fp32", bounds)
    graph = onnx.load(str(tmp_path / "target.onnx"))
    ops = Counter(node.op_type for node in graph.graph.node)
    fp8_weights = [i for i in graph.graph.initializer if i.data_type == onnx.TensorProto.FLOAT8E4M3FN and len(i.dims) == 2]
    assert len(fp8_weights) == 14 and ops["DequantizeLinear"] >= 14 + ops["QuantizeLinear"] and ops["QuantizeLinear"] >= 4

    past = tuple(torch.zeros(2, 3, info.kv_heads, info.head_dim) for _ in range(2))
    feed = (torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), torch.tensor([0, 0]), torch.tensor([[3], [2]]), past, past)
    with torch.no_grad():
        expected = TargetGraph(model, [0, 1])(*feed)
    names = {"input_ids": feed[0], "starts": feed[1], "logit_index": feed[2]}
    for i in range(2):
        names[f"past_key_{i}"] = names[f"past_value_{i}"] = past[i]
    got = GraphSession(tmp_path / "target.onnx").run({k: v.numpy() for k, v in names.items()})
    assert torch.allclose(torch.from_numpy(got["logits"]), expected[0], rtol=1e-4, atol=1e-5)
    assert torch.allclose(torch.from_numpy(got["features"]), expected[1], rtol=1e-4, atol=1e-5)

    flavour = engines.load_flavour("tensorrt-rtx")  # FP8 Q/DQ graph -> a real engine for SM 12.0, ahead of time
    built = engines.build_engine(
        flavour, tmp_path / "target.onnx", tmp_path / "target.engine", info.to_dict(), engines.profiles("target", bounds), (12, 0)
    )
    assert built["bytes"] > 0 and (tmp_path / "target.engine").stat().st_size == built["bytes"]
