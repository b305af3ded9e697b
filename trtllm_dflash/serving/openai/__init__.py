"""The OpenAI-compatible front end over Triton's async gRPC stream (server.py says what it does).

schemas.py   request bodies (strict types) and OpenAIError (the body of every refusal)
frontend.py  Frontend: discovered models, SamplingParams and prompt checks, translation
triton.py    TritonStream: one request on Triton's async gRPC stream
gate.py      Gate: API key, body bound, in-flight bound, drain
app.py       the FastAPI routes, responses and server-sent events
server.py    OpenAIServer: uvicorn in a thread, draining on shutdown
"""
