"""The jitted helper that makes a kernel safe to launch as a programmatic dependent launch (PDL).

Why: under a CUDA graph a batch-1 decode pass is ~300 kernels of a few to a few tens of
microseconds each, and between two of them the GPU drains the first and then launches and ramps
up the second. On Hopper and later, a kernel launched with the programmatic stream serialization
attribute (Triton's `launch_pdl=True`) may be scheduled before the kernel ahead of it finishes:
its programs become resident and wait at `griddepcontrol.wait` until that kernel has completed
and its memory is visible, so the gap between the two shrinks to the wait's release.

The rule that keeps it exact: a kernel launched that way calls `wait_for_inputs(True)` first, in
every program, before any load or store, so it reads nothing an earlier kernel is still writing,
writes nothing an earlier kernel still reads, and cannot complete before the kernel ahead of it
(the chain stays in stream order for everything after it). It then lets its own dependents launch
(`griddepcontrol.launch_dependents`): they are scheduled once every program of this kernel has
passed that point, so they never take an SM from one of its programs still waiting to start.
`tests/test_kernel_audit.py` checks the order in each kernel's PTX.

The one thing a kernel may do before its wait is `prefetch_to_l2` of data that no kernel writes
(the skinny projections' weights): a prefetch reads nothing into registers and writes nothing,
and the weight's first tiles then stream into L2 while the kernel ahead is still running, when
the weights would otherwise not stream at all (a norm, RoPE or attention kernel of a batch-1
pass leaves most of the bandwidth idle).

With PDL False (the default everywhere) the helpers compile to nothing: the kernels are those
of before. Triton's interpreter has no grid dependency control, and needs none: it runs a
launch's programs after the previous launch has finished, and it has no L2 (nor inline
assembly). Its forms of the helpers are empty.

A kernel's jitted helpers must be of its own kind (compiled or interpreted), so a kernel file loads
this one through `kernels.load` in its own form; no kernel lives here.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

if triton.knobs.runtime.interpret:

    @triton.jit
    def wait_for_inputs(PDL: tl.constexpr):
        """Nothing to wait for: the interpreter runs launches one after another."""
        pass

    @triton.jit
    def prefetch_to_l2(pointers, PDL: tl.constexpr):
        """No L2 to fill."""
        pass

else:

    @triton.jit
    def wait_for_inputs(PDL: tl.constexpr):
        """With PDL: wait until the kernel ahead has completed and its stores are visible, then
        let the next kernel launch. Call it first, in every program."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

    @triton.jit
    def prefetch_to_l2(pointers, PDL: tl.constexpr):
        """With PDL: ask L2 for the lines at `pointers` (valid addresses of data no kernel writes, a
        weight), without waiting for them. Before the wait, so the lines stream in while the kernel
        ahead finishes."""
        if PDL:
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [pointers], dtype=tl.int32, is_pure=False, pack=1
            )
