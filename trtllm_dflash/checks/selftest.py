"""`dflash-trt selftest --gpu` (`make gpu-check`): everything that needs a GPU, in one command.

Why: CI machines have no GPU, so the GPU-only parts (compiled kernels, their speed, CUDA graphs,
decode speed on CUDA) are checked only when someone with a GPU runs this. It must fit in about
10 minutes on one H100, run every step even when one fails, and leave its numbers in
benchmarks/RESULTS.md with the GPU, driver, versions and date.

Steps: a warm-up that compiles the kernel variants the GPU tests launch (warmup.py),
the GPU tests (pytest, each test reported as it finishes: runs.py), the kernel
benchmark (bench/kernels.py), the torch-runtime decode of the demo pair and of a random
Qwen3-8B-shaped 2-layer model, DFlash vs AR, CUDA graphs off and on (bench/decode.py), and a
TensorRT engine build of the demo pair, skipped with the reason where TensorRT is not installed.
Each step reports pass / fail / skip and its time.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import importlib.util
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

from trtllm_dflash.checks import runs
from trtllm_dflash.errors import DFlashError

PASS, FAIL, SKIP = "pass", "fail", "skip"
GPU_TEST_TIMEOUT_S = 420
TENSORRT_BUILD_TIMEOUT_S = 300
# The command line's module, run as `python -m` (a child process: the build's memory and time limit are
# its own). Importing it here would loop (cli.app registers cli.selftest, which runs this), so
# tests/test_selftest.py checks that it is the module of pyproject's `dflash-trt` console script.
CLI_MODULE = "trtllm_dflash.cli.app"

Say = Callable[[str], None]


# ---------------------------------------------------------------------------------------- steps


@dataclasses.dataclass
class StepOutcome:
    """What a step returns: one line for the console, markdown for RESULTS.md, and whether it passed."""

    summary: str
    markdown: str = ""
    passed: bool = True


class SkipStep(Exception):
    """Raised by a step that cannot run here; its message is the reason."""


@dataclasses.dataclass
class Step:
    name: str
    run: Callable[[], StepOutcome]
    key: str = ""  # what `selftest --gpu --step KEY` calls it


@dataclasses.dataclass
class StepResult:
    name: str
    status: str  # PASS, FAIL or SKIP
    seconds: float
    summary: str
    markdown: str = ""
    error: str = ""  # the traceback of a step that raised


def run_steps(
    steps: list[Step],
    on_start: Callable[[Step], None] | None = None,
    on_result: Callable[[StepResult], None] | None = None,
) -> list[StepResult]:
    """Run every step, whatever happened to the ones before it: a failure is recorded, not raised."""
    results = []
    for step in steps:
        if on_start is not None:
            on_start(step)
        started = time.perf_counter()
        try:
            outcome = step.run()
            result = StepResult(step.name, PASS if outcome.passed else FAIL, 0.0, outcome.summary, outcome.markdown)
        except SkipStep as skip:
            result = StepResult(step.name, SKIP, 0.0, str(skip))
        except Exception as exc:  # noqa: BLE001 - one step's failure must not stop the others
            first = (str(exc).strip().splitlines() or [""])[0]
            result = StepResult(step.name, FAIL, 0.0, f"{type(exc).__name__}: {first}", error=traceback.format_exc())
        result.seconds = time.perf_counter() - started
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def any_failed(results: list[StepResult]) -> bool:
    return any(r.status == FAIL for r in results)


# ---------------------------------------------------------------------------------- environment


@dataclasses.dataclass(frozen=True)
class GpuEnvironment:
    """The machine the numbers come from."""

    gpu: str  # torch.cuda.get_device_name()
    compute_capability: str  # e.g. "9.0"
    sm_count: int
    memory_gib: float
    driver: str
    cuda: str  # the CUDA version torch was built with
    torch: str
    triton: str
    tensorrt: str | None  # version, None when TensorRT is not installed
    host: str
    date: str  # UTC, "YYYY-MM-DD HH:MM UTC"


def require_cuda() -> None:
    """One line, and no steps, where no CUDA device is visible."""
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
        raise DFlashError(
            f"no CUDA device is visible ({build}; torch.cuda.is_available() is False), so the GPU check cannot run here",
            "run `make gpu-check` on a machine with an NVIDIA GPU and its driver "
            "(`make setup` installs the CUDA build of torch where nvidia-smi works)",
        )


def tensorrt_version() -> str | None:
    """The installed TensorRT's version, or None when `import tensorrt` would fail."""
    if importlib.util.find_spec("tensorrt") is None:
        return None
    try:
        import tensorrt
    except Exception:  # noqa: BLE001 - a broken install is as good as none here
        return None
    return str(getattr(tensorrt, "__version__", "unknown"))


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def driver_version() -> str:
    """The NVIDIA driver version (NVML, else nvidia-smi), or "unknown"."""
    from trtllm_dflash.catalog.gpus import detect_local_gpus

    found = detect_local_gpus().driver_version
    if found:
        return found
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def gpu_environment() -> GpuEnvironment:
    """GPU 0 as torch sees it, the driver, and the versions that matter for the numbers."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return GpuEnvironment(
        gpu=torch.cuda.get_device_name(0),
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=int(props.multi_processor_count),
        memory_gib=props.total_memory / 2**30,
        driver=driver_version(),
        cuda=str(torch.version.cuda),
        torch=torch.__version__,
        triton=_package_version("triton"),
        tensorrt=tensorrt_version(),
        host=platform.node(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )


# ------------------------------------------------------------------------------- the GPU steps


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much each step measures (the full check fits ~10 minutes on one H100; --quick ~3)."""

    quick: bool
    prompts: int
    max_new_tokens: int
    batches: tuple[int, ...]
    repeats: int


