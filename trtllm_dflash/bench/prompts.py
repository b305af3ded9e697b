"""Prompt sets for `dflash-trt bench`: built in (no download) or a JSONL file.

The built-in sets follow the paper's categories at a small scale: `code` (function stubs in the
spirit of HumanEval/MBPP), `math` (word problems in the spirit of GSM8K/MATH-500) and `chat`
(open instructions in the spirit of MT-Bench). `stdlib` is the embedded demo's held-out set:
function openings from standard-library files the demo pair never saw in training.

Code prompts end at the end of a line, without the newline: byte-level BPE tokenizers merge a
newline with the following indentation, so a prompt ending in a bare newline is unnatural input.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_dflash.errors import DFlashError

CODE = [
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""',
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards, ignoring case."""',
    'def flatten(items):\n    """Flatten a list of lists into one list."""\n    result = []',
    'def read_config(path):\n    """Read a key = value configuration file into a dict."""\n    config = {}\n    with open(path) as f:',
    'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):',
    'def parse_args(argv=None):\n    parser = argparse.ArgumentParser(description="Copy files.")',
    'def merge_sorted(a, b):\n    """Merge two sorted lists into one sorted list."""\n    i = j = 0',
    'def count_words(text):\n    """Return a dict mapping each word to the number of times it occurs."""',
    'def binary_search(items, target):\n    """Return the index of target in the sorted list items, or -1."""\n'
    "    lo, hi = 0, len(items) - 1",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def __repr__(self):",
    "def _check_type(value, name):\n    if not isinstance(value, str):\n        raise TypeError(",
    'import os\nimport sys\n\n\ndef main():\n    """Print every file below the current directory."""',
]

MATH = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer: Let's think step by step.",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?\n"
    "Answer: Let's think step by step.",
    "Solve for x: 3x + 7 = 22. Show each step.",
    "What is the sum of all positive divisors of 36?",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h?",
    "Compute the derivative of f(x) = x^3 - 4x^2 + 2x - 5.",
    "If a rectangle has a perimeter of 30 and a length of 9, what is its area?",
    "Find the greatest common divisor of 84 and 120 using the Euclidean algorithm.",
    "def solve():\n    # A shop sells pens at 3 dollars each and notebooks at 5 dollars each.\n"
    "    # How much do 4 pens and 2 notebooks cost?",
    "How many ways can 5 people be seated in a row if two of them must sit next to each other?",
]

CHAT = [
    "Write a short, friendly email inviting the team to a Friday lunch.",
    "Explain the difference between a list and a tuple in Python to a beginner.",
    "Give me three tips for writing clear commit messages.",
    "Summarise the plot of Romeo and Juliet in four sentences.",
    "What are the pros and cons of working from home?",
    "Compose a haiku about autumn rain.",
    "How do I politely decline a meeting invitation?",
    "Describe how a hash table works, step by step.",
    "Suggest a name for a coffee shop that also sells books, and explain why.",
    "You are a travel guide. Plan a one-day walking tour of Rome.",
]

BUILTIN = {"code": CODE, "math": MATH, "chat": CHAT}
SET_NAMES = (*BUILTIN, "stdlib")


def load_prompt_set(name_or_path: str, limit: int | None = None) -> list[str]:
    """A built-in set by name (code, math, chat, stdlib) or a JSONL file with a "prompt" per line."""
    if name_or_path in BUILTIN:
        prompts = list(BUILTIN[name_or_path])
    elif name_or_path == "stdlib":
        from trtllm_dflash.demo import DEMO_DIR

        prompts = read_jsonl_prompts(DEMO_DIR / "heldout_prompts.jsonl")
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise DFlashError(
                f"prompt set {name_or_path!r} is neither a built-in set nor a file",
                f'use one of {", ".join(SET_NAMES)} or a JSONL file with a "prompt" field per line',
            )
        prompts = read_jsonl_prompts(path)
    if limit is not None:
        prompts = prompts[:limit]
    if not prompts:
        raise DFlashError(f"prompt set {name_or_path!r} is empty", "add prompts or pick another set")
    return prompts


def read_jsonl_prompts(path: Path) -> list[str]:
    """Prompts from JSONL (`{"prompt": ...}` per line; blank lines are skipped)."""
    if not path.is_file():
        raise DFlashError(f"prompt file {path} does not exist", "rebuild the demo pair or pass another prompt set")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompt = json.loads(line)["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DFlashError(f'{path}:{number} is not a JSON object with a "prompt" string', "fix that line") from None
        if not isinstance(prompt, str) or not prompt.strip():
            raise DFlashError(f"{path}:{number} has an empty or non-string prompt", "fix that line")
        prompts.append(prompt)
    return prompts
