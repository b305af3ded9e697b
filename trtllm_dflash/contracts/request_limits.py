"""The limits every front end applies to a request, in one place (no torch: the OpenAI front end
imports it too). `trtllm_dflash.sampling_params` is what checks them; the decoder's sampler reads
MIN_TEMPERATURE.
"""

# top_k above the vocabulary size means "off".
TOP_K_MAX = 2**31 - 1
# The seed is hashed on its low 32 bits (trtllm_dflash/ops/rng.py, the Triton verify kernel): larger seeds
# are refused rather than silently sharing a smaller seed's random stream.
SEED_MAX = 2**32 - 1
# Below this a temperature is greedy: the sampler divides float32 logits by it, and at ~1e-37 the
# quotient overflows (inf logits: an empty answer that says "stop"); sampling this cold is argmax.
MIN_TEMPERATURE = 1e-5
# A prompt longer than max_context * this many characters is refused without tokenizing it: no
# real text averages that many characters per token (English ~4, code ~3-5; the longest tokens,
# runs of spaces in code vocabularies, are ~45 characters), so the refusal is cheap and never wrong.
PROMPT_CHARS_PER_TOKEN = 64
# Stop strings: every decoding step searches each of them in each request's text.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
# A request's cache_salt (mixed into its prefix-cache hash chain): a tenant name or a random token.
MAX_SALT_CHARS = 256
# Chunked prefill: prompt tokens written per decoding step while other requests decode (the decoder's
# and the served model's default; 0 prefills whole prompts). Large enough that a prompt's chunks run
# near full prefill speed, small enough that a step with a chunk stays within a few decode steps' time.
DEFAULT_PREFILL_CHUNK = 512
# a served model's prefills beside decoding rows take about this share of the decoding time (runtime/step_schedule.py)
DEFAULT_PREFILL_SHARE = 0.3