FULL = Budget(quick=False, prompts=8, max_new_tokens=128, batches=(1, 8), repeats=3)
QUICK = Budget(quick=True, prompts=4, max_new_tokens=64, batches=(1, 4), repeats=1)


def repository_root() -> Path | None:
    """The checkout whose tests/ to run: the working directory, else the one this package is in."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "tests").is_dir() and (root / "pyproject.toml").is_file():
            return root
    return None


def parse_pytest_counts(output: str) -> dict[str, int]:
    """Counts from pytest's closing line ("3 passed, 1 failed, 2 skipped in 4.2s")."""
    lines = [line for line in output.splitlines() if re.search(r"\bin [\d.]+s\b", line)]
    if not lines:
        return {}
    counts = {}
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)", lines[-1]):
        counts["error" if word.startswith("error") else word] = int(number)
    return counts


def gpu_test_files(root: Path) -> list[str]:
    """The GPU test files (tests/test_*gpu*.py), relative to the checkout."""
    return sorted(str(p.relative_to(root)) for p in (root / "tests").glob("test_*gpu*.py"))


def gpu_tests_step(root: Path | None = None, say: Say | None = None, limit_s: float = GPU_TEST_TIMEOUT_S) -> StepOutcome:
    """The GPU-marked test files, in a pytest subprocess (its CUDA context ends with it).

    Each test's outcome and time is said as it finishes (`checks/progress.py`, a pytest plugin),
    so a run stopped at `limit_s` still reports the tests that finished and the one running."""
    root = root or repository_root()
    if root is None:
        raise SkipStep("no tests/ folder here: run the check from a checkout of the repository")
    files = gpu_test_files(root)
    if not files:
        raise SkipStep(f"no GPU test files (tests/test_*gpu*.py) under {root}")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "trtllm_dflash.checks.progress", *files]

    def finished(record: runs.TestRecord) -> None:
        if say is not None:
            say(f"{record.outcome} {record.test} ({record.seconds:.1f} s)" + (f": {record.error}" if record.error else ""))

    run = runs.run_with_progress([command], root, limit_s, finished)
    progress = run.progress
    slowest = runs.slowest(progress.finished)
    if run.timed_out:
        summary = runs.stopped_text(run)
        failed = [r for r in progress.finished if r.outcome in ("failed", "error")]
        if failed:
            summary += "; failed: " + "; ".join(r.test for r in failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        markdown = (
            f"`pytest -q {' '.join(files)}` {summary}.\n\nEvery test that finished, in order, then the one stopped:\n\n"
            + runs.records_table(progress.finished, run.running_for())
        )
        return StepOutcome(summary, markdown, passed=False)
    output = run.output
    counts = parse_pytest_counts(output)
    counted = ", ".join(f"{n} {word}" for word, n in counts.items()) or "no summary line"
    failed = [r for r in progress.finished if r.outcome in ("failed", "error")]
    # pytest's own summary lines are cut to the terminal's width, the message first: the records keep it
    failures = [f"{r.outcome.upper()} {r.test}: {r.error}" for r in failed] or [
        line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))
    ]
    returncode = run.returncodes[0]
    passed = returncode == 0 and counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("error")
    summary = f"{counted} ({', '.join(files)})"
    if failures:
        summary += "; " + "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else "")
    elif not passed:
        summary += f"; pytest exit status {returncode}: " + " | ".join(output.strip().splitlines()[-3:])
    if slowest:
        summary += f"; slowest: {slowest[0].test} ({slowest[0].seconds:.1f} s)"
    markdown = f"`pytest -q {' '.join(files)}`: {counted} in {run.seconds:.0f} s.\n"
    if failed:
        markdown += "\nThe tests that failed, with the line pytest reports:\n\n" + runs.records_table(failed)
    if slowest:
        markdown += "\nThe slowest tests:\n\n" + runs.records_table(slowest)
    return StepOutcome(summary, markdown, passed)


