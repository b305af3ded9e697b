"""The DFlash TensorRT plugins: the ops of `trtllm_dflash.ops` packaged for TensorRT engines.

Imported as `trtllm_dflash.plugins`. The math itself (reference semantics, Triton kernels, the
`dflash::` torch ops, the attention options) is `trtllm_dflash.ops`, which the decoder runs
everywhere; this package holds what only an engine needs: `onnx_nodes` and `dflash2_nodes` (the
ONNX contract with TensorRT and its CPU evaluation, on `node_spec`), `tensorrt_plugins` (the
registration), `aot` (`aot_variants`, `aot_compile`, `aot_build`: ahead-of-time compilation of the
kernels) and `kernel_audit` (the compiler's resource report). Which kernels a recipe needs is the
builder's choice (`builder.kernel_space`). See docs/plugins.md.
"""
