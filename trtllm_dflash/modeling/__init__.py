"""PyTorch modeling: the DFlash drafter and the KV caches of the torch runtime."""

from trtllm_dflash.modeling.drafter import DFlashDrafter

__all__ = ["DFlashDrafter"]
