"""The names of the exported graphs' inputs and outputs: one contract, written once.

Export names the graph inputs and outputs with them; the ONNX and TensorRT runtimes feed and read
them; CUDA graphs key their static inputs by them; the traffic model recognises tensors by them;
the DFlash plugin nodes name the ports the graphs wire those tensors into by them.
See builder/export.py's docstring for what each tensor holds.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- target graph
INPUT_IDS = "input_ids"  # [b, T] tokens at positions starts[r] + t
STARTS = "starts"  # [b] first position of each row (its committed length)
LOGIT_INDEX = "logit_index"  # [b, n] which of the T positions get logits
LOGITS = "logits"  # [b, n, V] (target) or [b, B - 1, V] (drafter)
FEATURES = "features"  # [b, T, taps * H] the tapped decoder layers' outputs

# the verifying (plugin) target: sampling inputs and the packed verification result
DRAFT_PROBS = "draft_probs"  # [b, drafts, V] float32
TEMPERATURE = "temperature"
TOP_K = "top_k"
TOP_P = "top_p"
SEED = "seed"
SAMPLING_INPUTS = (TEMPERATURE, TOP_K, TOP_P, SEED)  # [b] each, in the graph's input order
RESULT = "result"  # [b, 5] int64 (reference.VERIFY_RESULT_COLUMNS)

# ----------------------------------------------------------------------------- drafter graph
BLOCK_IDS = "block_ids"  # [b, B] anchor + masks
CTX_FEATURES = "ctx_features"  # [b, n, taps * H] new context rows
NEW_COUNTS = "new_counts"  # [b] valid new context rows per row
CACHE_LENS = "cache_lens"  # [b] draft-cache slots already filled per row

# the V2 drafter's head (graphs.json `head`). Native graphs end at the candidate selector's inputs,
# besides LOGITS (the unary logits); the runtime walks the scores:
CANDIDATES = "candidates"  # [b, B - 1, k] int64: the top-k of the unary logits, in TopK's order
# [b, B - 1, k, k] float32: score of candidate i after candidate j of the position before
# (after the anchor at the first)
SELECTOR_SCORES = "selector_scores"
# plugin graphs walk inside (inputs TEMPERATURE and SEED, [b] each) and return the walk:
DRAFT_TOKENS = "draft_tokens"  # [b, B - 1] int64
CANDIDATE_PROBS = "candidate_probs"  # [b, B - 1, k] float32: q over the candidates

# ----------------------------------------------------------------------------- per-layer caches
# `{prefix}_key_{layer}` / `{prefix}_value_{layer}` for each layer that owns a cache:
PAST = "past"  # native graphs' cache inputs (read, never written)
NEW = "new"  # native graphs' outputs: the K/V of the new tokens, written into place by the runtime
CACHE = "cache"  # the verifying target's in-place cache inputs
PRESENT = "present"  # ... and its outputs, aliased to those inputs


def key_prefix(prefix: str) -> str:
    """`{prefix}_key_`: what every key name of that kind starts with."""
    return f"{prefix}_key_"


def key_name(prefix: str, layer: int) -> str:
    """`{prefix}_key_{layer}`, e.g. `past_key_3`."""
    return f"{key_prefix(prefix)}{layer}"


def value_name(prefix: str, layer: int) -> str:
    """`{prefix}_value_{layer}`, e.g. `past_value_3`."""
    return f"{prefix}_value_{layer}"


def cache_names(prefix: str, layers: list[int]) -> tuple[list[str], list[str]]:
    """(key names, value names) of the given layers' caches, in the graphs' input/output order."""
    return [key_name(prefix, i) for i in layers], [value_name(prefix, i) for i in layers]


def prefixes(*kinds: str) -> tuple[str, ...]:
    """`("past_key_", "past_value_", ...)`: the name prefixes of the given cache kinds, for `str.startswith`."""
    return tuple(f"{kind}_{part}_" for kind in kinds for part in ("key", "value"))
