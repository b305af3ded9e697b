"""Shared fixtures: tiny random checkpoints written to disk in the real layouts."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config, items):
    _start_kernel_audit(config, items)
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow test: run with --runslow (make test-all)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


def _start_kernel_audit(config, items) -> None:
    """The kernel audit (tests/test_kernel_audit.py) compiles every kernel variant for two GPU
    targets: minutes of single-threaded compiler work. The suite runs torch on one thread, so the
    audit runs beside it, in a background process started here, and its tests go last.

    Under pytest-xdist every worker collects every test, and the audit's tests go to whichever
    worker takes their file: the first worker (gw0) alone starts the audit, in a folder named by
    the run, and the fixture of any worker waits for its exit status there."""
    import importlib.util

    audit_items = [item for item in items if "kernel_audit_reports" in getattr(item, "fixturenames", ())]
    if not audit_items or importlib.util.find_spec("triton") is None:
        return
    items[:] = [item for item in items if item not in audit_items] + audit_items
    import shlex
    import subprocess
    import tempfile
    from pathlib import Path

    worker, run = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_TESTRUNUID")
    folder = Path(tempfile.gettempdir()) / f"kernel-audit-{run}" if worker else Path(tempfile.mkdtemp(prefix="kernel-audit-"))
    config._kernel_audit = folder
    if worker not in (None, "gw0"):
        return
    folder.mkdir(exist_ok=True)
    audit = [
        sys.executable,
        "-m",
        "trtllm_dflash.plugins.kernel_audit",
        "--arch",
        "sm_90a,sm_100a",
        "--json",
        str(folder / "reports.json"),
        "--jobs",
        "1",
    ]
    status = shlex.quote(str(folder / "status"))
    script = f"{shlex.join(audit)} > {shlex.quote(str(folder / 'audit.log'))} 2>&1; echo $? > {status}.tmp; mv {status}.tmp {status}"
    config._kernel_audit_process = subprocess.Popen(["/bin/sh", "-c", script])


def pytest_sessionfinish(session):
    running = getattr(session.config, "_kernel_audit_process", None)
    if running is not None and running.poll() is None and not os.environ.get("PYTEST_XDIST_WORKER"):
        running.kill()  # serial run: nothing else waits for it (under xdist another worker may)


@pytest.fixture(scope="session")
def kernel_audit_reports(request):
    """Every kernel variant's compiler report for sm_90a and sm_100a (`plugins/kernel_audit.py`)."""
    pytest.importorskip("triton")
    import time

    from trtllm_dflash.plugins import kernel_audit

    folder = request.config._kernel_audit
    deadline = time.monotonic() + 1800
    while not (folder / "status").is_file():
        assert time.monotonic() < deadline, f"the kernel audit did not finish in 30 minutes (log: {folder / 'audit.log'})"
        time.sleep(1)
    code = int((folder / "status").read_text())  # written whole: moved into place once complete
    assert code == 0, f"the kernel audit failed:\n{(folder / 'audit.log').read_text()[-4000:]}"
    return kernel_audit.read_reports(folder / "reports.json")


@pytest.fixture
def run_main(monkeypatch, capsys):
    """`run_main(*args)` runs `dflash-trt ARGS` through the real entry point in this process
    (main() turns a DFlashError into one line and exit 2); returns (exit code, stdout, stderr)."""
    from trtllm_dflash.cli.app import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["dflash-trt", *args])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(autouse=True, scope="session")
def _quiet_transformers():
    import torch
    import transformers

    # Tests run tiny, overhead-bound models: one thread is faster, and two OpenMP threads
    # competing with any other process on a 2-core machine run 5-40x slower.
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    from trtllm_dflash.testing.tiny import make_tiny_target

    return make_tiny_target(tmp_path_factory.mktemp("qwen3-target"), "qwen3", seed=1)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    from trtllm_dflash.testing.tiny import make_tiny_target

    return make_tiny_target(tmp_path_factory.mktemp("llama-target"), "llama", seed=2)


@pytest.fixture(scope="session")
def tiny_qwen3_drafter(tmp_path_factory, tiny_qwen3):
    from trtllm_dflash.testing.tiny import make_tiny_drafter

    return make_tiny_drafter(tmp_path_factory.mktemp("qwen3-drafter"), tiny_qwen3, seed=3, block_size=8)


