"""The jitted helper of the kernels whose last split of a tile finishes it (skinny_linear.py,
attention_merge.py): each split counts itself in on the tile's int32 counter
(`tile_counters.py`), and the one that counts last reads the others' partials.

Memory order: every thread's partials are stored before the block's barrier, the count is an
acquire-release atomic at GPU scope (one per program), and the last split reads the partials
through L2 (`.cg`, at its loads), where the other SMs' stores are; the pattern of CUDA's
threadFenceReduction sample and Triton's stream-K matmuls. The last split sets the counter back
to zero once it has read them.

A kernel's jitted helpers must be of its own kind (compiled or interpreted), so a kernel file loads
this one through `kernels.load` in its own form; no kernel lives here.
"""

import triton
import triton.language as tl


@triton.jit
def is_last_split(counter_ptr, tile, splits):
    """After this program's partials are stored: count it in on `tile`'s counter; True for the
    split that counts last (every partial of the tile is then in)."""
    tl.debug_barrier()  # every thread's partials are stored before the count says so
    return tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu") == splits - 1
