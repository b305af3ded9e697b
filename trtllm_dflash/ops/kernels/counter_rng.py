"""The counter RNG of `trtllm_dflash/ops/rng.py` in Triton, on uint32, and the IEEE-accurate exp/log
that the exponential race samples with: the jitted helpers of `verify.py` and `dflash2.py`.

A kernel's jitted helpers must be of its own kind (compiled or interpreted), so a kernel file loads
this one through `kernels.load` in its own form; no kernel lives here.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from trtllm_dflash.ops import rng

GOLDEN = tl.constexpr(rng.GOLDEN32)


# ----------------------------------------------------------------------------- precise math
# The interpreter runs numpy's float32 exp/log (it has no libdevice); compiled kernels call
# libdevice's IEEE-accurate expf/logf instead of ex2.approx/lg2.approx. Which one is decided when
# `kernels.load` executes this file in its interpreted or compiled form.

if triton.knobs.runtime.interpret:

    @triton.jit
    def precise_exp(x):
        return tl.exp(x)

    @triton.jit
    def precise_log(x):
        return tl.log(x)

else:

    @triton.jit
    def precise_exp(x):
        return libdevice.exp(x)

    @triton.jit
    def precise_log(x):
        return libdevice.log(x)


# ----------------------------------------------------------------------------- counter RNG


@triton.jit
def hash32(x):
    """lowbias32 on uint32 (wrap-around multiplication), as `rng.hash32`."""
    x = x ^ (x >> 16)
    x = x * tl.full((), 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full((), 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def counter_key(seed, position, STREAM_MIX: tl.constexpr):
    """`rng.counter_key`: the low 32 bits of seed and position, hashed with the stream."""
    key = hash32(seed.to(tl.uint32))
    key = hash32(key ^ position.to(tl.uint32))
    return hash32(key ^ tl.full((), STREAM_MIX, tl.uint32))


@triton.jit
def uniform_from_key(key, index):
    """`rng.uniform_from_key`: 24 random bits + 1/2, scaled into (0, 1)."""
    mixed = index.to(tl.uint32) * tl.full((), GOLDEN, tl.uint32) + tl.full((), 1, tl.uint32)
    bits = hash32(key ^ mixed)
    return ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
