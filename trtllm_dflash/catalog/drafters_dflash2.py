"""Published DFlash V2 drafters (DFlash2DraftModel, inco.ai), keyed by the catalog name of their target.

Sources (third-party pages, not checked here against the Hugging Face files themselves: unverified):
- z-lab/Qwen3.8-27B-DFlash2 (mirror of incoai/Qwen3.8-27B-DFlash2): config.json quoted verbatim with
  its revision and sha256 in a public test suite (revision 50307d4c): 5 layers, hidden 5120, FFN 17408,
  32 / 8 heads x 128, all 5 layers sliding_attention with window 2048, block 8, taps
  [5, 19, 33, 47, 61], mask 248070, conv K 2 / group 16, selector R 256 / top-k 16, vocab 248320,
  64 target layers. A deployment note gives its payload, 3,848,817,896 bytes in 81 tensors.
- incoai/Muse-Glimmer-30B-DFlash2 (z-lab mirror): config.json quoted verbatim the same way (revision
  b54ffdd1): 5 layers, hidden 6656, FFN 19968, 32 / 8 x 128, 5 sliding layers window 2048, block 16,
  taps [1, 13, 25, 37, 49], mask 201818, output_multiplier 0.19611613513818404, final logit
  softcapping 20, vocab 202048, 52 target layers. Payload 5,544,328,424 bytes in 81 tensors.
Both payloads are reproduced by DrafterSpec.num_params() x 2 bytes (BF16) to within 8,936 bytes,
the size of a safetensors header naming 81 tensors: the V2 parameter count is checked by them.
TensorRT Edge-LLM 0.11 compiles these two drafters; no separately named Edge-LLM DFlash2 checkpoint
was found in the sources available offline, so there is no entry for one.
"""

from __future__ import annotations

from trtllm_dflash.catalog.drafters import SLIDING, DrafterSpec

V2_SIZES = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


def _v2(
    checkpoint: str,
    hidden: int,
    inner: int,
    block: int,
    taps: tuple[int, ...],
    mask_token_id: int,
    payload_bytes: int,
    vocab: int,
    source: str,
) -> DrafterSpec:
    """What the published V2 drafters share: 5 sliding layers (window 2048), 32 / 8 heads x 128, V2_SIZES."""
    return DrafterSpec(
        checkpoint,
        5,
        hidden,
        inner,
        32,
        8,
        128,
        block,
        taps,
        layer_types=(SLIDING,) * 5,
        sliding_window=2048,
        mask_token_id=mask_token_id,
        published_size_gib=payload_bytes / 1024**3,
        vocab_size=vocab,
        source=source,
        **V2_SIZES,
    )


V2_DRAFTERS: dict[str, DrafterSpec] = {
    "qwen3.8-27b": _v2(
        "z-lab/Qwen3.8-27B-DFlash2",
        5120,
        17408,
        8,
        (5, 19, 33, 47, 61),
        248070,
        3_848_817_896,
        248320,
        source="config.json quoted verbatim (revision 50307d4c) in a public test suite; payload 3,848,817,896 bytes "
        "from a deployment note; unverified against the Hugging Face files",
    ),
    "muse-glimmer-30b": _v2(
        "incoai/Muse-Glimmer-30B-DFlash2",
        6656,
        19968,
        16,
        (1, 13, 25, 37, 49),
        201818,
        5_544_328_424,
        202048,
        source="config.json quoted verbatim (z-lab mirror, revision b54ffdd1) in a public test suite; payload "
        "5,544,328,424 bytes from a deployment note; unverified against the Hugging Face files",
    ),
}
