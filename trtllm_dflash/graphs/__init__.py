"""The target's and the drafter's graph modules, below the runtimes and the builder.

    names.py          the graph tensor-name contract (export, runtimes, traffic, plugin nodes)
    masks.py          visibility masks of the exported graphs
    concat_cache.py   the cache objects of a traced forward pass, and per-layer cache shapes
    target.py         TargetGraph / VerifyingTargetGraph: the target as one prefill/verify step
    drafter.py        DrafterGraph: one block-diffusion drafting step
    dense_experts.py  MoE experts as dense matmuls, for export
    dtypes.py         the graphs' dtypes and casting weights to them

The torch runtime probes per-layer cache shapes through `TargetGraph`; the builder exports these
modules to ONNX (builder/export.py). Nothing here imports the builder, serving, the CLI or the API.
"""
