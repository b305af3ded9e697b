"""Grammar-constrained decoding stays lossless under speculation (runtime/grammar.py, issue 42).

Greedy: DFlash under a grammar gives, token for token, what the target alone gives under the same
mask, and what an independent loop gives (the target's full forward per token, the mask from a
fresh matcher, argmax); the answers parse and follow the schema, or end with "length". Sampling:
thousands of seeded requests under a grammar whose mask depends on the prefix reproduce the
target's masked distribution (chi-square against an enumeration that computes the mask by hand).
"""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import chisquare

from trtllm_dflash import DFlashPipeline, demo
from trtllm_dflash.checkpoints import load_target
from trtllm_dflash.contracts.grammar_spec import GrammarSpec
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.ops import reference
from trtllm_dflash.runtime.grammar import GrammarError, GrammarState
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

xgr = pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["name", "count"],
    "additionalProperties": False,
}
PROMPTS = ["def fib(n):", "import os\n", "class Stack:", 'config = {"name": "demo", "count": 3}\nother = ']
GRAMMARS = {
    "json_schema": GrammarSpec("json_schema", json.dumps(SCHEMA)),
    "json_object": GrammarSpec("json_object"),
    "regex": GrammarSpec("regex", r"[a-z_]+\(\d+\)"),
    "choice": GrammarSpec("choice", json.dumps(["yes, sir", "no.", "maybe (later)"])),
}


@pytest.fixture(scope="module")
def pipelines():
    return DFlashPipeline.load(demo.target_dir(), demo.drafter_dir()), DFlashPipeline.load(demo.target_dir())


