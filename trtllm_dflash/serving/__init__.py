"""Serving DFlash with Triton Inference Server (docs/serving.md).

    server.py            launching tritonserver (NVIDIA container or nvidia-pytriton's binary)
    server_watch.py      watching a running tritonserver: its process group, crashes, the request it died on
    triton_access.py     who may reach the launched tritonserver
    client.py            HTTP generate / generate_stream and gRPC streaming client
    openai/              the OpenAI-compatible front end over Triton's async gRPC stream: schemas,
                         frontend (checks, translation), triton (the stream), gate, app, server

What one served model is and runs (its repository, config.pbtxt parameters, wire protocol, batching
loop, metrics, detokenizer) is trtllm_dflash.served_model, a layer below. The Python-backend glue
around the loop (TritonPythonModel) is backends/triton_model.py: it picks the backend and opens the
pipeline.
"""

# Loopback unless the user opens the server deliberately (--host 0.0.0.0): the demo and a
# fresh `serve` must not expose an unauthenticated inference endpoint to the network.
DEFAULT_HOST = "127.0.0.1"
