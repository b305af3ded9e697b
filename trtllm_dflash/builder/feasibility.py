"""What a build can do, decided once: the stage plan (`--dry-run`) and the stages themselves ask here.

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


def needs_expert_conversion(spec: BuildSpec) -> bool:
    """Published MXFP4 experts asked for as NVFP4: ModelOpt casts the weights and calibrates the
    activation scales (a CUDA GPU; builder/nvfp4.py)."""
    return spec.recipe.model_spec().native_expert_precision == "mxfp4" and spec.experts == "nvfp4" and not spec.quantized


def quantizes_drafter(spec: BuildSpec) -> bool:
    """`quantization.drafter: nvfp4`: the quantize stage also calibrates the drafter (fc kept BF16)."""
    return spec.drafter_quant == "nvfp4"


def has_quantize_work(spec: BuildSpec) -> bool:
    """Whether the quantize stage runs ModelOpt at all (else it records that nothing was needed)."""
    return spec.quantized or needs_expert_conversion(spec) or quantizes_drafter(spec)


def validation_skip_reason(spec: BuildSpec) -> str | None:
    """Why the CPU check of the graphs is skipped (a target too large for it), or None when it runs."""
    params = spec.recipe.model_spec().params().total
    if params <= CPU_VALIDATION_MAX_PARAMS:
        return None
    return (f"skipped: a {params / 1e9:.1f}B-parameter target is too large to evaluate on CPU here; "
            "the GPU losslessness gate (docs/build.md) checks the engines instead")


def repository_writer():
    """The serving part's repository module, when it is installed (the repository stage is optional)."""
    try:
        from trtllm_dflash.serving import repository
    except ImportError:
        return None
    return repository
