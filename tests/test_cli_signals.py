"""What the commands tell a new user means what it says (issue 41, item 5 and the demo's speedup of item 4):
train-drafter's numbers agree with its bar, tau 1.00 comes with a hint, a dry run puts no check mark
on a download, help shows no `<bool>`, tables fit 80 columns."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from rich.console import Console
from support import one_error_line, run_cli
from typer.testing import CliRunner

from trtllm_dflash.cli.app import app
from trtllm_dflash.cli.common import tau_hint
from trtllm_dflash.testing.tiny import make_tiny_target

# ----------------------------------------------------------------------------- train-drafter


@pytest.fixture(scope="module")
def tiny_training(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target = make_tiny_target(root / "target", "qwen3", seed=5, tokenizer=True)
    (root / "data.txt").write_text("\n".join(f"line {i} " + "abcdefgh" * 6 for i in range(40)))
    return target, root / "data.txt"


OPTIONS = dict(
    layers=1,
    block_size=4,
    steps=7,
    lr=2e-3,
    batch_size=4,
    seq_len=32,
    anchors=4,
    checkpoint_every=5,
    max_sequences=16,
    cache_features=False,
)


def test_the_progress_shows_the_numbers_the_final_line_reports(tiny_training, tmp_path):
    from trtllm_dflash.training.run import TrainDrafterOptions, train_drafter

    target, data = tiny_training
    shown: list[dict] = []
    summary = train_drafter(
        TrainDrafterOptions(target=target, data=[data], out=tmp_path / "d", **OPTIONS),
        lambda phase, done, total, metrics: shown.append(metrics) if phase == "train" else None,
    )
    final = summary["final"]
    assert (final["first_step"], final["step"]) == (6, 7)  # the steps since the last checkpoint
    last = shown[-1]  # what the bar shows at the end
    assert (last["first_step"], last["step"], last["loss"], last["accuracy"]) == (6, 7, final["loss"], final["accuracy"])
    assert shown[4]["first_step"] == 1 and shown[5]["first_step"] == 6  # the window restarts after each checkpoint


def test_the_final_line_names_the_steps_its_mean_is_over(tiny_training, tmp_path):
    target, data = tiny_training
    out = tmp_path / "d"
    args = ["train-drafter", "--target", str(target), "--data", str(data), "--out", str(out)]
    for key, value in OPTIONS.items():
        args += [f"--{key.replace('_', '-')}", str(value)] if key != "cache_features" else ["--no-cache-features"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    final = json.loads((out / "training.json").read_text())["final"]
    text = " ".join(result.output.split())
    assert f"final loss {final['loss']:.4f}, accuracy {final['accuracy']:.3f} (mean of steps 6-7)" in text
    assert "steps 1-5: mean loss" in text  # the checkpoint line
    assert f"dflash-trt generate --target {target} --drafter {out}" in text


# ----------------------------------------------------------------------------- tau 1.00


def test_tau_one_gets_a_hint_and_a_drafter_that_works_does_not():
    hint = tau_hint(1.0)
    assert hint is not None and "--steps" in hint and "mask_token_id" in hint
    assert tau_hint(1.004) is not None  # shown as 1.00
    assert tau_hint(1.5) is None and tau_hint(None) is None


def test_generate_prints_the_hint_under_a_tau_of_one(monkeypatch, tmp_path):
    from trtllm_dflash import backends

    out = SimpleNamespace(
        text=" x", token_ids=[5, 6, 7], mean_acceptance_length=1.0, num_target_forwards=3, tokens_per_second=10.0, finish_reason="length"
    )
    pipe = SimpleNamespace(speculative=True, generate=lambda prompts, **kwargs: [out])
    monkeypatch.setattr(backends, "get_backend", lambda name: SimpleNamespace(open_pipeline=lambda *a, **k: pipe))
    result = CliRunner().invoke(app, ["generate", "--target", str(tmp_path), "--drafter", str(tmp_path), "--prompt", "hi"])
    assert result.exit_code == 0, (result.output, result.exception)
    text = " ".join(result.output.split())
    assert "tau 1.00" in text and "hint: tau 1.00 means the target accepted none of the drafter's tokens" in text

    out.mean_acceptance_length = 2.5
    result = CliRunner().invoke(app, ["generate", "--target", str(tmp_path), "--drafter", str(tmp_path), "--prompt", "hi"])
    assert "tau 2.50" in result.output and "hint" not in result.output


# ----------------------------------------------------------------------------- build --dry-run of a download


def _headline(*extra: str, env: dict):
    return run_cli("build", "--gpu", "b300", "--model", "gpt-oss-120b", *extra, env=env)


def test_a_download_gets_no_check_mark_and_says_what_to_do_without_a_network(tmp_path):
    empty_cache = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}
    online = _headline("--dry-run", env={**empty_cache, "HF_HUB_OFFLINE": ""})
    assert online.returncode == 0, online.stderr
    line = next(line for line in online.stdout.splitlines() if "checkpoints " in line and "validate the target" in line)
    assert line.strip().startswith("↓") and "✓" not in line
    text = " ".join(online.stdout.split())
    assert "not available locally: the build downloads openai/gpt-oss-120b, z-lab/gpt-oss-120b-DFlash" in text
    assert "`hf download openai/gpt-oss-120b --local-dir DIR` and pass --target DIR" in text

    offline = _headline("--dry-run", env={**empty_cache, "HF_HUB_OFFLINE": "true"})
    line = next(line for line in offline.stdout.splitlines() if "checkpoints " in line and "validate the target" in line)
    assert offline.returncode == 0 and line.strip().startswith("✗")
    assert "HF_HUB_OFFLINE is set" in " ".join(offline.stdout.split())


def test_the_real_run_offline_ends_with_the_flag_to_pass(tmp_path):
    empty_cache = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"), "HF_HUB_OFFLINE": "1"}
    line = one_error_line(_headline("--out", str(tmp_path / "out"), env=empty_cache))
    assert "openai/gpt-oss-120b is not a local directory and not in the Hugging Face cache" in line
    assert line.endswith("and rerun this command with --target DIR")


# ----------------------------------------------------------------------------- help and tables


def _commands() -> list[list[str]]:
    import typer

    group = typer.main.get_command(app)
    commands = []
    for name, command in group.commands.items():
        subcommands = getattr(command, "commands", None)
        commands += [[name, sub] for sub in subcommands] if subcommands else [[name]]
    return commands


def test_help_shows_no_bool_metavar_and_keeps_the_value_types():
    commands = _commands()
    assert ["build"] in commands and ["recipes", "list"] in commands
    for command in commands:
        result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (command, result.output)
        assert "<bool>" not in result.output, command
    build_help = CliRunner().invoke(app, ["build", "--help"], env={"COLUMNS": "200"}).output
    assert "<int>" in build_help and "--native-only" in build_help


@pytest.mark.parametrize(
    "command",
    [
        ["recipes", "list"],
        ["plan", "--model", "gpt-oss-120b", "--gpu", "b300"],
        ["plan", "--model", "qwen3-8b", "--gpu", "h100"],
        ["doctor"],
    ],
)
def test_tables_fit_80_columns_with_nothing_cut(command):
    result = run_cli(*command, columns=80)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout


def test_recipes_list_shows_every_value_whole_at_80_columns():
    from trtllm_dflash.recipes import list_recipes

    text = run_cli("recipes", "list", columns=80).stdout
    for recipe in list_recipes():
        assert recipe.name in text and recipe.drafter.checkpoint in text
    assert "bf16, experts mxfp4" in text


# ----------------------------------------------------------------------------- the demo's two speedups


def _report(single: float, one_user_ratio: float) -> dict:
    row = {
        "concurrency": 1,
        "requests": 4,
        "ar": {"throughput": 100.0, "per_user_tokens_per_second": 100.0},
        "dflash": {"throughput": 100.0 * one_user_ratio, "per_user_tokens_per_second": 95.0, "tau": 2.5},
        "speedup": one_user_ratio,
        "identical_outputs": 4,
    }
    summary = {
        "ar_tokens_per_second": 100.0,
        "dflash_tokens_per_second": 100.0 * single,
        "speedup": single,
        "tau": 2.65,
        "tau_ideal_speedup": None,
        "ar_step_ms": None,
        "draft_ms": None,
        "verify_ms": None,
        "lossless": True,
        "mismatched_prompts": 0,
        "tau_histogram": {"1": 3, "2": 4},
    }
    block = {
        "block_size": 8,
        "tau": 2.65,
        "tokens_per_second": 100.0 * single,
        "speedup": single,
        "tau_ideal_speedup": None,
        "draft_ms": None,
        "verify_ms": None,
        "lossless": True,
    }
    return {
        "system": {"backend": "triton", "device": "server"},
        "summary": summary,
        "block_sizes": [block],
        "concurrency": [row],
        "settings": {"prompts": 4, "repeats": 1, "max_new_tokens": 64, "block_size": 8},
    }


def test_the_bench_tables_say_which_number_a_single_user_sees():
    from trtllm_dflash.bench.report import SINGLE_USER, print_report

    out = io.StringIO()
    print_report(_report(1.19, 0.93), Console(file=out, width=80, highlight=False))
    text = out.getvalue()
    head, rest = text.split("tau histogram", 1)
    assert SINGLE_USER in head and "1.19x" in head
    concurrency = rest.split("concurrency sweep", 1)[1]
    header = next(line for line in concurrency.splitlines() if "users" in line)
    assert "0.93x" in concurrency and "ratio" in header and "speedup" not in header  # throughput, not what one user sees
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text


def test_the_demo_summary_names_the_single_user_speedup(tmp_path):
    from trtllm_dflash.cli.demo import _summary

    (tmp_path / "bench.json").write_text(json.dumps(_report(1.19, 0.93)))
    out = io.StringIO()
    _summary(Console(file=out, width=200, highlight=False), tmp_path / "bench.json", tmp_path, 0)
    text = out.getvalue()
    assert "the speedup a single user sees (served, one request at a time, interleaved with autoregressive): 1.19x" in text
    assert "0.93x" not in text
