"""The Python API: load a target (and a DFlash drafter) and generate for a batch of prompts.

    from trtllm_dflash import DFlashPipeline

    pipe = DFlashPipeline.load("Qwen3-8B/", "Qwen3-8B-DFlash-b16/", device="cuda")
    out = pipe.generate(["def fib(n):"], max_new_tokens=64)
    print(out[0].text, out[0].mean_acceptance_length)

Without a drafter the same call decodes autoregressively (the baseline).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import torch

from trtllm_dflash.checkpoints import Target, load_drafter, load_target
from trtllm_dflash.contracts.defaults import DEFAULT_NEW_TOKENS, GENERATE_MAX_CONTEXT
from trtllm_dflash.contracts.grammar_spec import GrammarSpec
from trtllm_dflash.decoding import Decoder, Request, SamplingParams, SequenceResult
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.base import Runtime
from trtllm_dflash.runtime.grammar import GrammarCompiler, GrammarState
from trtllm_dflash.runtime.torch_runtime import TorchRuntime

DEFAULT_MAX_CONTEXT = GENERATE_MAX_CONTEXT  # capped at the target's max_position_embeddings (contracts/defaults.py)


@dataclasses.dataclass
class GenerationOutput(SequenceResult):
    """A SequenceResult plus the decoded text of the generated tokens."""

    text: str = ""

    def to_json(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "acceptance_lengths": self.acceptance_lengths,
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "num_target_forwards": self.num_target_forwards,
            "num_generated_tokens": len(self.token_ids),
            "num_prompt_tokens": len(self.prompt_ids),
            "finish_reason": self.finish_reason,
            "time_to_first_token": round(self.time_to_first_token, 6),
            "elapsed": round(self.elapsed, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
        }


class DFlashPipeline:
    """A runtime, a tokenizer and decoding defaults: the object users generate with."""

    def __init__(
        self,
        runtime: Runtime,
        tokenizer=None,
        stop_token_ids: Sequence[int] = (),
        max_context: int = DEFAULT_MAX_CONTEXT,
    ) -> None:
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.stop_token_ids = tuple(stop_token_ids)
        self.max_context = max_context
        self._decoders: dict[tuple, Decoder] = {}
        self._grammars: GrammarCompiler | None = None  # made at the first grammar (the `grammar` extra)

    @classmethod
    def load(
        cls,
        target: str | Path,
        drafter: str | Path | None = None,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        max_context: int | None = None,
        attention: str = "auto",
        cuda_graphs: bool | None = None,
        attention_choice: str = "dflash",
        verify_choice: str = "positions",
        linear_choice: str = "torch",
        dependent_launch: bool = False,
    ) -> "DFlashPipeline":
        """Load checkpoints from local directories (or `demo`) into the torch runtime
        (`attention`, `cuda_graphs`, `attention_choice`, `verify_choice`, `linear_choice` and
        `dependent_launch` as TorchRuntime takes them; CUDA graphs by default wherever the runtime can
        replay its passes, that is on a GPU). `max_context` is capped at the target's
        max_position_embeddings, as the engine backends cap it at what their engines hold."""
        if device == "cuda" and not torch.cuda.is_available():
            raise DFlashError("--device cuda was asked for but no CUDA GPU is visible", "use --device cpu")
        loaded: Target = load_target(target, device=device, dtype=dtype)
        draft_model = load_drafter(drafter, target=loaded) if drafter is not None else None
        limit = int(getattr(loaded.config, "max_position_embeddings", DEFAULT_MAX_CONTEXT) or DEFAULT_MAX_CONTEXT)
        return cls(
            TorchRuntime(
                loaded.model,
                draft_model,
                attention=attention,
                cuda_graphs=cuda_graphs,
                attention_choice=attention_choice,
                verify_choice=verify_choice,
                linear_choice=linear_choice,
                dependent_launch=dependent_launch,
            ),
            tokenizer=loaded.tokenizer,
            stop_token_ids=loaded.stop_token_ids(),
            max_context=min(max_context or DEFAULT_MAX_CONTEXT, limit),
        )

    @property
    def speculative(self) -> bool:
        return self.runtime.has_drafter

    def decoder(self, max_batch: int, block_size: int | None = None, profile: bool = False) -> Decoder:
        """A decoder over this pipeline's runtime (reused while the shape stays the same)."""
        key = (max_batch, block_size, profile)
        if key not in self._decoders:
            self._decoders.clear()  # one set of caches at a time
            self._decoders[key] = Decoder(
                self.runtime, max_batch=max_batch, max_context=self.max_context, block_size=block_size, profile=profile
            )
        return self._decoders[key]

    def grammar_state(self, spec: GrammarSpec | None) -> GrammarState | None:
        """A new matcher of `spec` for one request (None without a grammar); GrammarError names a bad grammar."""
        if spec is None:
            return None
        if self._grammars is None:
            if self.tokenizer is None:
                raise DFlashError("this target has no tokenizer, so a grammar cannot be compiled", "load a target with its tokenizer")
            self._grammars = GrammarCompiler(self.tokenizer, self.runtime.vocab_size, self.stop_token_ids)
        return self._grammars.state(spec)

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise DFlashError("this target has no tokenizer, so text prompts cannot be encoded", "pass token ids instead")
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def apply_chat_template(self, messages, template_kwargs: dict | None = None) -> str:
        """The prompt text for chat messages (a string is one user message), as the served chat endpoint builds it."""
        from trtllm_dflash.chat import apply_chat_template

        return apply_chat_template(self.tokenizer, messages, template_kwargs)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        max_new_tokens: int = DEFAULT_NEW_TOKENS,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        block_size: int | None = None,
        max_batch: int | None = None,
        profile: bool = False,
        chat: bool = False,
        chat_template_kwargs: dict | None = None,
        grammar: GrammarSpec | None = None,
    ) -> list[GenerationOutput]:
        """Generate for every prompt (text or token ids), batched; results in prompt order.

        `stop_token_ids` defaults to the target's end-of-sequence ids; pass `()` for none.
        `chat=True` makes each text prompt one user message templated with the target's chat
        template (`apply_chat_template`), exactly as the OpenAI-compatible server does, so offline
        and served outputs can be compared token for token. `grammar` constrains every answer
        (a JSON schema, a regex, ...: contracts/grammar_spec.py; needs the `grammar` extra).
        """
        if not prompts:
            raise DFlashError("no prompts given", "pass at least one prompt")
        if chat:
            if not all(isinstance(p, str) for p in prompts):
                raise DFlashError("chat=True needs text prompts", "pass strings, or drop chat=True for token ids")
            prompts = [self.apply_chat_template(p, chat_template_kwargs) for p in prompts]
        token_prompts = []
        for prompt in prompts:
            ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            if not ids:
                raise DFlashError("empty prompt", "give a non-empty prompt")
            token_prompts.append(ids)
        params = SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop_token_ids=tuple(self.stop_token_ids if stop_token_ids is None else stop_token_ids),
            grammar=grammar,
        )
        params.validate()
        decoder = self.decoder(max_batch or len(token_prompts), block_size, profile)
        results = decoder.generate(Request(ids, params, grammar=self.grammar_state(grammar)) for ids in token_prompts)
        return [
            GenerationOutput(**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)}, text=self.decode(r.token_ids)) for r in results
        ]
