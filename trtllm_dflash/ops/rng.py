"""Counter-based random numbers shared by every runtime.

Speculative sampling must be reproducible per request and identical on every runtime (torch on
CPU, the Triton verification kernel on a GPU, a TensorRT plugin), so randomness is a pure
function of (seed, position, stream, index) rather than the state of a generator. The hash is
Chris Wellons' `lowbias32`, written on int64 tensors with explicit 32-bit wrap-around so that
the same integers come out of torch and Triton (which computes it on uint32).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9

# Streams keep the uniforms used for different decisions independent.
STREAM_DRAFT = 1  # drafter sampling of block position k
STREAM_ACCEPT = 2  # accept test of draft token k
STREAM_BONUS = 3  # residual / bonus / first-token sampling


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on the low 32 bits of an int64 tensor; returns values in [0, 2**32)."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def counter_key(seed: torch.Tensor, position: torch.Tensor, stream: int) -> torch.Tensor:
    """Key of one decision: seed per sequence, absolute token position, stream id."""
    key = hash32(seed.to(torch.int64))
    key = hash32(key ^ (position.to(torch.int64) & MASK32))
    return hash32(key ^ ((stream * GOLDEN32) & MASK32))


def uniform_from_key(key: torch.Tensor, index: torch.Tensor | int = 0) -> torch.Tensor:
    """Uniform float32 in (0, 1): 24 random bits, offset by half a step so it is never 0 or 1."""
    bits = hash32(key ^ ((torch.as_tensor(index, dtype=torch.int64) * GOLDEN32 + 1) & MASK32))
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)


def uniform(seed: torch.Tensor, position: torch.Tensor, stream: int) -> torch.Tensor:
    """One uniform per (seed, position) pair, broadcast like the inputs."""
    return uniform_from_key(counter_key(seed, position, stream))
