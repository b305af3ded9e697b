"""Contracts every layer shares, with no behaviour of their own to speak of.

`names`: the graph tensor names (`input_ids`, `starts`, `cache_lens`, `past_key_{i}`, ...) that
export, the ops, the plugin nodes and every runtime agree on; `draft_window`: which keys a draft
query sees; `request_limits`: the bounds of a request's values that the wire and the sampler share;
`dtypes`: every dtype's spellings and size, in one table; `defaults`: the default sizes (context,
batch, new tokens) by role, which the code and the `--help` texts read; `drafter_kinds`: the
drafter kinds' names and architectures.
They import nothing of the package, so any room may import them (`dtypes` and `defaults` import
neither torch nor onnx: planning reads them without either).
"""
