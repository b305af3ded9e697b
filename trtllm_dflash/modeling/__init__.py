"""PyTorch modeling: the DFlash drafter, the KV caches of the torch runtime, FP8 linear layers."""

from trtllm_dflash.modeling.drafter import DFlashDrafter

__all__ = ["DFlashDrafter"]