def masked_greedy_reference(pipeline: DFlashPipeline, spec: GrammarSpec, prompt: str, max_new_tokens: int) -> list[int]:
    """The target alone, one full forward per token, its logits masked by a fresh matcher, argmax."""
    model = pipeline.runtime.target if hasattr(pipeline.runtime, "target") else None
    model = model or load_target(demo.target_dir()).model
    state = pipeline.grammar_state(spec)
    ids, out = pipeline.encode(prompt), []
    bitmask = xgr.allocate_token_bitmask(1, pipeline.runtime.vocab_size)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids + out])).logits[0, -1].float()
        state.matcher.fill_next_token_bitmask(bitmask, 0)
        allowed = ((bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).bool().view(-1)[: logits.shape[0]]
        token = int(logits.masked_fill(~allowed, float("-inf")).argmax())
        out.append(token)
        if token in pipeline.stop_token_ids:
            break
        assert state.matcher.accept_token(token)
    return out


@pytest.mark.parametrize("kind", list(GRAMMARS))
def test_greedy_dflash_under_a_grammar_is_the_target_s_masked_greedy(pipelines, kind):
    dflash, ar = pipelines
    spec = GRAMMARS[kind]
    speculative = dflash.generate(PROMPTS, max_new_tokens=40, grammar=spec)
    alone = ar.generate(PROMPTS, max_new_tokens=40, grammar=spec)
    assert [r.token_ids for r in speculative] == [r.token_ids for r in alone]
    assert any(max(r.acceptance_lengths) > 1 for r in speculative)  # drafts were accepted under the mask
    for prompt, result in zip(PROMPTS[:2], speculative):
        assert result.token_ids[: len(result.token_ids)] == masked_greedy_reference(ar, spec, prompt, 40)[: len(result.token_ids)]
    for result in speculative:
        if result.finish_reason == "stop":  # complete: it parses and follows the grammar
            if kind == "json_schema":
                value = json.loads(result.text)
                assert set(value) == {"name", "count"} and isinstance(value["name"], str) and isinstance(value["count"], int)
            elif kind == "json_object":
                assert isinstance(json.loads(result.text), dict)
            elif kind == "choice":
                assert result.text in json.loads(spec.value)
        else:  # cut by max_new_tokens: never claimed complete
            assert result.finish_reason == "length"


def test_rows_without_a_grammar_decode_as_without_one(pipelines):
    """A batch mixing a grammar row with free rows: the free rows are untouched by the masks."""
    dflash, _ = pipelines
    free = dflash.generate(PROMPTS[:2], max_new_tokens=24)
    decoder = dflash.decoder(3)
    params = SamplingParams(max_new_tokens=24, stop_token_ids=dflash.stop_token_ids)
    spec = GRAMMARS["regex"]
    mixed = decoder.generate(
        [
            Request(dflash.encode(PROMPTS[0]), params),
            Request(
                dflash.encode(PROMPTS[2]),
                SamplingParams(max_new_tokens=24, stop_token_ids=dflash.stop_token_ids, grammar=spec),
                grammar=dflash.grammar_state(spec),
            ),
            Request(dflash.encode(PROMPTS[1]), params),
        ]
    )
    assert [mixed[0].token_ids, mixed[2].token_ids] == [r.token_ids for r in free]
    assert mixed[1].token_ids == dflash.generate([PROMPTS[2]], max_new_tokens=24, grammar=spec)[0].token_ids


def test_bad_grammars_and_combinations_are_refused_in_one_line(pipelines):
    dflash, _ = pipelines
    for spec, words in [
        (GrammarSpec("json_schema", "{not json"), "json_schema grammar cannot be compiled"),
        (GrammarSpec("json_schema", '{"type": "objekt"}'), "json_schema grammar cannot be compiled"),
        (GrammarSpec("regex", "(unclosed"), "regex grammar cannot be compiled"),
        (GrammarSpec("choice", "[]"), "choice must be a non-empty list"),
        (GrammarSpec("yaml", "a: 1"), "kind 'yaml' is not one of"),
    ]:
        with pytest.raises(DFlashError, match=words):
            dflash.grammar_state(spec)
    with pytest.raises(DFlashError, match="ignore_eos cannot be combined with a grammar"):
        SamplingParams(grammar=GRAMMARS["json_object"], ignore_eos=True).validate()
    with pytest.raises(DFlashError, match="has a grammar but no matcher"):
        dflash.decoder(1).check(Request([1, 2], SamplingParams(grammar=GRAMMARS["json_object"])))
    assert issubclass(GrammarError, DFlashError)


# ----------------------------------------------------------------------------- sampling statistics

VOCAB = 8  # tokens are the letters a..h; h (7) is the drafter's mask token, never allowed
PROMPT = [1, 2, 3]
SAMPLES = 3000
# the allowed set of each position depends on the first token: the drafter (which knows nothing of
# it) proposes forbidden tokens often, so rejections under the mask are exercised
REGEX = "a[b-d][b-d][b-d]+|b[c-g][c-g][c-g]+|c[a-g][a-g][a-g]+"
FOLLOWERS = {0: {1, 2, 3}, 1: {2, 3, 4, 5, 6}, 2: set(range(7))}


def allowed_after(prefix: tuple[int, ...]) -> set[int]:
    """The regex's next letters, written out by hand (independent of xgrammar)."""
    return {0, 1, 2} if not prefix else FOLLOWERS[prefix[0]]


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("grammar-small-vocab")
    target = make_tiny_target(root / "target", "llama", seed=11, vocab_size=VOCAB)
    drafter = make_tiny_drafter(root / "drafter", target, seed=12, block_size=4, mask_token_id=VOCAB - 1, target_layer_ids=(1, 2))
    return target, drafter


def letters_grammar() -> GrammarState:
    info = xgr.TokenizerInfo([chr(ord("a") + i) for i in range(VOCAB)], vocab_type=xgr.VocabType.RAW, stop_token_ids=[VOCAB - 1])
    return GrammarState(xgr.GrammarCompiler(info).compile_regex(REGEX), VOCAB)


def masked_distribution(target_dir, temperature, top_k, top_p) -> dict[tuple[int, ...], float]:
    model = load_target(target_dir).model
    params = [torch.tensor([v]) for v in (temperature, top_k, top_p)]
    joint = {(): 1.0}
    for _ in range(3):
        prefixes = [prefix for prefix, prob in joint.items() if prob > 0]  # the grammar's: the others stay at 0
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + list(p) for p in prefixes])).logits[:, -1]
        for i, prefix in enumerate(prefixes):
            forbidden = torch.tensor([t not in allowed_after(prefix) for t in range(VOCAB)])
            logits[i] = logits[i].masked_fill(forbidden, float("-inf"))
        probs = reference.process_logits(logits, *(p.expand(len(prefixes)) for p in params)).double()
        joint = {prefix + (t,): joint[prefix] * float(probs[i, t]) for i, prefix in enumerate(prefixes) for t in range(VOCAB)}
    return joint


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.8, 5, 0.9)], ids=["temperature-1", "top-k-top-p"])
def test_speculative_sampling_under_a_grammar_matches_the_masked_target(small_pair, temperature, top_k, top_p):
    target_dir, drafter_dir = small_pair
    pipe = DFlashPipeline.load(target_dir, drafter_dir, max_context=16)
    decoder = Decoder(pipe.runtime, max_batch=SAMPLES, max_context=16)
    spec = GrammarSpec("regex", REGEX)
    requests = [
        Request(
            PROMPT,
            SamplingParams(max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, grammar=spec),
            grammar=letters_grammar(),
        )
        for seed in range(SAMPLES)
    ]
    results = decoder.generate(requests)
    assert 0 < sum(max(r.acceptance_lengths) > 1 for r in results) < SAMPLES  # drafts accepted and rejected
    samples = [tuple(r.token_ids) for r in results]
    exact = masked_distribution(target_dir, temperature, top_k, top_p)
    for sample in samples:  # nothing outside the grammar, ever
        assert all(token in allowed_after(sample[:i]) for i, token in enumerate(sample))
    for positions in [(0,), (1,), (2,), (0, 1), (0, 1, 2)]:
        expected: dict[tuple, float] = {}
        for seq, prob in exact.items():
            key = tuple(seq[i] for i in positions)
            expected[key] = expected.get(key, 0.0) + prob * SAMPLES
        observed = {key: 0 for key in expected}
        for seq in samples:
            observed[tuple(seq[i] for i in positions)] += 1
        big = [k for k in expected if expected[k] >= 5]
        small = [k for k in expected if 0 < expected[k] < 5]
        obs = [observed[k] for k in big] + ([sum(observed[k] for k in small)] if small else [])
        exp = [expected[k] for k in big] + ([sum(expected[k] for k in small)] if small else [])
        assert chisquare(obs, [e * SAMPLES / sum(exp) for e in exp]).pvalue > 1e-3, positions


def test_drafts_that_follow_the_grammar_are_accepted_more(pipelines, monkeypatch):
    """The drafter's greedy proposals are masked position by position (DraftConstraint): the same
    tokens, and more of each block accepted than with unconstrained drafts (which the target
    rejects wherever the grammar forbids them)."""
    import trtllm_dflash.decoding as decoding

    dflash, _ = pipelines
    spec = GRAMMARS["json_schema"]
    constrained = dflash.generate(PROMPTS, max_new_tokens=40, grammar=spec)
    monkeypatch.setattr(decoding, "draft_constraint", lambda states, greedy: None)
    free = dflash.generate(PROMPTS, max_new_tokens=40, grammar=spec)
    assert [r.token_ids for r in constrained] == [r.token_ids for r in free]
    tau = [sum(r.mean_acceptance_length for r in results) / len(results) for results in (constrained, free)]
    assert tau[0] > tau[1] + 0.5, tau
