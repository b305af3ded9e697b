"""Every registered drafter kind (trtllm_dflash.drafters): chosen by its config, loaded and saved as
itself, exported with its head, lossless at temperature 0 on the torch runtime."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support import hf_greedy

from trtllm_dflash import DFlashPipeline
from trtllm_dflash.catalog.drafters_dflash2 import V2_DRAFTERS
from trtllm_dflash.catalog.models import MODELS
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.config import V2_DEFAULTS
from trtllm_dflash.contracts.drafter_kinds import DFLASH, DFLASH2
from trtllm_dflash.drafters import DRAFTER_KINDS, DrafterKind, kind_of
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target, make_tiny_v2_drafter

# One tiny drafter writer per kind: a new kind adds its writer here and runs every test below.
WRITERS = {DFLASH: make_tiny_drafter, DFLASH2: make_tiny_v2_drafter}
KINDS = sorted(DRAFTER_KINDS)


def test_every_kind_has_a_writer_and_one_name():
    assert sorted(WRITERS) == KINDS
    assert all(isinstance(kind, DrafterKind) and DRAFTER_KINDS[name] is kind and kind.name == name for name, kind in DRAFTER_KINDS.items())
    assert len({kind.architecture for kind in DRAFTER_KINDS.values()}) == len(DRAFTER_KINDS)


def test_an_unknown_kind_is_refused_in_one_line():
    with pytest.raises(DFlashError, match="no drafter kind named 'dflash9'"):
        kind_of(type("C", (), {"kind": "dflash9"})())


def test_catalog_drafters_name_their_kind():
    assert {spec.kind for spec in V2_DRAFTERS.values()} == {DFLASH2}
    assert all(
        kind_of(spec.drafter) is DRAFTER_KINDS[DFLASH]
        for spec in MODELS.values()
        if spec.drafter is not None and not spec.drafter.conv_kernel_size
    )


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("kinds") / "target", "qwen3", seed=3)


@pytest.mark.parametrize("name", KINDS)
def test_a_kind_loads_as_itself_and_its_config_picks_it(tmp_path, target_dir, name):
    kind = DRAFTER_KINDS[name]
    drafter = load_drafter(WRITERS[name](tmp_path / name, target_dir, block_size=4), target=load_target(target_dir))
    assert kind_of(drafter.config) is kind and drafter.config.kind == name
    assert kind.architecture in drafter.config.architectures
    fresh = kind.new_module(drafter.config, kind.module_vocab(drafter.config, None, drafter.state_dict()))
    assert type(fresh) is type(drafter) and fresh.state_dict().keys() == drafter.state_dict().keys()
    assert kind.candidate_selector == hasattr(drafter, "candidate_selector")
    summary = kind.training_summary(drafter.config)
    assert (summary.get("architecture") == kind.architecture) if summary else not kind.candidate_selector


@pytest.mark.parametrize("name", KINDS)
def test_a_kind_names_its_graph_head_and_outputs(tmp_path, target_dir, name):
    kind = DRAFTER_KINDS[name]
    target = load_target(target_dir)
    drafter = load_drafter(WRITERS[name](tmp_path / name, target_dir, block_size=4), target=target)
    head = kind.graph_head(drafter.config, plugin=False)
    model = target.model.model
    graph = kind.new_graph(drafter, model.embed_tokens, target.model.lm_head, False)
    assert graph.drafter is drafter and kind.graph_outputs(head) and kind.graph_sampling_inputs(head) == []


@pytest.mark.parametrize("name", KINDS)
def test_greedy_decoding_equals_the_target_for_every_kind(tmp_path, target_dir, name):
    drafter_dir = WRITERS[name](tmp_path / name, target_dir, seed=5, block_size=4)
    prompts = [[5, 9, 14, 3, 7], [11, 4, 6]]
    out = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64).generate(prompts, max_new_tokens=12, stop_token_ids=())
    reference = load_target(target_dir, dtype=torch.float64).model
    for prompt, result in zip(prompts, out):
        assert result.token_ids == hf_greedy(reference, prompt, 12)


def test_a_v1_config_over_v2_weights_names_the_v2_architecture(tmp_path, target_dir):
    """Tensors of another kind in a checkpoint: the error names the architecture that would load them."""
    import json

    drafter_dir = make_tiny_v2_drafter(tmp_path / "v2", target_dir, block_size=4)
    config = json.loads((drafter_dir / "config.json").read_text())
    config["architectures"] = [DRAFTER_KINDS[DFLASH].architecture]
    for key in V2_DEFAULTS:
        config["dflash_config"].pop(key, None)
    (drafter_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(DFlashError, match=DRAFTER_KINDS[DFLASH2].architecture):
        load_drafter(drafter_dir)


def test_options_of_a_kind_are_not_kinds():
    """A sliding window or a bounded history leaves the kind as it is."""
    from trtllm_dflash.testing.tiny import tiny_drafter_config, tiny_target_config

    config = tiny_drafter_config(tiny_target_config())
    for options in ({"sliding_window_size": 8}, {"causal": True}, {"swa_window_size": 4}):
        assert kind_of(dataclasses.replace(config, **options)) is DRAFTER_KINDS[DFLASH]
