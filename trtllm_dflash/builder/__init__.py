"""`dflash-trt build`: from checkpoints to ONNX graphs, TensorRT engines and a Triton repository.

The build is a chain of stages (stages.py), each reading the previous stage's directory and
writing its own under the output directory, with a manifest (manifest.py). Every module here
imports torch, ModelOpt, ONNX or TensorRT lazily, inside the stage that needs it, so planning a
build (`--dry-run`) is instant on any machine.

    spec.py       the resolved recipe: model x GPU x precision, with plan-time refusals
    catalog.py    the GPUs and models the planner knows (until the recipes issue provides them)
    plan.py       what will run, where, and how big it is
    stages.py     atomic, skippable stage directories
    manifest.py   hashes and tool versions
    pipeline.py   the stages of a build, in order
    quantize.py   ModelOpt FP8 / NVFP4
    export.py     ONNX graphs of the target and the drafter
    validate.py   the graphs evaluated on CPU against the torch runtime
    engines.py    TensorRT / TensorRT-RTX engines
    trtllm.py     the TensorRT-LLM configuration for the `trtllm` runtime
"""
