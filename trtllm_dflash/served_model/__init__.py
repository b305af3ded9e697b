"""What one served model is and runs: its repository files, config.pbtxt parameters, wire protocol,
batching loop, metrics and detokenizer.

    model_parameters.py  ServingConfig: one served model's config.pbtxt parameters (checkpoints/engines, backend, limits)
    protocol.py          the wire format: LLM-API style inputs/outputs, request bodies, Triton input names
    repository.py        writing a repository of Python-backend models, from a model or a recipe
    batching_loop.py     BatchingLoop: the in-flight batching loop over one opened pipeline (no Triton imports)
    metrics.py           Prometheus custom metrics, and reading them back
    detokenizer.py       the loop's incremental text and stop strings

It sits in the backends layer, below serving/: the backends write their repositories with it and run
its BatchingLoop with the pipeline they open (backends/triton_model.py), and nothing here imports
trtllm_dflash.backends or trtllm_dflash.serving.
"""
