"""Serving DFlash with Triton Inference Server (docs/serving.md).

    model_parameters.py  ServingConfig: one served model's config.pbtxt parameters (checkpoints/engines, backend, limits)
    protocol.py          the wire format: LLM-API style inputs/outputs, request bodies, Triton input names
    repository.py        writing a repository of Python-backend models, from a model or a recipe
    batching_loop.py     BatchingLoop: the in-flight batching loop over one opened pipeline (no Triton imports)
    metrics.py           Prometheus custom metrics, and reading them back
    server.py            launching tritonserver (NVIDIA container or nvidia-pytriton's binary)
    client.py            HTTP generate / generate_stream and gRPC streaming client
    openai/              the OpenAI-compatible front end over Triton's async gRPC stream: schemas,
                         frontend (checks, translation), triton (the stream), gate, app, server

The Python-backend glue around the loop (TritonPythonModel) is backends/triton_model.py: it picks the
backend and opens the pipeline, and nothing here imports trtllm_dflash.backends.
"""

# Loopback unless the user opens the server deliberately (--host 0.0.0.0): the demo and a
# fresh `serve` must not expose an unauthenticated inference endpoint to the network.
DEFAULT_HOST = "127.0.0.1"
