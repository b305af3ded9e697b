"""Training data for drafter distillation: files -> token sequences -> (regenerated) batches.

Inputs are text files or directories of them (the text is the training sequence), or JSONL
with one object per line: `{"text": ...}`, `{"prompt": ..., "response": ...}` (the response is
trained, the prompt is context) or `{"messages": [...]}` (chat; rendered with the target
tokenizer's chat template, the last message is the response). With regeneration the responses
are replaced by the target's own greedy continuation of the prompt (the paper's recipe: the
drafter learns what THIS target says, with its template and style), and text sequences are cut
into a prompt (their first tokens) and a regenerated response.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from trtllm_dflash.errors import DFlashError

TEXT_SUFFIXES = frozenset(
    {
        ".py",
        ".txt",
        ".md",
        ".markdown",
        ".mdx",
        ".rst",
        ".tex",
        ".html",
        ".yaml",
        ".yml",
        ".toml",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".hpp",
        ".js",
        ".ts",
        ".go",
        ".rs",
        ".java",
        ".kt",
        ".swift",
        ".rb",
        ".sh",
    }
)
JSONL = ".jsonl"


@dataclasses.dataclass
class Example:
    """One training document: `prompt` is context only (None for plain text), `text` is trained."""

    text: str
    prompt: str | None = None


@dataclasses.dataclass
class TokenSequence:
    """Token ids and the mask of positions the drafter is trained to predict (1 = trained)."""

    input_ids: list[int]
    loss_mask: list[int]

    @property
    def prompt_length(self) -> int:
        """Leading context positions (not trained)."""
        for i, trained in enumerate(self.loss_mask):
            if trained:
                return i
        return len(self.loss_mask)


def find_data_files(paths: Sequence[str | Path]) -> list[Path]:
    """Expand files and directories (recursively) into the data files they hold, sorted."""
    if not paths:
        raise DFlashError("no training data given", "pass --data FILE_OR_DIR (repeatable)")
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise DFlashError(f"data path {path} does not exist", "pass existing files or directories with --data")
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES | {JSONL})
            if not found:
                raise DFlashError(
                    f"data directory {path} holds no text or JSONL files",
                    f"add files ending in {', '.join(sorted(TEXT_SUFFIXES | {JSONL}))}",
                )
            files.extend(found)
        else:
            files.append(path)
    return files


def read_examples(files: Sequence[Path], tokenizer=None) -> list[Example]:
    """Read every file as examples; JSONL lines are validated with the line number on error."""
    examples: list[Example] = []
    for path in files:
        if path.suffix != JSONL:
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                examples.append(Example(text))
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                examples.append(_jsonl_example(line, f"{path}:{number}", tokenizer))
    if not examples:
        raise DFlashError("the training data is empty", "pass files with some text in them")
    return examples


def _jsonl_example(line: str, where: str, tokenizer) -> Example:
    fix = 'write one JSON object per line with "text", "prompt" (+ "response") or "messages"'
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DFlashError(f"{where} is not valid JSON ({exc.msg})", fix) from None
    if not isinstance(record, dict):
        raise DFlashError(f"{where} is not a JSON object", fix)
    if isinstance(record.get("text"), str):
        return Example(record["text"])
    if isinstance(record.get("prompt"), str):
        response = record.get("response", record.get("completion", ""))
        return Example(str(response or ""), prompt=record["prompt"])
    messages = record.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise DFlashError(f"{where} has chat messages but the target tokenizer has no chat template", "use prompt/response records")
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        return Example(str(messages[-1].get("content", "")), prompt=prompt)
    raise DFlashError(f"{where} has none of the fields text, prompt, messages", fix)


def tokenize_examples(tokenizer, examples: Sequence[Example], seq_len: int, min_length: int = 8) -> list[TokenSequence]:
    """Token sequences of at most `seq_len`: long texts are cut into windows, prompts are kept whole."""
    eos = tokenizer.eos_token_id
    sequences: list[TokenSequence] = []
    for example in examples:
        ids = list(tokenizer(example.text, add_special_tokens=False, verbose=False)["input_ids"])
        if example.prompt is None:
            if eos is not None:
                ids.append(eos)
            for start in range(0, len(ids), seq_len):
                window = ids[start : start + seq_len]
                if len(window) >= min_length:
                    sequences.append(TokenSequence(window, [1] * len(window)))
            continue
        prompt = list(tokenizer(example.prompt, add_special_tokens=False, verbose=False)["input_ids"])
        if not prompt:
            continue
        prompt = prompt[-(seq_len - 1) :]  # keep the end of an over-long prompt, next to the response
        response = ids + ([eos] if eos is not None and ids else [])
        response = response[: seq_len - len(prompt)]
        sequences.append(TokenSequence(prompt + response, [0] * len(prompt) + [1] * len(response)))
    return sequences


@torch.no_grad()
def regenerate(
    model: torch.nn.Module,
    sequences: Sequence[TokenSequence],
    prompt_tokens: int,
    seq_len: int,
    stop_token_ids: Sequence[int] = (),
    max_batch: int = 16,
    on_done: Callable[[int], None] | None = None,
) -> list[TokenSequence]:
    """Replace each sequence's trained part by the target's greedy continuation of its prompt.

    The prompt is the untrained prefix (prompt/response data) or the first `prompt_tokens`
    tokens (plain text). Generation runs on this package's own decoding loop (autoregressive),
    so it is exactly what the target says at temperature 0.
    """
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    prompts = []
    for sequence in sequences:
        length = sequence.prompt_length or prompt_tokens
        length = min(length, len(sequence.input_ids), seq_len - 1)
        prompts.append(sequence.input_ids[:length])
    decoder = Decoder(TorchRuntime(model), max_batch=max_batch, max_context=seq_len)
    ids = [
        decoder.submit(Request(prompt, SamplingParams(max_new_tokens=seq_len - len(prompt), stop_token_ids=tuple(stop_token_ids))))
        for prompt in prompts
    ]
    done: dict = {}
    while decoder.has_work:
        for event in decoder.step():
            if event.finished:
                done[event.request_id] = event.result
                if on_done is not None:
                    on_done(1)
    out = []
    for request_id, prompt in zip(ids, prompts):
        generated = done[request_id].token_ids
        out.append(TokenSequence(prompt + generated, [0] * len(prompt) + [1] * len(generated)))
    return out


def to_tensors(sequences: Sequence[TokenSequence]) -> dict[str, torch.Tensor]:
    """A flat, safetensors-friendly form of a sequence list (for the run's data cache)."""
    lengths = torch.tensor([len(s.input_ids) for s in sequences], dtype=torch.int64)
    return {
        "tokens": torch.tensor([t for s in sequences for t in s.input_ids], dtype=torch.int64),
        "loss_mask": torch.tensor([m for s in sequences for m in s.loss_mask], dtype=torch.uint8),
        "lengths": lengths,
    }


def from_tensors(tensors: dict[str, torch.Tensor]) -> list[TokenSequence]:
    tokens, masks = tensors["tokens"].tolist(), tensors["loss_mask"].tolist()
    out, start = [], 0
    for length in tensors["lengths"].tolist():
        out.append(TokenSequence(tokens[start : start + length], masks[start : start + length]))
        start += length
    return out


def batch_order(num_sequences: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Sequence indices of training step `step`: a fresh seeded permutation every epoch.

    A pure function of (step, seed), so a resumed run sees exactly the batches it would have seen.
    """
    per_epoch = max(1, num_sequences // batch_size)
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(num_sequences, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[index * batch_size : (index + 1) * batch_size].tolist()


def collate(sequences: Sequence[TokenSequence], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids [b, S]` and `loss_mask [b, S]` (padding is never trained)."""
    width = max(len(s.input_ids) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence.input_ids)] = torch.tensor(sequence.input_ids)
        loss_mask[row, : len(sequence.loss_mask)] = torch.tensor(sequence.loss_mask)
    return input_ids, loss_mask


def iterate_batches(
    sequences: Sequence[TokenSequence], batch_size: int, seed: int, pad_id: int, start_step: int = 0
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """(indices, input_ids, loss_mask) for steps start_step, start_step + 1, ..."""
    step = start_step
    while True:
        indices = batch_order(len(sequences), min(batch_size, len(sequences)), step, seed)
        yield (indices, *collate([sequences[i] for i in indices], pad_id))
        step += 1