def warmup_step(say: Say | None = None, root: Path | None = None) -> StepOutcome:
    """Compile the kernel variants the GPU tests launch, in parallel processes, before they are timed."""
    from trtllm_dflash.checks import warmup

    root = root or repository_root() or Path.cwd()
    workers = warmup.worker_count()
    run = warmup.run_warmup(root, say, workers=workers)
    summary, markdown, passed = warmup.warmup_report(run, workers)
    return StepOutcome(summary, markdown, passed)


def kernel_benchmark_step(budget: Budget, say: Say) -> StepOutcome:
    """The plugin kernels against the bandwidth floor and SDPA, each replayed from a CUDA graph (as a
    captured step runs them: issue 39 chooses attention by in-graph time); fails only if
    verification disagrees with the reference (attention is checked against SDPA inside the benchmark)."""
    from trtllm_dflash.bench import kernels

    attention = kernels.QUICK_ATTENTION_SHAPES if budget.quick else kernels.ATTENTION_SHAPES
    verify = kernels.QUICK_VERIFY_SHAPES if budget.quick else kernels.VERIFY_SHAPES
    result = kernels.run_kernel_benchmark(attention, verify, progress=say, in_graph=True)
    goals = kernels.goal_lines(result)
    summary = kernels.summary_line(result) + ". Goals: " + "; ".join(g.split(";")[0] for g in goals)
    return StepOutcome(summary, kernels.kernel_tables(result), result.all_equal_to_reference)


def _decode_outcome(results, note: str) -> StepOutcome:
    from trtllm_dflash.bench.decode import decode_summary, decode_table

    differs = [r for r in results if r.same_as_eager is False and not r.variant]  # hf vs dflash attention in bf16 is informational
    summary = decode_summary(results)
    if differs:
        summary += "; CUDA graphs changed the tokens of: " + ", ".join(f"{r.mode} batch {r.batch}" for r in differs)
    return StepOutcome(summary, note + "\n\n" + decode_table(results), passed=not differs)


