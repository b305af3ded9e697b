"""Repositories, the LLM-API configuration check, the wire format and request cancellation,
without a server (fast). The real-server tests are in test_serving.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from support import RecordingSink, invoke, serve_until

from trtllm_dflash.errors import DFlashError


def _fails(result, message: str) -> None:
    """The command stopped with a DFlashError naming the problem (main() prints it, exit 2)."""
    assert isinstance(result.exception, DFlashError), result.output
    assert message in str(result.exception)


def _parse_pbtxt(path):
    """Parse with Triton's own ModelConfig protobuf: the file must be a valid model config."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("pair")
    target = make_tiny_target(root / "target", seed=5, tokenizer=True)
    return target, make_tiny_drafter(root / "drafter", target, seed=6, mask_token_id=2)


# ---------------------------------------------------------------------- python-backend repository


def test_repo_writes_decoupled_dflash_and_baseline_models(tiny_pair, tmp_path):
    from trtllm_dflash.served_model.model_parameters import ServingConfig

    target, drafter = tiny_pair
    out = tmp_path / "repo"
    result = invoke(
        "repo",
        "--model",
        str(target),
        "--drafter",
        str(drafter),
        "--out",
        str(out),
        "--max-batch",
        "4",
        "--max-context",
        "300",
        "--prefill-chunk",
        "64",
        "--prefill-share",
        "0.3",
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["ar", "dflash", "dflash_repository.json"]
    configs = {}
    for name in ("dflash", "ar"):
        config = _parse_pbtxt(out / name / "config.pbtxt")
        assert config.backend == "python" and config.model_transaction_policy.decoupled
        assert [i.name for i in config.input][:3] == ["text_input", "input_ids", "streaming"]
        assert [list(i.dims) for i in config.input][:2] == [[1], [-1]] and all(i.optional for i in config.input[:2])  # one of the two
        assert {"text_output", "output_ids", "acceptance_lengths", "acceptance_rate", "num_output_tokens"} <= {
            o.name for o in config.output
        }
        configs[name] = ServingConfig.from_parameters({k: v.string_value for k, v in config.parameters.items()})
        compile((out / name / "1" / "model.py").read_text(), "model.py", "exec")
    assert configs["dflash"].drafter == str(drafter.resolve()) and configs["dflash"].max_batch == 4
    assert configs["ar"].drafter is None and configs["ar"].target == configs["dflash"].target == str(target.resolve())
    assert configs["dflash"].max_context == 300
    assert configs["dflash"].prefill_chunk == configs["ar"].prefill_chunk == 64  # both models take the serving option
    assert configs["dflash"].prefill_share == configs["ar"].prefill_share == 0.3


def test_repo_refuses_to_overwrite_and_leaves_nothing_half_written(tiny_pair, tmp_path):
    target, drafter = tiny_pair
    out = tmp_path / "repo"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = invoke("repo", "--model", str(target), "--drafter", str(drafter), "--out", str(out))
    _fails(result, "already exists")
    assert (out / "keep.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    _fails(invoke("repo", "--model", str(target), "--out", str(a_file)), "is a file")
    assert invoke("repo", "--model", str(target), "--drafter", str(drafter), "--out", str(out), "--force").exit_code == 0
    assert not (out / "keep.txt").exists() and (out / "dflash" / "config.pbtxt").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left


def test_repo_checks_the_pair_before_writing(tiny_pair, tmp_path):
    from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

    other = make_tiny_target(tmp_path / "other", hidden_size=32, tokenizer=True)
    wrong = make_tiny_drafter(tmp_path / "wrong", other)
    result = invoke("repo", "--model", str(tiny_pair[0]), "--drafter", str(wrong), "--out", str(tmp_path / "repo"))
    _fails(result, "hidden_size")
    assert not (tmp_path / "repo").exists()


def test_serving_config_rejects_bad_parameters():
    from trtllm_dflash.served_model.model_parameters import ServingConfig

    with pytest.raises(DFlashError, match="max_batch"):
        ServingConfig.from_parameters({"target": {"string_value": "demo"}, "max_batch": {"string_value": "0"}})
    with pytest.raises(DFlashError, match="engines"):
        ServingConfig.from_parameters({"target": "demo", "backend": "trt"})
    with pytest.raises(DFlashError, match="max_bach"):
        ServingConfig.from_parameters({"target": "demo", "max_bach": "4"})


# ---------------------------------------------------------------------- trtllm (LLM-API) repository


def test_trtllm_repository_for_gpt_oss_120b_on_b300_validates(tmp_path):
    from trtllm_dflash.backends.trtllm.options import validate_model_yaml

    out = tmp_path / "repo"
    result = invoke("repo", "--model", "gpt-oss-120b", "--gpu", "b300", "--out", str(out))
    assert result.exit_code == 0, result.output
    model_yaml = out / "tensorrt_llm" / "1" / "model.yaml"
    options = yaml.safe_load(model_yaml.read_text())
    validate_model_yaml(model_yaml)
    spec = options["speculative_config"]
    assert spec["decoding_type"] == "DFlash"
    assert spec["max_draft_len"] == 9 and spec["speculative_model"] == "z-lab/gpt-oss-120b-DFlash"
    assert spec["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert "mask_token_id" in result.output  # not known offline for this drafter: said, not invented
    assert options["model"] == "openai/gpt-oss-120b" and options["backend"] == "pytorch"
    assert options["tensor_parallel_size"] == 8 and options["moe_expert_parallel_size"] == 8
    assert options["kv_cache_config"]["dtype"] == "fp8"
    assert options["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": 512}
    assert options["moe_config"] == {"backend": "TRTLLM"}
    assert options["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    serve = yaml.safe_load((out / "trtllm-serve.yaml").read_text())
    validate_model_yaml(out / "trtllm-serve.yaml")
    assert serve == {k: v for k, v in options.items() if k not in ("model", "backend", "triton_config")}
    config = _parse_pbtxt(out / "tensorrt_llm" / "config.pbtxt")
    assert config.model_transaction_policy.decoupled and config.backend == "python"
    compile((out / "tensorrt_llm" / "1" / "model.py").read_text(), "model.py", "exec")


def test_llm_api_schema_rejects_unknown_keys_and_wrong_types(tmp_path):
    from trtllm_dflash.backends.trtllm.options import llm_api_options, model_yaml, validate_model_yaml
    from trtllm_dflash.recipes import find_recipe

    recipe = find_recipe("gpt-oss-120b", "b300")
    good = model_yaml(recipe.model.checkpoint, llm_api_options(recipe)[0])
    cases = [
        ({**good, "tensor_parallel": 8}, "tensor_parallel: unknown LLM-API key"),
        (
            {**good, "speculative_config": {**good["speculative_config"], "max_draft_length": 9}},
            "speculative_config.max_draft_length: unknown",
        ),
        ({**good, "speculative_config": {**good["speculative_config"], "decoding_type": "Eagle3"}}, "decoding_type"),
        ({**good, "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": "lots"}}, "free_gpu_memory_fraction"),
        ({**good, "max_batch_size": "512"}, "max_batch_size"),
        ({k: v for k, v in good.items() if k != "triton_config"} | {"triton_config": {"decoupled": True}}, "triton_config.max_batch_size"),
    ]
    for options, message in cases:
        path = tmp_path / "model.yaml"
        path.write_text(yaml.safe_dump(options))
        with pytest.raises(DFlashError, match=message.replace("(", r"\(").replace(".", r"\.")):
            validate_model_yaml(path)


def test_trtllm_repository_pins_mask_token_from_a_local_drafter(tiny_pair, tmp_path):
    target, drafter = tiny_pair
    out = tmp_path / "repo"
    result = invoke("repo", "--recipe", "gpt-oss-120b/b300", "--drafter", str(drafter), "--out", str(out))
    assert result.exit_code == 0, result.output
    spec = yaml.safe_load((out / "tensorrt_llm" / "1" / "model.yaml").read_text())["speculative_config"]
    assert spec["mask_token_id"] == 2 and spec["speculative_model"] == str(drafter.resolve())
    assert spec["target_layer_ids"] == [1, 9, 17, 25, 33]  # the recipe's value wins over the checkpoint's


def test_trt_recipe_without_a_build_says_how_to_build(tmp_path):
    result = invoke("repo", "--model", "qwen3-8b", "--gpu", "h100", "--out", str(tmp_path / "repo"))
    _fails(result, "dflash-trt build")


# ---------------------------------------------------------------------- wire format


def test_parse_inputs_checks_types_and_shapes():
    from trtllm_dflash.served_model.protocol import parse_inputs

    parsed = parse_inputs(
        {
            "text_input": np.array([b"hello"], dtype=np.object_),
            "sampling_param_max_tokens": np.array([7], dtype=np.int32),
            "sampling_param_temperature": np.array([0.5], dtype=np.float32),
            "sampling_param_stop": np.array([b"\n", b"END"], dtype=np.object_),
            "streaming": np.array([True]),
        }
    )
    params = parsed.params
    assert (parsed.text, params.max_new_tokens, params.temperature, params.stop, parsed.streaming) == ("hello", 7, 0.5, ("\n", "END"), True)
    with pytest.raises(DFlashError, match="send the prompt as text_input or as input_ids"):
        parse_inputs({"sampling_param_max_tokens": np.array([3], dtype=np.int32)})
    # the prompt as token ids (the OpenAI front end's): one or the other, never both, never empty
    ids = parse_inputs({"input_ids": np.array([5, 6, 7], dtype=np.int64), "sampling_param_max_tokens": np.array([4], dtype=np.int64)})
    assert (ids.token_ids, ids.text, ids.params.max_new_tokens) == ((5, 6, 7), "", 4)
    with pytest.raises(DFlashError, match="not both"):
        parse_inputs({"text_input": np.array([b"x"], dtype=np.object_), "input_ids": np.array([5], dtype=np.int64)})
    with pytest.raises(DFlashError, match="input_ids is empty"):
        parse_inputs({"input_ids": np.array([], dtype=np.int64)})
    with pytest.raises(DFlashError, match="input_ids has type float32"):
        parse_inputs({"input_ids": np.array([5.0], dtype=np.float32)})
    with pytest.raises(DFlashError, match="sampling_param_max_tokens has type float32"):
        parse_inputs({"text_input": np.array([b"x"], dtype=np.object_), "sampling_param_max_tokens": np.array([3.0], dtype=np.float32)})
    with pytest.raises(DFlashError, match="text_input has 2 values"):
        parse_inputs({"text_input": np.array([b"x", b"y"], dtype=np.object_)})
    with pytest.raises(DFlashError, match="not valid UTF-8"):
        parse_inputs({"text_input": np.array([b"\xff\xfe"], dtype=np.object_)})


# ---------------------------------------------------------------------- cancellation in the loop


def test_decoder_cancel_frees_the_row_and_leaves_the_others_unchanged(tiny_pair):
    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams

    pipe = DFlashPipeline.load(*tiny_pair, max_context=128)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    params = SamplingParams(max_new_tokens=20)
    alone = Decoder(pipe.runtime, max_batch=3, max_context=128).generate([Request(p, params) for p in (prompts[0], prompts[2])])
    decoder = Decoder(pipe.runtime, max_batch=3, max_context=128)
    ids = [decoder.submit(Request(p, params)) for p in prompts]
    waiting = decoder.submit(Request([20, 21], params))  # no free row: waits
    done = {}
    for step in range(40):
        if step == 2:
            cancelled = decoder.cancel(ids[1])
            assert cancelled.finish_reason == "cancelled" and len(cancelled.token_ids) > 0
            assert decoder.cancel(waiting) is None and len(decoder.waiting) == 0
        for event in decoder.step():
            if event.finished:
                done[event.request_id] = event.result
        if not decoder.has_work:
            break
    assert sorted(done) == [ids[0], ids[2]]
    assert done[ids[0]].token_ids == alone[0].token_ids and done[ids[2]].token_ids == alone[1].token_ids


def test_engine_streams_and_drops_a_client_that_went_away(tiny_pair):
    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.sampling_params import SamplingParams
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig
    from trtllm_dflash.served_model.protocol import GenerateInputs

    config = ServingConfig(target=str(tiny_pair[0]), drafter=str(tiny_pair[1]), max_context=128, max_tokens=64)
    engine = BatchingLoop(config, open_served_pipeline(config))  # the loop takes an opened pipeline
    stays, leaves = RecordingSink(), RecordingSink(leave_after=1)
    engine.accept(GenerateInputs("abc", SamplingParams(max_new_tokens=24), streaming=True), stays)
    engine.accept(GenerateInputs("xyz", SamplingParams(max_new_tokens=24), streaming=True), leaves)
    serve_until(engine, lambda: stays.finished)
    assert stays.responses[-1][1] and sum(r[0]["output_ids"].size for r in stays.responses) == 24
    reference = engine.pipeline.generate(["abc"], max_new_tokens=24)[0]
    assert [int(t) for r in stays.responses for t in r[0]["output_ids"]] == reference.token_ids
    assert "".join(r[0]["text_output"][0].decode() for r in stays.responses) == reference.text
    # its first token went out alone, before the step decoded (Decoder.step's emit); the client left after it,
    # and the loop saw that at the next step: the step's decoded tokens were its last response
    assert leaves.responses[0][0]["output_ids"].size == 1 and len(leaves.responses) == 2
    assert not leaves.responses[-1][1] and leaves.errors == ["request cancelled"]
    assert not engine.jobs
    json.dumps([r[0]["finish_reason"][0].decode() for r in stays.responses])


def test_a_stream_without_running_totals_gets_them_on_its_last_response_only(tiny_pair):
    """stream_totals=False (the OpenAI front end's): every response but the last carries the step's
    text, ids and acceptance lengths alone; the last carries every output, with the same totals and
    the same tokens as a stream that asked for totals throughout."""
    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.sampling_params import SamplingParams
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig
    from trtllm_dflash.served_model.protocol import OUTPUTS, STEP_OUTPUTS, GenerateInputs, parse_inputs

    assert parse_inputs({"text_input": np.array([b"abc"])}).stream_totals  # the default: totals on every response
    config = ServingConfig(target=str(tiny_pair[0]), drafter=str(tiny_pair[1]), max_context=128, max_tokens=64)
    engine = BatchingLoop(config, open_served_pipeline(config))
    lean, full = RecordingSink(raise_errors=True), RecordingSink(raise_errors=True)
    params = SamplingParams(max_new_tokens=24)
    engine.accept(GenerateInputs("abc", params, streaming=True, stream_totals=False), lean)
    engine.accept(GenerateInputs("abc", params, streaming=True), full)
    serve_until(engine, lambda: lean.finished and full.finished)
    assert len(lean.responses) > 2
    assert all(set(outputs) == set(STEP_OUTPUTS) for outputs, final in lean.responses[:-1])
    assert all(set(outputs) == set(OUTPUTS) for outputs, final in full.responses) and set(lean.responses[-1][0]) == set(OUTPUTS)
    reference = engine.pipeline.generate(["abc"], max_new_tokens=24)[0].token_ids
    for sink in (lean, full):
        assert [int(t) for outputs, _ in sink.responses for t in outputs["output_ids"]] == reference
    for name in ("num_output_tokens", "num_input_tokens", "total_draft_tokens", "finish_reason"):
        assert lean.responses[-1][0][name].tolist() == full.responses[-1][0][name].tolist(), name


def test_the_loop_takes_a_prompt_as_token_ids_without_tokenizing_it(tiny_pair, monkeypatch):
    """The OpenAI front end sends the ids it tokenized (and counted) itself: the model decodes them as
    they are, the same output as the prompt's text; ids outside the vocabulary are refused."""
    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.sampling_params import SamplingParams
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig
    from trtllm_dflash.served_model.protocol import GenerateInputs

    config = ServingConfig(target=str(tiny_pair[0]), drafter=str(tiny_pair[1]), max_context=128, max_tokens=64)
    engine = BatchingLoop(config, open_served_pipeline(config))
    ids = engine.pipeline.encode("abc")
    monkeypatch.setattr(engine.pipeline, "encode", lambda text: pytest.fail("a prompt sent as ids was tokenized again"))
    sink = RecordingSink()
    engine.accept(GenerateInputs("", SamplingParams(max_new_tokens=12), token_ids=tuple(ids), exclude_input=False), sink)
    with pytest.raises(DFlashError, match="prompt token ids must be in"):
        engine.accept(GenerateInputs("", SamplingParams(max_new_tokens=12), token_ids=(1, 10**9)), RecordingSink())
    serve_until(engine, lambda: sink.finished)
    monkeypatch.undo()
    reference = engine.pipeline.generate(["abc"], max_new_tokens=12)[0]
    assert [int(t) for r in sink.responses for t in r[0]["output_ids"]] == reference.token_ids
    # exclude_input=False: the text starts with the prompt, decoded from its ids
    assert sink.responses[-1][0]["text_output"][0].decode() == "abc" + reference.text


def test_the_model_validates_a_request_once_and_checks_its_prompt_once(tiny_pair, monkeypatch):
    """A request through the served model runs SamplingParams.validate and the prompt's token check
    once each, in accept(): the loop's admission does not check it again (issue 38: it ran 3 times)."""
    from trtllm_dflash import decoding, sampling_params
    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig
    from trtllm_dflash.served_model.protocol import GenerateInputs

    config = ServingConfig(target=str(tiny_pair[0]), drafter=str(tiny_pair[1]), max_context=128, max_tokens=64)
    engine = BatchingLoop(config, open_served_pipeline(config))
    calls = {"validate": 0, "prompt": 0}
    validate, check_tokens = sampling_params.SamplingParams.validate, decoding.check_prompt_tokens

    def counted_validate(self):
        calls["validate"] += 1
        return validate(self)

    def counted_check(count, max_context):
        calls["prompt"] += 1
        return check_tokens(count, max_context)

    monkeypatch.setattr(sampling_params.SamplingParams, "validate", counted_validate)
    monkeypatch.setattr(decoding, "check_prompt_tokens", counted_check)
    sink = RecordingSink(raise_errors=True)
    engine.accept(GenerateInputs("abc", sampling_params.SamplingParams(max_new_tokens=8), streaming=True), sink)
    serve_until(engine, lambda: sink.finished)
    assert calls == {"validate": 1, "prompt": 1}
    with pytest.raises(DFlashError, match="context"):  # and the checks still refuse what they must
        engine.accept(GenerateInputs("", sampling_params.SamplingParams(max_new_tokens=8), token_ids=(5,) * 200), RecordingSink())
    with pytest.raises(sampling_params.SamplingError, match="temperature"):
        engine.accept(GenerateInputs("abc", sampling_params.SamplingParams(temperature=-1.0)), RecordingSink())


def test_repo_from_a_build_uses_its_engines_when_built_else_its_checkpoints(tiny_pair, tmp_path):
    """What `repo --build` reads: the build's artifact in manifest.json (backends/artifact.py)."""
    from trtllm_dflash.served_model.model_parameters import ServingConfig

    target, drafter = tiny_pair
    build = tmp_path / "build"
    build.mkdir()
    manifest = {
        "format": 1,
        "planned": ["checkpoints", "engines"],
        "stages": {
            "checkpoints": {"status": "complete", "dir": "checkpoints"},
            "engines": {"status": "blocked", "missing": "a GPU", "how_to_get_it": "run on a GPU machine"},
        },
        "artifact": {
            "backend": "trt",
            "recipe": "tiny",
            "target": str(target),
            "drafter": str(drafter),
            "limits": {"max_batch": 8, "max_input_len": 200, "max_seq_len": 512, "block_size": 4},
        },
    }
    (build / "manifest.json").write_text(json.dumps(manifest))

    def served(repo):
        return {
            name: ServingConfig.from_parameters(
                {k: v.string_value for k, v in _parse_pbtxt(repo / name / "config.pbtxt").parameters.items()}
            )
            for name in ("dflash", "ar")
        }

    result = invoke("repo", "--build", str(build), "--out", str(tmp_path / "repo"))
    assert result.exit_code == 0, result.output
    configs = served(tmp_path / "repo")
    assert configs["dflash"].backend == "torch" and configs["dflash"].drafter == str(drafter)
    assert (configs["dflash"].max_batch, configs["dflash"].max_context, configs["dflash"].max_tokens, configs["dflash"].block_size) == (
        8,
        512,
        312,
        4,
    )
    assert configs["ar"].drafter is None
    # served as the model in the repository opens it: the torch runtime, drafting with the build's drafter
    from trtllm_dflash.backends import open_served_pipeline

    pipeline = open_served_pipeline(configs["dflash"].resolved(tmp_path / "repo" / "dflash"))
    out = pipeline.generate(["abc"], max_new_tokens=6, block_size=configs["dflash"].block_size)[0]
    assert pipeline.speculative and out.token_ids and out.acceptance_lengths and out.draft_lengths[0] == 3  # block 4: 3 drafts verified
    manifest["stages"]["engines"] = {"status": "complete", "dir": "engines", "summary": {}}
    manifest["artifact"]["engines"] = "engines"
    (build / "manifest.json").write_text(json.dumps(manifest))
    from trtllm_dflash.backends import read_build_artifact, write_build_repository

    configs = served(write_build_repository(read_build_artifact(build), build / "repository"))
    assert configs["dflash"].backend == "trt" and configs["dflash"].engines == str(build / "engines")
    _fails(invoke("repo", "--build", str(tmp_path), "--out", str(tmp_path / "r2")), "no manifest.json")
    del manifest["artifact"]
    (build / "manifest.json").write_text(json.dumps(manifest))
    _fails(invoke("repo", "--build", str(build), "--out", str(tmp_path / "r3")), "records no artifact")


def test_repo_for_the_demo_takes_its_limits_from_the_demo_recipe(tmp_path):
    from trtllm_dflash.demo import DEMO_DIR
    from trtllm_dflash.recipes import find_recipe
    from trtllm_dflash.served_model.model_parameters import ServingConfig

    if not (DEMO_DIR / "target" / "config.json").is_file():
        pytest.skip("the embedded demo pair is not in this checkout")
    recipe = find_recipe("demo", "cpu")
    result = invoke("repo", "--model", "demo", "--out", str(tmp_path / "repo"), "--max-batch", "4")
    assert result.exit_code == 0, result.output
    parameters = _parse_pbtxt(tmp_path / "repo" / "dflash" / "config.pbtxt").parameters
    config = ServingConfig.from_parameters({k: v.string_value for k, v in parameters.items()})
    assert (config.target, config.drafter) == ("demo", "demo")
    assert config.max_context == recipe.limits.max_seq_len
    assert config.max_tokens == recipe.limits.max_seq_len - recipe.limits.max_input_len
    assert config.block_size == recipe.drafter.block_size
    assert config.max_batch == 4  # a flag overrides the recipe


def test_recipe_draft_length_schedule_reaches_the_served_decoder(tmp_path):
    """A recipe's draft_len_schedule is written to config.pbtxt and parsed back into the model's decoder."""
    from trtllm_dflash.demo import DEMO_DIR
    from trtllm_dflash.recipes import find_recipe
    from trtllm_dflash.served_model.model_parameters import ServingConfig

    if not (DEMO_DIR / "target" / "config.json").is_file():
        pytest.skip("the embedded demo pair is not in this checkout")
    text = find_recipe("demo", "cpu").path.read_text()
    recipe = tmp_path / "demo-scheduled.yaml"
    recipe.write_text(text.replace("  block_size: 8\n", "  block_size: 8\n  draft_len_schedule: {1: 7, 4: 3, 16: 0}\n"))
    result = invoke("repo", "--recipe", str(recipe), "--out", str(tmp_path / "repo"))
    assert result.exit_code == 0, result.output
    parameters = {k: v.string_value for k, v in _parse_pbtxt(tmp_path / "repo" / "dflash" / "config.pbtxt").parameters.items()}
    assert parameters["draft_len_schedule"] == "1:7,4:3,16:0"
    assert ServingConfig.from_parameters(parameters).draft_len_schedule == {1: 7, 4: 3, 16: 0}
    ar = {k: v.string_value for k, v in _parse_pbtxt(tmp_path / "repo" / "ar" / "config.pbtxt").parameters.items()}
    assert "draft_len_schedule" not in ar
    with pytest.raises(DFlashError, match="not a schedule like"):
        ServingConfig.from_parameters({"target": "demo", "draft_len_schedule": "1=7"})


def test_config_strings_round_trip_through_protobuf_text_format():
    """Paths with spaces, quotes, backslashes, control and non-ASCII characters read back exactly
    as Triton's parser reads config.pbtxt (json.dumps' \\u escapes did not: Triton saw mangled paths)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from trtllm_dflash.served_model.repository import pbtxt_string

    value = '/data/ü 日本/"quoted" back\\slash\ttab'
    text = f'name: "m"\nparameters {{ key: "target" value: {{ string_value: {pbtxt_string(value)} }} }}'
    assert text.isascii()
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert parsed.parameters["target"].string_value == value


def test_serving_limits_are_worked_out_once():
    """repo, the OpenAI front end and the batching loop read a model's limits from one function."""
    from trtllm_dflash.served_model.model_parameters import RecipeLimits, ServingConfig, ServingLimits, serving_limits

    assert serving_limits(256, 1000) == ServingLimits(256, 255, 128)  # the prompt keeps at least one token
    assert serving_limits(256, 32, 64) == ServingLimits(256, 32, 32)
    assert serving_limits(4096, 512, 16) == ServingLimits(4096, 512, 16)
    assert RecipeLimits(max_seq_len=8192, max_input_len=6144).parameters() == {"max_context": 8192, "max_tokens": 2048}
    assert RecipeLimits(max_input_len=6144).parameters() == {}
    config = ServingConfig(target="demo", max_context=300, max_tokens=400)
    assert config.limits() == ServingLimits(300, 299, 128) and config.limits(200).max_new_tokens == 199


def test_your_own_drafter_is_planned_and_recorded_with_absolute_paths(tiny_pair, tmp_path, monkeypatch):
    """`plan --drafter` and `build --model DIR --drafter DIR` plan the drafter given (its block size,
    taps and memory from its config.json, not the catalog's none), and a build records both
    directories absolute even when given relative: the manifest, the repository and the served
    model read them from other folders."""
    from trtllm_dflash.builder.spec import resolve_spec
    from trtllm_dflash.builder.stage_plan import make_build_plan

    target, drafter = tiny_pair
    taps = json.loads((drafter / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    result = invoke("plan", "--model", str(target), "--gpu", "h100", "--drafter", str(drafter), "--json")
    assert result.exit_code == 0, result.output
    planned = json.loads(result.output)
    assert planned["drafter"] == str(drafter.resolve()) and planned["block_size"] == 8 and planned["budget"]["drafter_weights"] > 0
    _fails(invoke("plan", "--model", str(target), "--gpu", "h100", "--drafter", str(tmp_path)), "is not a drafter directory")

    monkeypatch.chdir(target.parent)  # ./target and ./drafter, as a user types them
    spec = resolve_spec(target.name, "h100", None, None, drafter.name)
    assert (spec.recipe.model.checkpoint, spec.recipe.drafter.checkpoint) == (str(target.resolve()), str(drafter.resolve()))
    assert spec.plan.drafter == str(drafter.resolve()) and spec.plan.block_size == 8
    export = next(stage for stage in make_build_plan(spec).stages if stage.name == "export")
    assert f"hidden taps {taps}" in export.action


def test_repo_keeps_max_tokens_below_the_context_it_is_given(tiny_pair, tmp_path):
    """--max-context alone: the default max_tokens (1024) cannot hold beside a 512-token context."""
    target, drafter = tiny_pair
    out = tmp_path / "repo"
    result = invoke("repo", "--model", str(target), "--drafter", str(drafter), "--out", str(out), "--max-context", "512")
    assert result.exit_code == 0, result.output
    config = _parse_pbtxt(out / "dflash" / "config.pbtxt")
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    assert (parameters["max_context"], parameters["max_tokens"]) == ("512", "511")
