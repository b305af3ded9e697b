"""The DFlash TensorRT plugins: KV-injected block attention and tree-free block verification.

Imported as `trtllm_dflash.plugins`. `reference` (with `rng`) defines the semantics in plain torch;
`kernels` holds the Triton kernels; `custom_ops` exposes them as `dflash::` torch ops; `ops` is what
runtimes call (a kernel where one can run, else the reference); `onnx_nodes` is the ONNX contract
with TensorRT; `tensorrt_plugins` and `aot` (`aot_variants`, `aot_compile`, `aot_build`) register and
compile the kernels for TensorRT engines. `attention_options` declares the attention ops' options
(scale, window, sinks) once, for all of these layers.
See docs/plugins.md.
"""
