"""Helpers the test modules share (`from support import cli`): one copy instead of one per file, so
no test module imports another.

pytest puts tests/ on sys.path (no __init__.py: rootdir-relative imports), so this is a plain module.
Fixtures defined here count in a module that imports them, with the scope written here (a
module-scoped server is one server per importing module).

The command line three ways: `invoke` / `cli` run the Typer app, so a test sees the exception
itself; `conftest.run_main` runs `main()`, which turns a DFlashError into one line and exit 2;
`run_cli` runs `dflash-trt` in a child process, as a user does.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import random
import subprocess
import sys
import threading
import time
import types
import typing
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import torch
from typer.testing import CliRunner


def invoke(*args: str):
    """`dflash-trt ARGS` through Typer's test runner: the Result, exceptions caught into it."""
    from trtllm_dflash.cli.app import app

    return CliRunner().invoke(app, list(args))


def cli(*args: str) -> str:
    """`dflash-trt ARGS`, which must succeed; its output."""
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


def run_cli(*args: str, env: dict | None = None, columns: int = 200) -> subprocess.CompletedProcess:
    """`dflash-trt ARGS` in a child process, offline, as a user runs it (tests of the command line).
    The entry point is imported here, so a renamed `cli.app` fails at import, not in the child."""
    from trtllm_dflash.cli import app as entry

    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": str(columns), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", f"from {entry.__name__} import main; main()", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The single `error: ...` line of a refused command (exit 2); fails on anything else."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ---------------------------------------------------------------------- repositories and servers


def write_repository(
    out: Path,
    model: str = "demo",
    drafter: str | None = None,
    *,
    max_context: int,
    max_tokens: int,
    max_batch: int = 4,
    baseline: bool = True,
) -> Path:
    """`dflash-trt repo` for a test's server: its limits, one decoding thread per model; without the
    autoregressive baseline (`baseline=False`) the server starts one Python stub, not two."""
    args = ["repo", "--model", model, *(["--drafter", drafter] if drafter else []), *([] if baseline else ["--baseline", ""])]
    cli(
        *args,
        "--out",
        str(out),
        "--max-context",
        str(max_context),
        "--max-tokens",
        str(max_tokens),
        "--max-batch",
        str(max_batch),
        "--threads",
        "1",
    )
    return out


@contextlib.contextmanager
def triton_server(repo, **options) -> Iterator:
    """A started TritonServer on free loopback ports (`options`: TritonServer's own, e.g. a shorter
    startup_timeout). On exit, nothing of its process group (tritonserver, the backend stubs) is left."""
    from trtllm_dflash.serving.server import TritonServer, free_port, process_group_members

    options = {"host": "127.0.0.1", "startup_timeout": 600, **options}
    with TritonServer(repo, free_port(), free_port(), free_port(), **options) as running:
        group = running.process.pid
        yield running
    assert process_group_members(group) == []