def demo_decode_step(budget: Budget, say: Say) -> StepOutcome:
    """The shipped demo pair on CUDA: a trained drafter, so tau and the speedup are real."""
    from trtllm_dflash import demo
    from trtllm_dflash.bench.prompts import load_prompt_set
    from trtllm_dflash.checkpoints import load_drafter, load_target

    def load():
        target = load_target(demo.target_dir(), device="cuda")
        drafter = load_drafter(demo.drafter_dir(), target=target)
        texts = load_prompt_set("stdlib", limit=budget.prompts)
        prompts = [list(target.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
        dtype = str(next(target.model.parameters()).dtype).replace("torch.", "")
        note = (
            f"Demo pair (8-layer Qwen3 target, 3-layer block-8 drafter), {dtype}, {len(prompts)} held-out `stdlib` prompts x "
            f"{budget.max_new_tokens} tokens, greedy, no stop tokens; median of {budget.repeats} timed passes after a warm-up. "
            "A batch of B serves the prompts B at a time (in-flight batching)."
        )
        return target.model, drafter, prompts, note

    return _timed_decode("demo", load, budget, say)


def qwen3_8b_shaped_decode_step(budget: Budget, say: Say) -> StepOutcome:
    """Qwen3-8B's full width with 2 random layers: real GEMM and attention sizes in a few GB."""
    import torch

    from trtllm_dflash.testing.qwen3_8b_shaped import make_qwen3_8b_shaped_drafter, make_qwen3_8b_shaped_target

    def load():
        target = make_qwen3_8b_shaped_target(num_layers=2, device="cuda", dtype=torch.bfloat16)
        drafter = make_qwen3_8b_shaped_drafter(target.config, device="cuda", dtype=torch.bfloat16)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 150000, (64 + 16 * i,), generator=g).tolist() for i in range(budget.prompts)]
        note = (
            "Random weights at Qwen3-8B's width (hidden 4096, 32/8 heads, head_dim 128, FFN 12288, vocab 151936), "
            f"2 target layers, a 1-layer block-16 drafter tapping both; bf16; {len(prompts)} random prompts of 64-"
            f"{64 + 16 * (len(prompts) - 1)} tokens x {budget.max_new_tokens} new. The drafter is random, so tau is about 1: "
            "the DFlash rows measure what a draft + 16-token verify step costs at full width, not a speedup."
        )
        return target, drafter, prompts, note

    return _timed_decode("qwen3-8b-shaped", load, budget, say)


def _timed_decode(name: str, load: Callable[[], tuple], budget: Budget, say: Say) -> StepOutcome:
    """measure_decode on what `load` returns (target model, drafter, prompts, the step's note); the GPU
    memory is given back afterwards, the loader's other objects (a Target, a tokenizer) already gone."""
    import torch

    from trtllm_dflash.bench.decode import measure_decode

    model, drafter, prompts, note = load()
    results = measure_decode(name, model, drafter, prompts, budget.batches, budget.max_new_tokens, budget.repeats, progress=say)
    del model, drafter
    torch.cuda.empty_cache()
    return _decode_outcome(results, note)


FULL_DEPTH_GIB = 48  # 16.4 GB of target weights, 2 GB of drafter, caches for batch 32 x 4k (20 GB), graphs


def full_depth_step(budget: Budget, say: Say) -> StepOutcome:
    """`benchmarks/bench_gpu_step.py` (bench/gpu_step.py): a 36-layer Qwen3-8B-shaped step beside its
    floor, first in the check so every GPU window measures it; its GPU memory is given back after."""
    import gc

    import torch

    from trtllm_dflash.bench import gpu_step

    batches, contexts = ((1, 8), (1024,)) if budget.quick else ((1, 8, 32), (1024, 4096))
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    if total_gib < FULL_DEPTH_GIB:
        raise SkipStep(f"the Qwen3-8B-shaped step needs about {FULL_DEPTH_GIB} GiB of GPU memory; this GPU has {total_gib:.0f}")
    try:
        result = gpu_step.run(gpu_step.QWEN3_8B, batches, contexts, contexts[:1], say=say, profile=True)
    finally:  # the steps after this one get the memory back, also after a failure
        gc.collect()
        torch.cuda.empty_cache()
    first = result.rows[0]
    return StepOutcome(f"batch {first.batch}, context {first.context}: " + gpu_step.summary_line(first), gpu_step.markdown(result))


