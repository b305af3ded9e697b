"""The DFlash TensorRT plugins: KV-injected block attention and tree-free block verification.

Imported as `trtllm_dflash.plugins`. `reference` defines the semantics in plain torch; `ops`
is what runtimes call (it picks a compiled kernel where one can run, else the reference).
"""
