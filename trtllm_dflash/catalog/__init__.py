"""Catalogs of the hardware and models that recipes name: GPUs (gpus.py) and model shapes (models.py)."""

from trtllm_dflash.catalog.gpus import GPUS, GPUSpec, detect_local_gpus, resolve_gpu
from trtllm_dflash.catalog.models import MODELS, DrafterSpec, ModelSpec, resolve_model

__all__ = ["GPUS", "GPUSpec", "detect_local_gpus", "resolve_gpu", "MODELS", "DrafterSpec", "ModelSpec", "resolve_model"]
