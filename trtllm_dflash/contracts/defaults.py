"""Default sizes: one constant per quantity and role, read by the code and by the `--help` texts.

A sequence's length (prompt + generated tokens) and the rows decoded together have a default in
each role below. The roles differ on purpose, because each default sizes a different allocation:
- a served model (ServingConfig, `dflash-trt repo`): its caches hold every row of SERVED_MAX_BATCH
  at SERVED_MAX_CONTEXT, for each model of a repository (DFlash and its baseline), all the time;
- a Decoder built directly (scripts, tests; the pipeline and served models pass their own sizes):
  a small batch at the served length;
- offline generation (DFlashPipeline, `dflash-trt generate`): one process for the prompts given, so a
  longer context, capped at the target's max_position_embeddings;
- a planned deployment (`dflash-trt plan`, recipes, `explain-bytes --model`): a production server's
  sizes, against which memory and traffic are budgeted.
"""

# Tokens generated when a request or a command does not say.
DEFAULT_NEW_TOKENS = 128

SERVED_MAX_CONTEXT = 2048
SERVED_MAX_BATCH = 16
# on by default: chats, agents and system prompts repeat their prefixes on every turn, and the cache only
# ever holds what requests left (at most this much; README "Prefix caching" says what it costs per token)
SERVED_PREFIX_CACHE_MIB = 1024

DECODER_MAX_CONTEXT = SERVED_MAX_CONTEXT
DECODER_MAX_BATCH = 8

GENERATE_MAX_CONTEXT = 4096

PLANNED_CONTEXT = 8192
PLANNED_MAX_BATCH = 64
