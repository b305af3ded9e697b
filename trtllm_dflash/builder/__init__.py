"""`dflash-trt build`: from checkpoints to ONNX graphs, TensorRT engines and a Triton repository.

The build is a chain of stages (stages.py), each reading the previous stage's directory and
writing its own under the output directory, with a manifest (manifest.py). spec, stage_plan,
feasibility, stages, manifest and pipeline import no torch; the modules of the stages (quantize, fp8, export,
validate, engines) are imported only when their stage runs, so planning a build (`--dry-run`)
is instant on any machine.

    spec.py           the recipe (trtllm_dflash.recipes) with command-line overrides, planner-checked
    stage_plan.py     the build's stages on this machine: where each runs, output sizes (no torch import)
    feasibility.py    what can run, decided once for the stage plan and the stages; the build's backend
    stages.py         atomic, skippable stage directories
    manifest.py       hashes, tool versions, atomic JSON
    pipeline.py       the stages of a build, in order, and manifest.json
    quantize.py       ModelOpt FP8 / NVFP4 (loading their checkpoints: trtllm_dflash/checkpoints/modelopt.py)
    fp8.py            FP8 linear layers (modeling/fp8_linear.py) as Q/DQ ONNX
    export.py         ONNX export of the graph modules (trtllm_dflash.graphs) and graphs.json
    plugin_graphs.py  the plugin graph variant (the plugins part's ONNX nodes)
    validate.py       the graphs on CPU against the torch runtime
    engines.py        TensorRT / TensorRT-RTX engines
    lossless_gate.py  the GPU CI losslessness gate over built engines
"""
