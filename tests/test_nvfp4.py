"""NVFP4 through ModelOpt on a machine without CUDA: each step refuses in one line naming the GPU
requirement (through `dflash-trt build` or the pipeline), and the MXFP4 -> NVFP4 weight cast of
gpt-oss experts is exact where its scales fit E4M3 and reports its error where they do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtllm_dflash.demo import DEMO_DIR
from trtllm_dflash.modeling.fp4 import dequantize_mxfp4, dequantize_nvfp4, quantize_mxfp4, unpack_codes

pytest.importorskip("modelopt", reason="needs nvidia-modelopt (pip install 'trtllm-dflash[quant]')")
from trtllm_dflash.builder.nvfp4 import mxfp4_to_nvfp4  # noqa: E402

NO_CUDA = pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has a CUDA GPU: the NVFP4 steps run here (tests/test_nvfp4_gpu.py)"
)
HAVE_DEMO = (DEMO_DIR / "target" / "config.json").is_file()


def bits(x: torch.Tensor) -> torch.Tensor:
    """float32 bit patterns, with -0 folded into +0 (ModelOpt's cast writes the E2M1 code of +0 for -0)."""
    return (x.float() + 0.0).view(torch.int32)


# ----------------------------------------------------------------------------- the weight cast


def test_mxfp4_to_nvfp4_is_bit_exact_when_the_scales_fit():
    """Exponents spread over 12 binades (< 18): every block scale 2^(k - m) is exact in E4M3."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 24, 128, generator=generator)  # [experts, out, in]
    weight = weight * torch.exp2(torch.randint(-8, 4, (4, 24, 4, 1), generator=generator).float()).repeat_interleave(32, -1).flatten(-2)
    blocks, scales = quantize_mxfp4(weight)
    cast = mxfp4_to_nvfp4(blocks, scales)

    assert cast.weight.dtype == torch.uint8 and cast.weight.shape == (4, 24, 64)
    assert cast.weight_scale.dtype == torch.float8_e4m3fn and cast.weight_scale.shape == (4, 24, 8)
    assert cast.weight_scale_2.dtype == torch.float32 and cast.weight_scale_2.dim() == 0
    assert torch.frexp(cast.weight_scale_2).mantissa == 0.5  # a power of two
    assert cast.exact and cast.exact_blocks == cast.blocks == 4 * 24 * 4
    assert cast.max_abs_error == 0.0 and cast.max_rel_error == 0.0
    source = dequantize_mxfp4(blocks, scales)
    converted = dequantize_nvfp4(cast.weight, cast.weight_scale, cast.weight_scale_2)
    assert torch.equal(bits(converted), bits(source))
    # the E2M1 codes carry over (up to the sign of zero)
    assert torch.equal(unpack_codes(cast.weight) & 0x7, unpack_codes(blocks.flatten(-2)) & 0x7)


def test_mxfp4_to_nvfp4_reports_its_error_when_the_range_is_too_wide():
    """One row 2^-24 below the rest: its blocks fall outside E4M3's 18 binades and are rounded."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(16, 64, generator=generator)
    weight[3] *= 2.0**-24
    blocks, scales = quantize_mxfp4(weight)
    cast = mxfp4_to_nvfp4(blocks, scales)

    source = dequantize_mxfp4(blocks, scales)
    converted = dequantize_nvfp4(cast.weight, cast.weight_scale, cast.weight_scale_2)
    error = (converted - source).abs()
    assert not cast.exact and cast.exact_blocks == cast.blocks - 2  # the two blocks of row 3
    assert cast.max_abs_error == float(error.max()) > 0.0
    nonzero = source != 0
    assert cast.max_rel_error == pytest.approx(float((error[nonzero] / source[nonzero].abs()).max()))
    assert 0.0 < cast.max_rel_error <= 1.0
    rows = torch.ones(16, dtype=torch.bool)
    rows[3] = False
    assert torch.equal(bits(converted[rows]), bits(source[rows]))  # the blocks in range stay exact


# ----------------------------------------------------------------------------- refusals without CUDA


def build(*args: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "1000"}
    return subprocess.run(
        [sys.executable, "-c", "from trtllm_dflash.cli.app import main; main()", "build", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )


def refusal_line(result: subprocess.CompletedProcess, out: Path) -> str:
    """The quantize stage's one refusal line, checked against the manifest's record."""
    assert result.returncode == 3, (result.stdout, result.stderr)
    blocked = json.loads((out / "manifest.json").read_text())["stages"]["quantize"]
    assert blocked["status"] == "blocked" and "\n" not in blocked["missing"] + blocked["how_to_get_it"]
    # the live event names the problem whole; the closing summary says problem and fix in one line
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "cannot run here" in line]
    assert lines and all(blocked["missing"] in line for line in lines), result.stdout
    summary = [line for line in lines if line.startswith("quantize cannot run here: ")]
    assert len(summary) == 1 and summary[0].rstrip().endswith(blocked["how_to_get_it"]), result.stdout
    return summary[0]


@NO_CUDA
@pytest.mark.skipif(not HAVE_DEMO, reason="the embedded demo pair is not installed")
def test_dense_nvfp4_ptq_refuses_in_one_line(tmp_path):
    out = tmp_path / "out"
    result = build(
        "--model", str(DEMO_DIR / "target"), "--drafter", str(DEMO_DIR / "drafter"), "--gpu", "b200", "--quant", "nvfp4", "--out", str(out)
    )
    line = refusal_line(result, out)
    assert "NVFP4 PTQ of the target needs a CUDA GPU" in line and "H100" in line


@NO_CUDA
@pytest.mark.skipif(not HAVE_DEMO, reason="the embedded demo pair is not installed")
def test_nvfp4_drafter_refuses_in_one_line(tmp_path):
    recipe = tmp_path / "drafter-nvfp4.yaml"
    recipe.write_text(
        f"model: {{name: {DEMO_DIR / 'target'}, checkpoint: {DEMO_DIR / 'target'}}}\n"
        f"drafter: {{checkpoint: {DEMO_DIR / 'drafter'}, block_size: 8}}\n"
        "gpu: b200\nbackend: trt\n"
        "quantization: {weights: bf16, kv_cache: bf16, drafter: nvfp4}\n"
        "limits: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}\ntriton: {max_batch_size: 4}\ntrt: {}\n"
    )
    plan = build("--recipe", str(recipe), "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    quantize = next(s for s in json.loads(plan.stdout)["stages"] if s["name"] == "quantize")
    assert "drafter" in quantize["action"] and "fc kept BF16" in quantize["action"] and not quantize["runs_here"]
    out = tmp_path / "out"
    line = refusal_line(build("--recipe", str(recipe), "--out", str(out)), out)
    assert "NVFP4 quantization of the drafter needs a CUDA GPU" in line


@NO_CUDA
def test_gpt_oss_expert_cast_refuses_in_one_line(tmp_path):
    """gpt-oss with `--quant nvfp4` (experts): the quantize stage is the real cast, which needs CUDA for calibration."""
    from trtllm_dflash.builder.pipeline import run_quantize
    from trtllm_dflash.builder.spec import resolve_spec
    from trtllm_dflash.builder.stage_plan import make_build_plan
    from trtllm_dflash.builder.stages import StageBlocked, StageContext

    spec = resolve_spec(model="gpt-oss-120b", gpu="b300", quant="nvfp4")
    assert spec.precision.converts_experts
    quantize = next(s for s in make_build_plan(spec).stages if s.name == "quantize")
    assert "not implemented" not in quantize.where + quantize.action and "needs a CUDA GPU" in quantize.where
    upstream = {"checkpoints": {"summary": {"target": {"path": str(tmp_path / "gpt-oss")}, "drafter": {"path": str(tmp_path / "d")}}}}
    ctx = StageContext(tmp_path / "work", tmp_path, upstream, reporter=None)
    with pytest.raises(StageBlocked) as blocked:
        run_quantize(ctx, spec)
    problem, fix = blocked.value.problem, blocked.value.fix
    assert "\n" not in problem + fix
    assert problem.startswith("converting the MXFP4 experts to NVFP4 (activation scales from calibration) needs a CUDA GPU")
    assert "Blackwell" in fix
    assert not (tmp_path / "work").exists()


def test_trt_export_refuses_nvfp4_naming_what_is_missing():
    from trtllm_dflash.builder.feasibility import export_support
    from trtllm_dflash.builder.spec import resolve_spec

    reason = export_support(resolve_spec(model="qwen3-8b", gpu="b200", quant="nvfp4"))
    assert reason is not None and "\n" not in reason
    assert "no NVFP4 form for the target" in reason and "DequantizeLinear" in reason and "backend: trtllm" in reason
