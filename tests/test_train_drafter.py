"""`dflash-trt train-drafter`: it learns, it resumes exactly, its output loads, bad inputs fail first."""

from __future__ import annotations

import json
import random

import pytest
import torch
from typer.testing import CliRunner

from trtllm_dflash.api import DFlashPipeline
from trtllm_dflash.checkpoints import load_drafter, load_target, save_drafter
from trtllm_dflash.cli.app import app
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.testing.tiny import make_tiny_target
from trtllm_dflash.training import run as runmod
from trtllm_dflash.training.run import TrainDrafterOptions, check_options, train_drafter

LETTERS = "abcdefghijklmnop"


def periodic_text(rng: random.Random, length: int = 64) -> str:
    period = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6)))
    return (period * (length // len(period) + 1))[:length]


@pytest.fixture(scope="module")
def periodic_target(tmp_path_factory):
    """A tiny Qwen3 target trained for a few seconds to continue periodic strings.

    Its greedy continuation depends on the context (the period), so a drafter has to use the
    target features to predict it: a fair small-scale stand-in for a real target.
    """
    path = make_tiny_target(tmp_path_factory.mktemp("periodic-target"), "qwen3", seed=5, tokenizer=True)
    target = load_target(path)
    model, tok = target.model.train(), target.tokenizer
    rng = random.Random(0)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        batch = torch.tensor([tok(periodic_text(rng), add_special_tokens=False)["input_ids"] for _ in range(16)])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(path)
    data = path.parent / "periodic-data"
    data.mkdir()
    (data / "train.txt").write_text("\n".join(periodic_text(rng, 48) for _ in range(160)))
    (data / "prompts.jsonl").write_text("".join(json.dumps({"prompt": periodic_text(rng, 20)}) + "\n" for _ in range(32)))
    return path, data


def mean_tau(target, drafter, prompts) -> tuple[float, list[list[int]]]:
    pipe = DFlashPipeline.load(target, drafter)
    outputs = pipe.generate(prompts, max_new_tokens=32, stop_token_ids=())
    lengths = [a for o in outputs for a in o.acceptance_lengths]
    return sum(lengths) / len(lengths), [o.token_ids for o in outputs]


def test_train_drafter_learns_and_loads(periodic_target, tmp_path):
    target, data = periodic_target
    out = tmp_path / "drafter"
    result = CliRunner().invoke(
        app,
        [
            "train-drafter",
            "--target",
            str(target),
            "--data",
            str(data),
            "--out",
            str(out),
            "--layers",
            "1",
            "--block-size",
            "8",
            "--steps",
            "200",
            "--lr",
            "3e-3",
            "--batch-size",
            "8",
            "--seq-len",
            "48",
            "--anchors",
            "8",
            "--regenerate",
            "--prompt-tokens",
            "12",
            "--checkpoint-every",
            "50",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "training.json").read_text())
    history = summary["history"]
    assert history[-1]["loss"] < 0.8 * history[0]["loss"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "training.json"]

    # the z-lab layout loads with the foundation loaders and fits the target
    loaded = load_drafter(out, target=load_target(target))
    assert loaded.config.block_size == 8 and loaded.config.num_hidden_layers == 1
    config = DrafterConfig.from_dir(out)
    assert config.mask_token_id == 2  # the tokenizer's <mask>

    untrained = tmp_path / "untrained"
    torch.manual_seed(0)
    save_drafter(DFlashDrafter(config), untrained)
    rng = random.Random(123)
    prompts = [periodic_text(rng, 20) for _ in range(6)]
    tau_untrained, _ = mean_tau(target, untrained, prompts)
    tau_trained, tokens = mean_tau(target, out, prompts)
    assert tau_trained > tau_untrained + 1.0, (tau_untrained, tau_trained)
    # lossless: the trained drafter changes speed, never the output
    reference = DFlashPipeline.load(target).generate(prompts, max_new_tokens=32, stop_token_ids=())
    assert tokens == [r.token_ids for r in reference]


def test_resume_continues_exactly(periodic_target, tmp_path):
    target, data = periodic_target
    common = dict(
        target=target,
        data=[data / "train.txt"],
        layers=1,
        block_size=4,
        steps=12,
        lr=2e-3,
        batch_size=4,
        seq_len=32,
        anchors=4,
        checkpoint_every=5,
        max_sequences=24,
        cache_features=False,
        save_dtype="float32",
    )
    straight = train_drafter(TrainDrafterOptions(out=tmp_path / "straight", **common))

    class Interrupted(Exception):
        pass

    def stop_after_checkpoint(phase, done, total, metrics):
        if phase == "checkpoint" and done == 10:
            raise Interrupted

    with pytest.raises(Interrupted):
        train_drafter(TrainDrafterOptions(out=tmp_path / "resumed", **common), stop_after_checkpoint)
    assert (tmp_path / "resumed" / "checkpoint" / "optimizer.safetensors").is_file()
    resumed = train_drafter(TrainDrafterOptions(out=tmp_path / "resumed", resume=True, **common))
    assert [h["step"] for h in resumed["history"]] == [5, 10, 12]
    a = load_drafter(tmp_path / "straight").state_dict()
    b = load_drafter(tmp_path / "resumed").state_dict()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)
    assert resumed["history"][-1]["loss"] == pytest.approx(straight["history"][-1]["loss"], rel=1e-3)


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if anything gets as far as loading the target."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the target was loaded: the input check came too late")

    monkeypatch.setattr(runmod, "load_target", forbidden)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(data=["/nonexistent/data"]), "does not exist"),
        (dict(block_size=1), "block size must be >= 2"),
        (dict(target_layer_ids=[0, 9]), "outside the target's 4 layers"),
        (dict(layers=0), "--layers must be >= 1"),
    ],
)
def test_bad_inputs_fail_before_training(periodic_target, tmp_path, no_training, change, message):
    target, data = periodic_target
    options = dict(target=target, data=[data], out=tmp_path / "out", steps=5)
    options.update(change)
    with pytest.raises(DFlashError, match=message):
        train_drafter(TrainDrafterOptions(**options))
    assert not (tmp_path / "out").exists()


