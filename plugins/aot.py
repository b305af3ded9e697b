"""Ahead-of-time compilation of the plugin kernels for the deployment GPUs, without a GPU.

One name for the three steps, each in its own module:
- `aot_variants`: the kernel variants a kernel space holds (`kernel_variants`, `KernelSpace`; a
  recipe's space is chosen by `builder.kernel_space`);
- `aot_compile`: the deployment targets (`ARCHES`) and the compilation of one variant for one of
  them, with the oldest PTX ISA that supports it and TensorRT's kernel ABI (`compile_kernel`);
- `aot_build`: many variants for many targets through a cache and a process pool, into a directory
  with a manifest (`build`, `load_manifest`).

`dflash-trt plugins build`, the engine builder and `tensorrt_plugins` use the names below.
"""

from __future__ import annotations

from trtllm_dflash.plugins.aot_build import (  # noqa: F401
    CACHE_FORMAT,
    DEFAULT_CACHE_DIR,
    BuildStats,
    KernelCache,
    build,
    cache_key,
    check_output_dir,
    load_manifest,
    manifest_entry,
    source_digest,
)
from trtllm_dflash.plugins.aot_compile import (  # noqa: F401
    ALIASES,
    ARCHES,
    MIN_TENSORRT,
    Arch,
    CompiledKernel,
    assemble,
    compile_kernel,
    parse_arches,
    strip_scratch_params,
)
from trtllm_dflash.plugins.aot_variants import (  # noqa: F401
    PRECISION_DTYPES,
    TORCH_TO_TRITON,
    KernelSpace,
    KernelVariant,
    attention_variants,
    commit_variant,
    dflash2_conv_variant,
    dflash2_select_variant,
    dflash2_topk_merge_variant,
    dflash2_topk_partials_variant,
    dflash2_variants,
    kernel_variants,
    query_tiles,
    target_attention_split_variant,
    target_attention_variant,
    target_merge_variant,
    target_query_tiles,
    verify_partials_variant,
    verify_variants,
)
