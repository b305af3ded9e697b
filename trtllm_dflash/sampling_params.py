"""How one request is decoded, and the one check of its values and limits.

Every way in (the Python API, `dflash-trt generate`, the Triton model, the OpenAI front end)
builds a SamplingParams and lets it check itself; each maps a SamplingError to its own words (a
CLI flag, a Triton input, an OpenAI field) with `SamplingError.renamed`, so the ranges and their
messages are written here once. No torch: the OpenAI front end imports it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from trtllm_dflash.contracts.defaults import DEFAULT_NEW_TOKENS
from trtllm_dflash.contracts.grammar_spec import GrammarSpec
from trtllm_dflash.contracts.request_limits import MAX_STOP_CHARS, MAX_STOP_STRINGS, PROMPT_CHARS_PER_TOKEN, SEED_MAX, TOP_K_MAX
from trtllm_dflash.errors import DFlashError


class SamplingError(DFlashError):
    """A sampling value or request limit out of range.

    `field` is the package's name of the value (max_new_tokens, temperature, top_k, top_p, seed,
    stop, prompt); a problem that names it starts with it, so a front end can say it in its own
    words with `renamed`.
    """

    def __init__(self, field: str, problem: str, fix: str | None = None) -> None:
        super().__init__(problem, fix)
        self.field = field

    def renamed(self, names: Mapping[str, str]) -> "SamplingError":
        """The same error with the field called by a front end's name (`--top-k`, `sampling_param_top_k`)."""
        name = names.get(self.field, self.field)
        problem = name + self.problem[len(self.field) :] if self.problem.startswith(self.field) else self.problem
        error = type(self).__new__(type(self))  # the same subclass, with its attributes
        error.__dict__.update(self.__dict__)
        DFlashError.__init__(error, problem, self.fix)
        return error


class PromptTooLongError(SamplingError):
    """A prompt over the maximum context, counted in `unit` ("characters" or "tokens")."""

    def __init__(self, length: int, unit: str, max_context: int, problem: str, fix: str) -> None:
        super().__init__("prompt", problem, fix)
        self.length, self.unit, self.max_context = length, unit, max_context


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    With a `grammar` the answer ends where the grammar ends (its end-of-sequence token), so it is
    refused together with `ignore_eos` and `min_tokens`, which decode on past an end of sequence.

    `stop` holds stop strings: text, so they are applied where tokens become text (the serving
    loop); the Decoder itself stops on `stop_token_ids`. `min_tokens` and `ignore_eos` fix output
    lengths (what benchmark clients send): neither stop tokens nor stop strings end a request
    before `min_tokens` tokens, and with `ignore_eos` stop tokens never do (stop strings, the
    context and max_new_tokens still do).
    """

    max_new_tokens: int = DEFAULT_NEW_TOKENS
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    # a grammar the answer must follow (JSON schema, regex, tool calls: contracts/grammar_spec.py);
    # the target's distribution is masked by it at every position, drafts verified against that
    grammar: GrammarSpec | None = None

    def stops_at(self, generated: int) -> bool:
        """Whether a stop token may end the request when it is generated token number `generated`
        (1-based): not with ignore_eos, and not while fewer than min_tokens tokens came before it."""
        return not self.ignore_eos and generated > self.min_tokens

    def validate(self) -> None:
        """The one range check of a request's sampling values (the API, the CLI, the decoder and
        both served front ends call it): NaN and infinities never reach the sampler, and every
        value fits the int64/float32 tensors and the 32-bit counter-based RNG it is used in."""
        if self.max_new_tokens <= 0:
            raise SamplingError("max_new_tokens", f"max_new_tokens must be > 0, got {self.max_new_tokens}", "pass a positive number")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):  # NaN fails every comparison
            raise SamplingError("temperature", f"temperature must be >= 0 and finite, got {self.temperature}", "use 0 for greedy decoding")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise SamplingError("top_p", f"top_p must be in (0, 1], got {self.top_p}", "use 1 to disable nucleus sampling")
        if not 0 <= self.top_k <= TOP_K_MAX:
            raise SamplingError("top_k", f"top_k must be in [0, {TOP_K_MAX}], got {self.top_k}", "use 0 to disable top-k")
        if self.seed is not None and not 0 <= self.seed <= SEED_MAX:
            raise SamplingError(
                "seed",
                f"seed must be in [0, {SEED_MAX}], got {self.seed}",
                "pass a 32-bit seed (the sampler's random numbers are keyed on 32 bits: a larger seed would repeat a smaller one's)",
            )
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise SamplingError(
                "min_tokens",
                f"min_tokens must be in [0, {self.max_new_tokens}] (no more than the tokens asked for), got {self.min_tokens}",
                "lower min_tokens or ask for more tokens",
            )
        if len(self.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise SamplingError(
                "stop",
                f"stop has {len(self.stop)} strings of up to {max(map(len, self.stop))} characters; "
                f"this server takes at most {MAX_STOP_STRINGS} of at most {MAX_STOP_CHARS} characters",
                "send fewer, shorter stop strings",
            )
        if self.grammar is not None and (self.ignore_eos or self.min_tokens):
            field = "ignore_eos" if self.ignore_eos else "min_tokens"
            raise SamplingError(
                field,
                f"{field} cannot be combined with a grammar: the grammar ends the answer with its end of sequence",
                f"leave {field} out of a grammar-constrained request",
            )

    def check_limit(self, max_new_tokens_limit: int) -> None:
        """A served model's own bound on max_new_tokens (its context and configuration)."""
        if self.max_new_tokens > max_new_tokens_limit:
            raise SamplingError(
                "max_new_tokens",
                f"max_new_tokens {self.max_new_tokens} is above this server's limit of {max_new_tokens_limit}",
                f"ask for at most {max_new_tokens_limit} tokens",
            )


def check_prompt_text(text: str, max_context: int | None) -> None:
    """A prompt's text before it is tokenized: not empty, and not longer than `max_context` tokens
    of text could be (PROMPT_CHARS_PER_TOKEN characters each), so a huge prompt costs nothing."""
    if max_context is not None and len(text) > max_context * PROMPT_CHARS_PER_TOKEN:
        limit = max_context * PROMPT_CHARS_PER_TOKEN
        raise PromptTooLongError(
            len(text),
            "characters",
            max_context,
            f"prompt has {len(text)} characters, more than this server's limit of {limit} "
            f"({PROMPT_CHARS_PER_TOKEN} per token of its maximum context of {max_context})",
            "shorten the prompt",
        )
    if not text.strip():
        raise SamplingError("prompt", "empty prompt", "send a non-empty prompt")


def check_prompt_tokens(count: int, max_context: int | None) -> None:
    """A tokenized prompt: at least one token, and room for at least one new token in the context."""
    if count < 1:
        raise SamplingError("prompt", "empty prompt", "give at least one prompt token")
    if max_context is not None and count >= max_context:
        raise PromptTooLongError(
            count,
            "tokens",
            max_context,
            f"prompt has {count} tokens, which does not fit the maximum context of {max_context}",
            "shorten the prompt",
        )