@pytest.fixture(scope="session")
def demo_triton(tmp_path_factory):
    """One tritonserver on a small demo repository (max context 512, 256 new tokens, batch 4, with
    the autoregressive baseline) for the test modules that only need a server to talk to (min_tokens,
    chat templates, spec stats, structured output, tenancy, bench): each started its own (~12 s of
    repository writing and start-up apiece on the 2-core machine). A module that kills, restarts or
    reconfigures its server, or needs other limits, starts its own (support.triton_server)."""
    from support import triton_server, write_repository

    repo = write_repository(tmp_path_factory.mktemp("demo-triton") / "repository", max_context=512, max_tokens=256)
    with triton_server(repo) as running:
        yield running


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory):
    """One `dflash-trt build --model demo --gpu rtx-pro-6000` per session (~45 s: export, validate,
    TensorRT-RTX engines ahead of time). Tests copy it: a copy is a complete build, where rerunning
    the same command skips every stage (tests/test_build_engines.py checks that)."""
    from filelock import FileLock
    from typer.testing import CliRunner

    from trtllm_dflash.cli.app import app

    def build(out: Path) -> None:
        result = CliRunner().invoke(app, ["build", "--model", "demo", "--gpu", "rtx-pro-6000", "--out", str(out)], catch_exceptions=True)
        assert result.exit_code == 0, (result.output, result.exception)

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.mktemp("demo-build") / "out"
        build(out)
        return out
    # pytest-xdist: one build for all workers, in the run's shared temporary folder (the first worker
    # that needs it builds, under a lock; the others wait and read the same build)
    shared = tmp_path_factory.getbasetemp().parent / "demo-build"
    with FileLock(str(shared) + ".lock"):
        if not (shared / "complete").is_file():
            shutil.rmtree(shared, ignore_errors=True)
            build(shared / "out")
            (shared / "complete").touch()
    return shared / "out"


@pytest.fixture(scope="session")
def trained_pair(tmp_path_factory):
    """(target_dir, drafter_dir, prompts): a tiny pair whose drafter proposes the target's tokens."""
    import torch

    from trtllm_dflash.testing.tiny import cycle_sequences, make_cycle_pair

    target_dir, drafter_dir = make_cycle_pair(tmp_path_factory.mktemp("cycle-pair"), block_size=8)
    prompts = cycle_sequences(4, 14, torch.Generator().manual_seed(123)).tolist()
    prompts[1] = prompts[1][:9]  # different prompt lengths in the batch
    return target_dir, drafter_dir, prompts


@pytest.fixture(scope="session")
def hybrid_trained_pair(tmp_path_factory):
    """(target_dir, drafter_dir): trained_pair's recipe on a Qwen3.5-style hybrid target (Gated DeltaNet
    + full attention), with the character tokenizer, so it can be served with text."""
    from trtllm_dflash.testing.tiny import make_cycle_pair

    target_dir, drafter_dir = make_cycle_pair(tmp_path_factory.mktemp("hybrid-pair"), block_size=8, family="qwen3_5", tokenizer=True)
    return target_dir, drafter_dir


@pytest.fixture(scope="module")
def dense(trained_pair):
    """trained_pair on the torch runtime, float32 (one per test module: its caches are the module's)."""
    import torch

    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    target_dir, drafter_dir, _ = trained_pair
    target = load_target(target_dir, dtype=torch.float32)
    return TorchRuntime(target.model, load_drafter(drafter_dir, target))


@pytest.fixture(scope="module")
def hybrid(hybrid_trained_pair):
    """hybrid_trained_pair on the torch runtime, float32."""
    import torch

    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    target_dir, drafter_dir = hybrid_trained_pair
    target = load_target(target_dir, dtype=torch.float32)
    runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target))
    assert runtime.is_hybrid
    return runtime


@pytest.fixture
def rerun_graphs(monkeypatch):
    """CUDA-graph replay (runtime/cuda_graphs.py) on CPU, with `capture` swapped for a stand-in
    whose replay re-runs the pass into the first run's output buffers: checks the bookkeeping
    around the graphs (static buffers, padding rows, span buckets, eager fallbacks), not a graph."""
    from trtllm_dflash.runtime import cuda_graphs
    from trtllm_dflash.runtime.base import TargetOutput

    def tensors(outputs):
        if isinstance(outputs, TargetOutput):
            return [t for t in (outputs.logits, outputs.features) if t is not None]
        return [outputs]

    def rerun_capture(run, pool):
        outputs = run()

        def replay():
            for static, fresh in zip(tensors(outputs), tensors(run())):
                static.copy_(fresh)

        return replay, outputs

    monkeypatch.setattr(cuda_graphs, "check_supported", lambda runtime: None)
    monkeypatch.setattr(cuda_graphs, "capture", rerun_capture)
    monkeypatch.setattr(cuda_graphs, "new_pool", lambda: None)