def tensorrt_step(env: GpuEnvironment, say: Say) -> StepOutcome:
    """A TensorRT engine build of the demo pair for this GPU; skipped, saying so, without TensorRT."""
    if env.tensorrt is None:
        raise SkipStep(
            "TensorRT is not installed (no `tensorrt` package: pip install 'trtllm-dflash[trt]' or use NVIDIA's "
            "TensorRT container), so no engine is built; the other steps ran without it"
        )
    from trtllm_dflash.catalog.gpus import match_nvml_name

    gpu = match_nvml_name(env.gpu)
    if gpu is None:
        raise SkipStep(f"TensorRT {env.tensorrt} is installed, but {env.gpu} is not in the GPU catalog, so no build targets it")
    with tempfile.TemporaryDirectory(prefix="dflash-selftest-") as out:
        command = [sys.executable, "-m", CLI_MODULE, "build", "--model", "demo", "--gpu", gpu.name, "--out", out]
        say(" ".join(command[2:]))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TENSORRT_BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return StepOutcome(
                f"`dflash-trt build --model demo --gpu {gpu.name}` did not finish within {TENSORRT_BUILD_TIMEOUT_S} s", passed=False
            )
    tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    line = f"`dflash-trt build --model demo --gpu {gpu.name}` with TensorRT {env.tensorrt}: exit status {done.returncode}"
    return StepOutcome(f"{line}; {tail}", line + ".\n", passed=done.returncode == 0)


# Qwen3-8B's projections ([N, K]: q/k/v, o, gate/up, down, the LM head) for the kernel-choice step
QWEN3_8B_DOWN = (4096, 12288)
QWEN3_8B_PROJECTIONS = ((6144, 4096), (4096, 4096), (24576, 4096), QWEN3_8B_DOWN, (151936, 4096))


def kernel_choice_step(
    budget: Budget,
    say: Say,
    device: str = "cuda",
    layer=None,
    vocab: int = 151936,
    capacity: int = 4096 + 64,
    projections: tuple[tuple[int, int], ...] = QWEN3_8B_PROJECTIONS,
) -> StepOutcome:
    """What `--attention-choice`, `--verify-choice` and `--linear-choice measure` pick at Qwen3-8B's
    layer shape, vocabulary and projections (runtime/attention_choice.py, verify_choice.py,
    linear_choice.py): every candidate checked against the reference and timed from a CUDA graph
    per batch (projections: at 1 and 16 rows). Fails where a candidate that should run on this GPU
    was refused (it computed something else, or did not compile or capture)."""
    import torch

    from trtllm_dflash.runtime import attention_choice, linear_choice, verify_choice

    batches = (1, 8) if budget.quick else (1, 8, 32)
    where = torch.device(device)
    layer = layer or attention_choice.LayerShape(heads=32, kv_heads=8, head_dim=128, value_dim=128)
    dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
    attention = attention_choice.measure([layer], (1, 16), batches, capacity, dtype, where, say=say)
    verify = verify_choice.measure((16,), batches, vocab, dtype, where)
    for choice in verify.choices:
        say(choice.line())
    generator = torch.Generator(where).manual_seed(0)
    weights = [(torch.randn(n, k, generator=generator, device=where).to(dtype) * 0.02, None) for n, k in projections]
    down = [(w, b) for w, b in weights if tuple(w.shape) == QWEN3_8B_DOWN]  # also on silu(gate) * up, as the fused passes run it
    linear = linear_choice.measure(weights, (1, 16), say=say, gated=down)
    del weights, down
    refused = [f"T={c.tokens} b={c.batch} {t.candidate}: {t.refused}" for c in attention.choices for t in c.timings if t.ms is None]
    refused += [f"verify b={c.batch} {c.kind} {form}: {why}" for c in verify.choices for form, why in c.refused.items()]
    refused += [f"rows {c.rows} {c.shape[0]}x{c.shape[1]}{' gated' * c.gated} skinny: {c.refused}" for c in linear.choices if c.refused]
    picks = ", ".join(f"T={c.tokens} b{c.batch} {c.chosen}" for c in attention.choices)
    picks += "; verify " + ", ".join(f"b{c.batch} {c.kind} {c.chosen}" for c in verify.choices)
    picks += "; projections " + ", ".join(f"rows {c.rows} {c.shape[0]}x{c.shape[1]}{' gated' * c.gated} {c.chosen}" for c in linear.choices)
    summary = f"picked {picks}" + (f"; refused: {'; '.join(refused)}" if refused else "")
    described = "\n".join(c.describe() for c in (attention, verify, linear))
    return StepOutcome(summary, "```\n" + described + "\n```\n", passed=not refused)