def test_target_without_tokenizer_fails_first(tiny_qwen3, periodic_target, tmp_path, no_training):
    _, data = periodic_target
    with pytest.raises(DFlashError, match="has no tokenizer"):
        check_options(TrainDrafterOptions(target=tiny_qwen3, data=[data], out=tmp_path / "out"))


def test_cli_bad_input_is_one_line(periodic_target, tmp_path, monkeypatch, capsys, no_training):
    from trtllm_dflash.cli.app import main

    target, data = periodic_target
    argv = [
        "dflash-trt",
        "train-drafter",
        "--target",
        str(target),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "o"),
        "--target-layer-ids",
        "1,7",
    ]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: target layer ids [1, 7] include [7]"), lines
    assert not (tmp_path / "o").exists()


def test_output_directory_is_never_overwritten(periodic_target, tmp_path, no_training):
    target, data = periodic_target
    out = tmp_path / "existing"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(DFlashError, match="not empty"):
        train_drafter(TrainDrafterOptions(target=target, data=[data], out=out))
    with pytest.raises(DFlashError, match="holds no checkpoint"):
        train_drafter(TrainDrafterOptions(target=target, data=[data], out=out, resume=True))
    assert (out / "config.json").read_text() == "{}"


def test_jsonl_data_marks_only_responses_as_trained(periodic_target, tmp_path):
    from trtllm_dflash.training import data as datamod

    target, _ = periodic_target
    tok = load_target(target).tokenizer
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "abcabc"}\n\n{"prompt": "xy", "response": "zz"}\n{"prompt": "only"}\n')
    examples = datamod.read_examples([path], tok)
    assert [(e.prompt, e.text) for e in examples] == [(None, "abcabc"), ("xy", "zz"), ("only", "")]
    seqs = datamod.tokenize_examples(tok, examples, seq_len=16, min_length=2)
    eos = tok.eos_token_id
    assert seqs[0].loss_mask == [1] * 7 and seqs[0].input_ids[-1] == eos
    assert seqs[1].input_ids == tok("xyzz", add_special_tokens=False)["input_ids"] + [eos]
    assert seqs[1].loss_mask == [0, 0, 1, 1, 1] and seqs[1].prompt_length == 2
    assert seqs[2].loss_mask == [0] * 4  # a prompt without a response trains nothing unless regenerated
    path.write_text('{"text": "ok"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(DFlashError, match=r"d.jsonl:2 has chat messages but the target tokenizer has no chat template"):
        datamod.read_examples([path], tok)
    path.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(DFlashError, match=r"d.jsonl:2 is not valid JSON"):
        datamod.read_examples([path], tok)


def test_batches_are_a_pure_function_of_the_step():
    from trtllm_dflash.training.data import batch_order

    first = [batch_order(10, 4, step, seed=3) for step in range(6)]
    assert first == [batch_order(10, 4, step, seed=3) for step in range(6)]
    assert sorted(first[0] + first[1]) == sorted(set(first[0] + first[1]))  # no repeats within an epoch
    assert first != [batch_order(10, 4, step, seed=4) for step in range(6)]


@pytest.mark.parametrize("family", ["qwen3_5", "gpt_oss"])
def test_train_drafter_on_a_hybrid_and_a_gpt_oss_target(family, tmp_path):
    """The same recipe on a Gated DeltaNet hybrid and on gpt-oss (sinks, sliding windows, MoE):
    regeneration runs through our decoding loop, the tapped features are the output of decoder
    layer i as at serving time, the loss falls, and the drafter decodes losslessly."""
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime
    from trtllm_dflash.training.trainer import DrafterTrainer, TrainConfig

    target = make_tiny_target(tmp_path / "target", family, seed=3, tokenizer=True)
    rng = random.Random(1)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("\n".join(periodic_text(rng, 48) for _ in range(64)))
    out = tmp_path / "drafter"
    result = CliRunner().invoke(
        app,
        [
            "train-drafter",
            "--target",
            str(target),
            "--data",
            str(data),
            "--out",
            str(out),
            "--layers",
            "1",
            "--block-size",
            "4",
            "--steps",
            "40",
            "--lr",
            "3e-3",
            "--batch-size",
            "4",
            "--seq-len",
            "40",
            "--anchors",
            "4",
            "--regenerate",
            "--prompt-tokens",
            "12",
            "--checkpoint-every",
            "10",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    history = json.loads((out / "training.json").read_text())["history"]
    assert len(history) >= 4 and history[-1]["loss"] < history[0]["loss"]

    loaded = load_target(target, dtype=torch.float64)
    drafter = load_drafter(out, target=loaded)
    # training taps == serving taps (output of decoder layer i), on the same tokens
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    trainer = DrafterTrainer(loaded.model, drafter, TrainConfig(steps=1))
    trained_features = trainer.target_features(tokens)
    trainer.close()
    runtime = TorchRuntime(loaded.model, drafter)
    runtime.allocate(1, 16)
    served = runtime.target_forward(slice(0, 1), tokens, torch.zeros(1, dtype=torch.long), 7, logits_at=torch.tensor([6]))
    torch.testing.assert_close(served.features, trained_features)

    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    spec = DFlashPipeline.load(target, out, dtype=torch.float64).generate(prompts, max_new_tokens=24, stop_token_ids=())
    ar = DFlashPipeline.load(target, None, dtype=torch.float64).generate(prompts, max_new_tokens=24, stop_token_ids=())
    assert [o.token_ids for o in spec] == [o.token_ids for o in ar]


def test_a_data_directory_takes_markdown_and_config_text_too(tmp_path):
    """`--data DIR` reads the text files a user has (`.markdown` was skipped without a word)."""
    from trtllm_dflash.training.data import find_data_files

    for name in ("notes.markdown", "guide.md", "setup.yaml", "image.png"):
        (tmp_path / name).write_text("some text\\n")
    assert [p.name for p in find_data_files([tmp_path])] == ["guide.md", "notes.markdown", "setup.yaml"]
