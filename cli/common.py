"""Small helpers shared by the CLI commands."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trtllm_dflash.errors import DFlashError


def quiet_libraries() -> None:
    """Keep library progress bars and warnings out of the command's output."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def read_prompts(prompts: list[str] | None, prompt_file: Path | None) -> list[str]:
    """Prompts from repeated --prompt or a file (one per line, or JSONL with a "prompt" field)."""
    if prompts and prompt_file:
        raise DFlashError("both --prompt and --prompt-file were given", "use one of them")
    if prompt_file is not None:
        if not prompt_file.is_file():
            raise DFlashError(f"prompt file {prompt_file} does not exist", "pass an existing text or JSONL file")
        lines = [line for line in prompt_file.read_text().splitlines() if line.strip()]
        if prompt_file.suffix == ".jsonl":
            try:
                prompts = [json.loads(line)["prompt"] for line in lines]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DFlashError(f'{prompt_file} is not JSONL with a "prompt" field per line', "fix the file") from None
        else:
            prompts = lines
    if not prompts:
        raise DFlashError("no prompt given", "pass --prompt TEXT (repeatable) or --prompt-file FILE")
    for prompt in prompts:
        if not prompt.strip():
            raise DFlashError("empty prompt", "give a non-empty --prompt")
    return list(prompts)


def tau_hint(tau: float | None) -> str | None:
    """What to check when a drafter's drafts are never accepted (tau shown as 1.00), else None."""
    if tau is None or round(tau, 2) > 1.0:
        return None
    return (
        "hint: tau 1.00 means the target accepted none of the drafter's tokens: a drafter from train-drafter may "
        "need more --steps (its training.json has the loss), and the mask token in its config.json "
        "(dflash_config.mask_token_id) must be the one it was trained with (train-drafter --mask-token-id)"
    )