def gpu_steps(env: GpuEnvironment, budget: Budget, say: Say) -> list[Step]:
    """The check's steps in order (the test subprocess first, before this process holds GPU memory)."""
    return [
        Step("full-depth step: Qwen3-8B shape", lambda: full_depth_step(budget, say), "step"),
        Step("kernel warm-up", lambda: warmup_step(say), "warmup"),
        Step("GPU tests", lambda: gpu_tests_step(say=say), "tests"),
        Step("kernel benchmark", lambda: kernel_benchmark_step(budget, say), "kernels"),
        Step("kernel choices: Qwen3-8B shapes", lambda: kernel_choice_step(budget, say), "choices"),
        Step("decode: demo pair", lambda: demo_decode_step(budget, say), "decode-demo"),
        Step("decode: Qwen3-8B-shaped, 2 layers", lambda: qwen3_8b_shaped_decode_step(budget, say), "decode-qwen3-8b"),
        Step("TensorRT engines", lambda: tensorrt_step(env, say), "tensorrt"),
    ]


STEP_KEYS = ("step", "warmup", "tests", "kernels", "choices", "decode-demo", "decode-qwen3-8b", "tensorrt")


def check_step_keys(keys: list[str]) -> None:
    """Refuse an unknown `--step` before anything starts (one line naming the known ones)."""
    unknown = [key for key in keys if key not in STEP_KEYS]
    if unknown:
        raise DFlashError(f"unknown GPU check step {', '.join(unknown)}", f"use --step with one of: {', '.join(STEP_KEYS)}")


def select_steps(steps: list[Step], keys: list[str]) -> list[Step]:
    """The steps named by `keys`, in the check's own order (all of them when none is named).

    The tests bring the warm-up with them: timed on a cold compile cache they measure the compiler."""
    keys = [*keys, "warmup"] if "tests" in keys else keys
    return [step for step in steps if not keys or step.key in keys]


# ------------------------------------------------------------------------------------- report


def format_section(env: GpuEnvironment, results: list[StepResult], command: str, seconds: float) -> str:
    """The markdown section appended to RESULTS.md: machine, step table, then each step's tables."""
    tensorrt = f"TensorRT {env.tensorrt}" if env.tensorrt else "TensorRT not installed"
    failed = [r.name for r in results if r.status == FAIL]
    lines = [
        f"## GPU check on {env.gpu}, {env.date}",
        "",
        f"Command: `{command}`; {seconds:.0f} s in all; " + (f"**failed: {', '.join(failed)}**." if failed else "no step failed."),
        "",
        f"Machine: {env.gpu} (compute capability {env.compute_capability}, {env.sm_count} SMs, {env.memory_gib:.0f} GiB), "
        f"driver {env.driver}, CUDA {env.cuda} (torch build), torch {env.torch}, triton {env.triton}, {tensorrt}, host `{env.host}`.",
        "",
        "| step | result | time | summary |",
        "|---|---|---:|---|",
    ]
    for r in results:
        summary = r.summary.replace("|", "/").replace("\n", " ")
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.1f} s | {summary} |")
    for r in results:
        if r.markdown.strip():
            lines += ["", f"### {r.name}", "", r.markdown.rstrip()]
    return "\n".join(lines) + "\n"


def append_section(path: Path, text: str) -> None:
    """Append a section to a markdown file (created if missing), one blank line before it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text(encoding="utf-8") if path.is_file() else ""
    separator = "" if not existing else ("\n" if existing.endswith("\n") else "\n\n")
    with path.open("a", encoding="utf-8") as f:
        f.write(separator + text)