@contextlib.contextmanager
def supervised_server(repo) -> Iterator:
    """A TritonServer run as `dflash-trt serve` runs it: supervise() (with its probe) in a thread,
    its log lines in `supervision_log` and what made it give up in `supervision_errors`. On exit:
    supervision has ended without an error and nothing of the server is left (processes, /dev/shm)."""
    from trtllm_dflash.serving.server import TritonServer, free_port, process_group_members

    server = TritonServer(repo, free_port(), free_port(), free_port(), host="127.0.0.1", startup_timeout=600)
    server.start()
    server.supervision_log, server.supervision_errors, stop = [], [], threading.Event()

    def supervise() -> None:
        try:
            server.supervise(log=server.supervision_log.append, stop_event=stop, poll=0.2)
        except Exception as exc:  # noqa: BLE001 - reported on exit
            server.supervision_errors.append(exc)

    thread = threading.Thread(target=supervise, name="supervise", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(120)
        group = server.process.pid if server.process is not None else None
        server.stop()
    assert not thread.is_alive() and not server.supervision_errors, server.supervision_errors
    assert server.shm_files() == []  # a stopped server leaves nothing in /dev/shm
    if group is not None:
        assert process_group_members(group) == []


def wait_serving(server, timeout: float = 300) -> None:
    """Until the server answers on HTTP and gRPC (a hang bound); call it first in a test whose module
    server a test before may have restarted. Full runs twice found such a server refusing gRPC
    right after the test before had a generate answered over HTTP (not understood, not reproduced
    alone): the assertion prints what supervision did."""
    from trtllm_dflash.serving.server import _grpc_ready

    deadline = time.monotonic() + timeout
    while not (server.ready() and _grpc_ready(server.endpoints.grpc, server.models)):
        assert time.monotonic() < deadline, f"not serving on HTTP and gRPC after {timeout} s: {server.supervision_log}"
        time.sleep(0.2)


# ---------------------------------------------------------------------- the served pair (test_serving, test_serving_hostile)

MAX_CONTEXT = 256
MAX_TOKENS = 200  # long enough that a stream is still running when test_serving_hostile kills the model
PROMPTS = ["def fibonacci(n):", "import os\nfor name in", "class Stack:\n    def push(self, item):", "x = [i * i for i in"]


def _demo_present() -> bool:
    from trtllm_dflash.demo import DEMO_DIR

    return (DEMO_DIR / "target" / "config.json").is_file() and (DEMO_DIR / "drafter" / "config.json").is_file()


@pytest.fixture(scope="module", params=["demo" if _demo_present() else "tiny"])
def pair(request, tmp_path_factory):
    """(target, drafter) as the CLI names them: the embedded demo pair when it is present, else a
    tiny random pair with a character tokenizer (the test ids say which)."""
    if request.param == "demo":
        return "demo", "demo"
    from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("served-pair")
    target = make_tiny_target(root / "target", seed=11, tokenizer=True)
    drafter = make_tiny_drafter(root / "drafter", target, seed=12, mask_token_id=2, block_size=8)
    return str(target), str(drafter)


@pytest.fixture(scope="module")
def repo(pair, tmp_path_factory):
    """`pair`'s repository: 16 rows, MAX_CONTEXT and MAX_TOKENS."""
    target, drafter = pair
    out = tmp_path_factory.mktemp("repo") / "repository"
    if target == "demo":
        return write_repository(out, max_context=MAX_CONTEXT, max_tokens=MAX_TOKENS, max_batch=16)
    return write_repository(out, target, drafter, max_context=MAX_CONTEXT, max_tokens=MAX_TOKENS, max_batch=16)


def concurrent_completions(client, prompts: list[str], lengths: list[int]) -> dict:
    """Every prompt as its own stream, all released at once (odd ones over gRPC, even ones over
    HTTP), each with its max_tokens: request index -> Completion. Fails with every request's error."""
    results, errors = {}, []
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = client.complete(prompts[i], protocol="grpc" if i % 2 else "http", max_tokens=lengths[i])
        except Exception as exc:  # noqa: BLE001
            errors.append(f"request {i}: {exc}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert not errors, errors
    return results


def post(server, model: str, body: dict) -> tuple[int, dict]:
    """Triton's HTTP generate: (status, answer), an error status answered too."""
    request = urllib.request.Request(
        f"{server.endpoints.http}/v2/models/{model}/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# ---------------------------------------------------------------------- a batching loop in this process


class RecordingSink:
    """A serving loop's response sink (served_model/batching_loop.py `ResponseSink`) that keeps what it is sent.

    `leave_after`: the client goes away once it has that many responses; `raise_errors`: an error
    fails the test at once instead of being kept in `errors`.
    """

    def __init__(self, leave_after: int | None = None, raise_errors: bool = False) -> None:
        self.responses: list[tuple[dict, bool]] = []
        self.errors: list[str] = []
        self.leave_after, self.raise_errors = leave_after, raise_errors

    @property
    def finished(self) -> bool:
        return bool(self.responses) and self.responses[-1][1]

    def send(self, outputs: dict, final: bool) -> None:
        self.responses.append((outputs, final))

    def error(self, message: str) -> None:
        if self.raise_errors:
            raise AssertionError(message)
        self.errors.append(message)

    def cancelled(self) -> bool:
        return self.leave_after is not None and len(self.responses) >= self.leave_after


def serve_until(loop, done, timeout: float = 120.0) -> None:
    """Run a BatchingLoop's thread until `done()` holds (or `timeout` seconds, a bound that only catches a hang)."""
    loop.start()
    try:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        loop.stop()


# ---------------------------------------------------------------------- references written from the spec


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """The target's own greedy tokens (transformers' generate): what lossless decoding must equal."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def rms(x, weight, eps=1e-6):
    """RMSNorm, as the drafter's spec writes it."""
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, positions, theta):
    """Rotary embedding (rotate-half), in float64, as the drafter's spec writes it."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.double().unsqueeze(-1) * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos().unsqueeze(-2), torch.cat([angles, angles], -1).sin().unsqueeze(-2)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


# ---------------------------------------------------------------------- sampling against the exact distribution

SMALL_VOCAB = 8  # small enough to enumerate every 3-token continuation
SAMPLING_PROMPT = [1, 2, 3]
SAMPLES = 3000


def exact_distribution(target_dir, temperature, top_k, top_p) -> dict[tuple[int, ...], float]:
    """P(t1, t2, t3) of the target's own sampling, by enumerating every prefix."""
    from trtllm_dflash.checkpoints import load_target
    from trtllm_dflash.ops import reference

    model = load_target(target_dir).model
    params = [torch.tensor([v]) for v in (temperature, top_k, top_p)]

    def next_probs(prefixes):
        with torch.no_grad():
            logits = model(torch.tensor([SAMPLING_PROMPT + list(p) for p in prefixes])).logits[:, -1]
        rows = logits.shape[0]
        return reference.process_logits(logits, *(p.expand(rows) for p in params)).double()

    joint = {(): 1.0}
    for _ in range(3):
        prefixes = list(joint)
        probs = next_probs(prefixes)
        joint = {
            prefix + (token,): joint[prefix] * float(probs[i, token]) for i, prefix in enumerate(prefixes) for token in range(SMALL_VOCAB)
        }
    return joint


def sample_speculatively(target_dir, drafter_dir, temperature, top_k, top_p) -> list[tuple[int, ...]]:
    """SAMPLES seeded requests of 3 tokens, decoded speculatively in one batch."""
    from trtllm_dflash import DFlashPipeline
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams

    pipe = DFlashPipeline.load(target_dir, drafter_dir, max_context=16)
    decoder = Decoder(pipe.runtime, max_batch=SAMPLES, max_context=16)
    requests = [
        Request(SAMPLING_PROMPT, SamplingParams(max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))
        for seed in range(SAMPLES)
    ]
    results = decoder.generate(requests)
    accepted_drafts = sum(max(r.acceptance_lengths) > 1 for r in results)
    assert 0 < accepted_drafts < SAMPLES  # both acceptance and rejection paths are exercised
    return [tuple(r.token_ids) for r in results]


def chi2_pvalue(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float], positions) -> float:
    """Chi-square p-value of the marginal over `positions`, small cells merged (expected < 5)."""
    from scipy.stats import chisquare

    expected: dict[tuple, float] = {}
    for seq, prob in exact.items():
        key = tuple(seq[i] for i in positions)
        expected[key] = expected.get(key, 0.0) + prob * len(samples)
    observed = {key: 0 for key in expected}
    for seq in samples:
        observed[tuple(seq[i] for i in positions)] += 1
    impossible = [k for k in expected if expected[k] == 0]
    assert sum(observed[k] for k in impossible) == 0  # nothing outside the top-k / top-p support
    expected = {k: v for k, v in expected.items() if v > 0}
    big = [k for k in expected if expected[k] >= 5]
    small = [k for k in expected if expected[k] < 5]
    obs = [observed[k] for k in big] + ([sum(observed[k] for k in small)] if small else [])
    exp = [expected[k] for k in big] + ([sum(expected[k] for k in small)] if small else [])
    total = sum(exp)
    return float(chisquare(obs, [e * len(samples) / total for e in exp]).pvalue)


# ---------------------------------------------------------------------- target-attention cases and tolerances

# per dtype: Triton's CPU interpreter against the reference, and the compiled kernels on a GPU
INTERPRETER_TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
GPU_TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def block_attention_case(seed, batch, block, heads, kv_heads, head_dim, dtype, capacity=48, max_new=6, cache_dtype=None):
    """Random ragged inputs: per-row cache lengths (some empty) and new-row counts (some zero)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(dt)

    cache_dtype = cache_dtype or dtype
    new_counts = torch.randint(0, max_new + 1, (batch,), generator=g)
    cache_lens = torch.randint(0, capacity - max_new - 1, (batch,), generator=g)
    cache_lens[0], new_counts[-1] = 0, 0  # an empty cache and a step without new context
    return dict(
        q=rand(batch, block, heads, head_dim),
        k_block=rand(batch, block, kv_heads, head_dim),
        v_block=rand(batch, block, kv_heads, head_dim),
        k_ctx_new=rand(batch, max_new, kv_heads, head_dim),
        v_ctx_new=rand(batch, max_new, kv_heads, head_dim),
        new_counts=new_counts,
        k_cache=rand(batch, capacity, kv_heads, head_dim, dt=cache_dtype),
        v_cache=rand(batch, capacity, kv_heads, head_dim, dt=cache_dtype),
        cache_lens=cache_lens,
        scale=head_dim**-0.5,
    )


def target_attention_case(
    seed, batch=3, tokens=4, heads=4, kv_heads=2, key_dim=64, value_dim=64, capacity=48, dtype=torch.float32, cache_dtype=None, starts=None
):
    """Random ragged rows: one starting at 0 (empty prefix), the others anywhere that fits the block."""
    g = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(dt)

    if starts is None:
        starts = torch.randint(0, capacity - tokens + 1, (batch,), generator=g)
        starts[0] = 0
    return dict(
        q=rand(batch, tokens, heads, key_dim),
        k_new=rand(batch, tokens, kv_heads, key_dim),
        v_new=rand(batch, tokens, kv_heads, value_dim),
        k_cache=rand(batch, capacity, kv_heads, key_dim, dt=cache_dtype),
        v_cache=rand(batch, capacity, kv_heads, value_dim, dt=cache_dtype),
        starts=torch.as_tensor(starts, dtype=torch.int64),
    )


def target_case_past_capacity(batch, tokens, heads, kv_heads, key_dim, value_dim, capacity, dtype, seed=0):
    """Ragged rows: one at position 0, the others anywhere a block fits, one running past the capacity."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, capacity - tokens, (batch,), generator=g)
    starts[0], starts[-1] = 0, capacity - tokens // 2
    return dict(
        q=torch.randn(batch, tokens, heads, key_dim, generator=g).to(dtype),
        k_new=torch.randn(batch, tokens, kv_heads, key_dim, generator=g).to(dtype),
        v_new=torch.randn(batch, tokens, kv_heads, value_dim, generator=g).to(dtype),
        k_cache=torch.randn(batch, capacity, kv_heads, key_dim, generator=g).to(dtype),
        v_cache=torch.randn(batch, capacity, kv_heads, value_dim, generator=g).to(dtype),
        starts=starts,
    )


def clone(case):
    """A case's tensors copied: the op writes its caches in place."""
    return {k: v.clone() for k, v in case.items()}


# ---------------------------------------------------------------------- a stand-in for tensorrt.plugin (TensorRT does not install on CPU)


class TensorDesc:
    """A TensorRT tensor descriptor with integer shapes."""

    def __init__(self, shape, dtype):
        self.shape_expr, self.dtype = tuple(shape), dtype

    def like(self):
        return TensorDesc(self.shape_expr, self.dtype)

    def aliased(self):
        desc = self.like()
        desc.alias_of = self
        return desc


def fake_tensorrt():
    """(tensorrt, tensorrt.plugin) stand-ins that check what TensorRT checks at registration: node
    inputs as TensorDesc, then typed attributes; the aot_impl taking the same names plus outputs and tactic."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.13.0"
    for name in ("float32", "float16", "bfloat16", "fp8", "int32", "int64"):
        setattr(trt, name, name)
    trtp = types.ModuleType("tensorrt.plugin")
    trtp.TensorDesc = TensorDesc
    trtp.registered, trtp.aot = {}, {}

    def register(plugin_id):
        def decorate(fn):
            tensors, fields = [], {}
            for name, param in inspect.signature(fn).parameters.items():  # what TensorRT checks
                assert inspect.isclass(param.annotation), f"{plugin_id}: {name} is annotated {param.annotation!r}, not a class"
                assert param.default is inspect.Parameter.empty, f"{plugin_id}: {name} has a default"
                if issubclass(param.annotation, TensorDesc):
                    assert not fields, f"{plugin_id}: tensor {name} after the attributes"
                    tensors.append(name)
                else:
                    assert param.annotation in (int, float, bytes, bool, str), f"{plugin_id}: {name}"
                    fields[name] = param.annotation
            returns = inspect.signature(fn).return_annotation
            outputs = typing.get_args(returns) if typing.get_origin(returns) is tuple else (returns,)
            assert all(o is TensorDesc for o in outputs), f"{plugin_id}: returns {returns!r}"
            trtp.registered[plugin_id] = (fn, tensors, fields, len(outputs))
            return fn

        return decorate

    def aot_impl(plugin_id):
        def decorate(fn):
            _, tensors, fields, _ = trtp.registered[plugin_id]
            assert list(inspect.signature(fn).parameters) == [*tensors, *fields, "outputs", "tactic"], plugin_id
            trtp.aot[plugin_id] = fn
            return fn

        return decorate

    class KernelLaunchParams:
        pass

    trtp.register, trtp.aot_impl, trtp.KernelLaunchParams = register, aot_impl, KernelLaunchParams
    trtp.SymIntExprs = lambda n: [None] * n
    trtp.SymInt32 = lambda value: value
    trtp.from_shape_expr = lambda shape, dtype: TensorDesc(shape, dtype)
    trt.plugin = trtp
    return trt, trtp


@contextlib.contextmanager
def shuffled_programs(seed: int):
    """Triton's interpreter runs each launch's programs in a random order (seeded), as a GPU may: the
    k-th program it runs gets the k-th grid index of a shuffled list (it runs them in grid order
    otherwise). For kernels whose last program of a tile finishes it. Reaches into the
    interpreter's builder (pinned in requirements.lock, as tests/test_launch_count.py does)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    order, rng = [], random.Random(seed)

    def grid_dim(x, y, z):
        order[:] = [(i, j, k) for i in range(x) for j in range(y) for k in range(z)]
        rng.shuffle(order)
        set_dim(x, y, z)

    def grid_idx(x, y, z):
        set_idx(*order.pop())

    builder.set_grid_dim, builder.set_grid_idx = grid_dim, grid_idx
    try:
        yield
    finally:
        del builder.set_grid_dim, builder.set_grid_idx
