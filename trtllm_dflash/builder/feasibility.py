"""What a build can do, decided once: the stage plan (`--dry-run`) and the stages themselves ask here.

What it quantizes and how is not decided here but asked of the spec's precision
(`spec.precision`, trtllm_dflash.recipes.precision): `needs_modelopt` (the quantize stage has work),
`converts_experts` (gpt-oss's MXFP4 experts cast to NVFP4), `quantizes_drafter`, `quantized`.

No torch import: `dflash-trt build --dry-run` reads these answers on any machine.
"""

from __future__ import annotations

from trtllm_dflash.backends import Backend, get_backend
from trtllm_dflash.builder.spec import BuildSpec

# Above this many target parameters the CPU check of the graphs is skipped (and recorded): the
# float32 reference and the graph together need several times the weights in RAM.
CPU_VALIDATION_MAX_PARAMS = 3e9


def backend_of(spec: BuildSpec) -> Backend:
    """The deployment backend the build is for."""
    return get_backend(spec.backend)


def export_support(spec: BuildSpec) -> str | None:
    """None when the target's graphs can be exported at this precision, else why not."""
    which = spec.precision.nvfp4_export_gap
    if which is not None:
        return (
            f"the ONNX export has no NVFP4 form for the {which} (FLOAT4E2M1 weights with blocked E4M3 DequantizeLinear "
            "and a per-tensor scale are not written, so TensorRT would get no FP4 GEMMs); "
            "deploy NVFP4 with backend: trtllm, or use --quant fp8/bf16 and a bf16 drafter for trt engines"
        )
    return None


def validation_skip_reason(spec: BuildSpec) -> str | None:
    """Why the CPU check of the graphs is skipped (a target too large for it), or None when it runs."""
    params = spec.recipe.model_spec().params().total
    if params <= CPU_VALIDATION_MAX_PARAMS:
        return None
    return (
        f"skipped: a {params / 1e9:.1f}B-parameter target is too large to evaluate on CPU here; "
        "the GPU losslessness gate (docs/build.md) checks the engines instead"
    )


def repository_writer():
    """The serving part's repository module, when it is installed (the repository stage is optional)."""
    try:
        from trtllm_dflash.served_model import repository
    except ImportError:
        return None
    return repository
