"""Every plugin kernel variant, compiled for Hopper (sm_90a) and Blackwell (sm_100a) on this CPU
machine, checked against what the compiler reports (`plugins/kernel_audit.py`):

- shared memory within what its launch gets (48 KiB for an engine's AOT launch, the arch's opt-in
  limit for a torch launch);
- no spills in the 16-bit variants (`ptxas -v`, Triton's bundled ptxas);
- 16-byte vector loads or cp.async in every attention and verification kernel, and no global load
  narrower than 4 bytes.

The full audit runs in a background process started by conftest.py while the rest of the suite
runs, so its tests come last.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

pytest.importorskip("triton")

from trtllm_dflash.ops.kernels import launch  # noqa: E402
from trtllm_dflash.plugins import aot, kernel_audit  # noqa: E402
from trtllm_dflash.plugins.aot_variants import (  # noqa: E402
    TORCH_TO_TRITON,
    commit_variant,
    fused_layer_variants,
    verify_partials_variant,
    verify_shortlist_variants,
    verify_spread_variants,
    verify_variants,
)

ARCHES = ("sm_90a", "sm_100a")


def test_every_variant_fits_and_streams_on_hopper_and_blackwell(kernel_audit_reports):
    reports = kernel_audit_reports
    for arch in ARCHES:
        for path, expected in (("aot", kernel_audit.aot_variants()), ("jit", kernel_audit.jit_variants(aot.ARCHES[arch]))):
            labels = {r.label for r in reports if r.arch == arch and r.path == path}
            assert labels == {v.label for v in expected}, f"{arch} {path}: not every variant was audited"
    bad = [r for r in reports if r.problems()]
    table = kernel_audit.markdown_table(bad)
    assert not bad, f"{len(bad)} of {len(reports)} kernels would fail or crawl on the GPU:\n{table}"
    # what the audit saw, for the CI log
    sixteen = [r for r in reports if r.sixteen_bit]
    print(
        f"\n{len(reports)} kernels: max shared {max(r.shared for r in reports if r.path == 'aot')} B (aot), "
        f"{max(r.shared for r in reports)} B (jit); 16-bit: {len(sixteen)}, max {max(r.registers for r in sixteen)} registers, "
        f"0 spills; 16-byte loads in every streaming kernel"
    )


def test_the_tile_estimate_bounds_what_the_compiler_allocates(kernel_audit_reports):
    """`launch.tile_shared_bytes` sizes the tiles before anything is compiled: it must never be below
    the compiler's figure, or a tile chosen to fit could overflow."""
    variants = {(arch, v.label): v for arch in ARCHES for v in kernel_audit.jit_variants(aot.ARCHES[arch])}
    torch_dtype = {triton: torch for torch, triton in TORCH_TO_TRITON.items()}
    for r in kernel_audit_reports:
        if r.function not in (
            "block_attention_kernel",
            "block_attention_split_kernel",
            "target_attention_kernel",
            "target_attention_split_kernel",
        ):
            continue
        c = dict(variants[(r.arch, r.label)].constexprs)
        dtype = torch_dtype[r.data_dtype]
        dk, dv = c.get("HEAD_DIM_K", c.get("HEAD_DIM")), c.get("HEAD_DIM_V", c.get("HEAD_DIM"))
        streams = 2 if r.function.startswith("block") else 1
        estimate = launch.tile_shared_bytes(c["BLOCK_M"], c["BLOCK_N"], dk, dv, launch.element_bytes(dtype), r.num_stages, streams)
        assert r.shared <= estimate, f"{r.arch} {r.label}: compiler {r.shared} B > estimate {estimate} B"


def test_the_audit_fails_kernels_compiled_without_alignment_hints(monkeypatch):
    """What the engines compiled before: no pointer alignment, so the Qwen3-8B verify step's target
    attention reads K/V two bytes at a time and spills. The audit must catch it."""
    variant = aot.target_attention_variant(128, 128, "bfloat16", "bfloat16", 64, {"sinks": False})
    arch = aot.ARCHES["sm_90a"]
    aligned = kernel_audit.report(aot.compile_kernel(variant, arch), "aot")
    assert aligned.problems() == [], aligned
    assert aligned.vector_loads_16b > 0 and aligned.narrow_loads == 0
    monkeypatch.setattr(type(variant), "compile_attrs", lambda self: {})
    unaligned = kernel_audit.report(aot.compile_kernel(variant, arch), "aot")
    assert unaligned.vector_loads_16b == 0 and unaligned.narrow_loads > 100
    assert "no 16-byte vector load or cp.async" in unaligned.problems()


def test_problems_name_each_limit():
    base = kernel_audit.KernelReport(
        label="k",
        node="n",
        function="target_attention_kernel",
        arch="sm_90a",
        path="aot",
        data_dtype="bf16",
        num_warps=8,
        num_stages=1,
        shared=49152,
        shared_limit=49152,
        registers=165,
        spill_stores=0,
        spill_loads=0,
        vector_loads_16b=12,
        cp_async_16b=0,
        narrow_loads=0,
    )
    assert base.problems() == []
    assert kernel_audit.shared_limit(aot.ARCHES["sm_90a"], "aot") == 48 * 1024
    assert kernel_audit.shared_limit(aot.ARCHES["sm_90a"], "jit") == 232_448
    assert dataclasses.replace(base, shared=49153).problems() == ["49153 B of shared memory > 49152 B"]
    assert dataclasses.replace(base, spill_stores=20, spill_loads=28).problems() == ["spills 20 B stores / 28 B loads"]
    assert dataclasses.replace(base, data_dtype="fp32", spill_stores=20).problems() == []  # only 16-bit kernels must not spill
    assert dataclasses.replace(base, vector_loads_16b=0).problems() == ["no 16-byte vector load or cp.async"]
    assert dataclasses.replace(base, narrow_loads=3).problems() == ["3 global loads narrower than 4 bytes"]
    commit = dataclasses.replace(base, function="verify_commit_kernel", vector_loads_16b=0, narrow_loads=4, exempt="small")
    assert commit.problems() == []
    exempt = {
        v.label: kernel_audit.streaming_exemption(v) for v in aot.kernel_variants(head_dims=(128,), dtypes=("bfloat16",), groups=(4,))
    }
    assert {label for label, why in exempt.items() if why} == {
        label for label in exempt if "vocab_divisible0" in label or label.startswith("verify_commit")
    }


def test_load_widths_read_ptx_vector_and_scalar_loads():
    ptx = """
    @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
    ld.global.L1::evict_last.v2.b64 { %rd5, %rd6 }, [ %rd2 + 0 ];
    @%p2 ld.global.b16 { %rs1 }, [ %rd3 + 0 ];
    ld.global.b64 %rd7, [%rd4];
    cp.async.cg.shared.global [ %r9 + 0 ], [ %rd8 + 0 ], 0x10, %r10;
    """
    assert kernel_audit.load_widths(ptx) == [16, 16, 2, 8]
    assert len(kernel_audit._CP_ASYNC_16.findall(ptx)) == 1


def test_audit_command_refuses_an_unknown_path_or_arch_in_one_line(run_main):
    code, _, err = run_main("plugins", "audit", "--path", "both")
    assert code == 2 and err.strip().splitlines() == ["error: --path 'both' is not a launch path; use aot or jit"]
    code, _, err = run_main("plugins", "audit", "--arch", "sm_75")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "unknown GPU architecture 'sm_75'" in err


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_spread_verification_kernels_compile_for_hopper_without_spills(dtype):
    """The vocabulary-spread verification (verify_spread.py), not yet a TensorRT node, compiles for
    sm_90a: no spills, and 16-byte loads where it streams logits (decide_kernel reads single ones)."""
    for variant in verify_spread_variants(dtype):
        report = kernel_audit.report(aot.compile_kernel(variant, aot.ARCHES["sm_90a"]), "aot")
        streams = variant.function != "decide_kernel"
        assert report.spill_stores == 0 and report.spill_loads == 0, report
        assert report.problems() == ([] if streams else ["no 16-byte vector load or cp.async"]), report


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_shortlist_verification_kernels_compile_for_hopper_without_spills(dtype):
    """The shortlist verification (verify_shortlist.py) compiles for sm_90a with the warps it is
    launched with: no spills (its select and threshold tiles hold 4,096 values in registers), and
    16-byte loads in every kernel."""
    for variant in verify_shortlist_variants(dtype):
        report = kernel_audit.report(aot.compile_kernel(variant, aot.ARCHES["sm_90a"]), "aot")
        assert report.spill_stores == 0 and report.spill_loads == 0, report
        assert report.problems() == [], report


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_fused_layer_kernels_compile_for_hopper_and_read_whole_rows(dtype):
    """The fused decoding passes' kernels (fused_layer.py), which only a GPU's torch launch compiles,
    compile for sm_90a at Qwen3-8B's sizes: no spills, no load narrower than 4 bytes, and 16-byte
    loads where a program streams a row (the norm over 4,096 values, SiLU * up over 1,024 columns).
    q/k norm + RoPE reads one head of 128 values per program with one warp: 8 bytes a thread in
    16-bit, one coalesced 256-byte read."""
    arch = aot.ARCHES["sm_90a"]
    for variant in fused_layer_variants(dtype):
        report = kernel_audit.report(aot.compile_kernel(variant, arch), "jit")
        assert report.spill_stores == 0 and report.spill_loads == 0 and report.narrow_loads == 0, report
        assert report.shared <= report.shared_limit, report
        if variant.function != "qk_norm_rope_kernel" or dtype == "float32":
            assert report.vector_loads_16b > 0, report
    # without the JIT's knowledge that the sizes are multiples of 16 the rows would be read 2 bytes
    # at a time in 16-bit: what the marks are for
    if dtype == "bfloat16":
        norm = dataclasses.replace(fused_layer_variants(dtype)[0], divisible_ints=())
        assert kernel_audit.report(aot.compile_kernel(norm, arch), "jit").narrow_loads > 0


def skinny_variant(rows, split, gated):
    """The skinny projection kernel's variant as `skinny_launch` launches it, in bf16."""
    from trtllm_dflash.ops.kernels import skinny_launch as s
    from trtllm_dflash.plugins.aot_variants import KernelVariant

    sizes = (("M", "i32"), ("N", "i32"), ("K", "i32"), ("k_per_split", "i32"), ("splits", "i32"))
    pointers = (("x_ptr", "*bf16"), ("w_ptr", "*bf16"), ("bias_ptr", "*bf16"), ("partial_ptr", "*fp32"), ("counter_ptr", "*i32"))
    constexprs = (
        ("HAS_BIAS", True),
        ("SPLIT", split),
        ("BLOCK_M", s.block_m(rows)),
        ("BLOCK_N", s.BLOCK_N),
        ("BLOCK_K", s.GATED_BLOCK_K if gated else s.BLOCK_K),
        ("IEEE", False),
        ("GATED", gated),
    )
    signature = (*pointers, ("out_ptr", "*bf16"), *sizes)
    return KernelVariant(
        "SkinnyLinear",
        "skinny_linear",
        "skinny_linear_kernel",
        signature,
        constexprs,
        s.NUM_WARPS,
        s.NUM_STAGES,
        True,
        ("N", "K", "k_per_split"),
    )


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_the_skinny_projection_kernel_compiles_for_hopper_streams_the_weight_and_orders_its_splits(rows):
    """The skinny projection kernel (ops/kernels/skinny_linear.py), which only a GPU's torch launch
    compiles, at the tiles `skinny_launch` launches it with, in bf16 on sm_90a: no spills, no load
    narrower than 4 bytes, 16-byte loads of the weight (K a multiple of 16, as the JIT specializes;
    pipelined as cp.async with NUM_STAGES). With K splits, the memory order the last split relies on
    is in the PTX: a block barrier after the partials' stores, the tile count as an acquire-release
    atomic at GPU scope, the partials read back through L2. The gated form (the down projection
    forming silu(gate) * up as it loads x) holds to the same."""
    for split, gated in ((True, False), (False, False), (True, True)):
        kernel = aot.compile_kernel(skinny_variant(rows, split, gated), aot.ARCHES["sm_90a"])
        report = kernel_audit.report(kernel, "jit")
        assert report.spill_stores == 0 and report.spill_loads == 0 and report.narrow_loads == 0, report
        assert report.shared <= report.shared_limit, report
        assert report.vector_loads_16b + report.cp_async_16b > 0, report  # the weight tiles: pipelined cp.async
        atomic, read_back = kernel.ptx.find("atom.global.gpu.acq_rel.add"), kernel.ptx.find("ld.global.cg")
        if not split:
            assert atomic == read_back == -1
            continue
        stored = kernel.ptx.rfind("st.global", 0, atomic)  # the partial's last store before the count
        assert 0 < stored < kernel.ptx.find("bar.sync", stored) < atomic < read_back, "the last split could read partials not yet stored"


def merged_variant(split):
    """A split attention kernel's variant as the torch path launches it: with the merge in the
    launch (attention_merge.py), the tile counters and the output after its partials."""
    out = next(kind for name, kind in split.signature if name == "q_ptr")
    signature = []
    for name, kind in split.signature:
        signature.append((name, kind))
        if name == "partial_lse_ptr":
            signature += [("counter_ptr", "*i32"), ("out_ptr", out)]
    function = split.function.replace("_split_kernel", "_merged_kernel")
    return dataclasses.replace(split, source="attention_merge", function=function, signature=tuple(signature))


@pytest.mark.parametrize("tokens", [1, 16])
def test_split_attention_merged_in_the_launch_compiles_for_hopper_and_orders_its_merge(tokens):
    """The one-launch split attention at Qwen3-8B's heads (32 / 8, head dim 128, bf16) on sm_90a,
    for the target's AR and 16-token verify passes and the drafter's 16-token block: no spills,
    and the memory order the last split's merge relies on, as in the skinny projections: the
    partials stored, a block barrier, the count as an acquire-release atomic at GPU scope, the
    partials read back through L2."""
    from trtllm_dflash.plugins.aot_variants import attention_variants, target_attention_split_variant

    config = launch.target_attention_config(128, 128, tokens, 4)
    target = target_attention_split_variant(128, 128, "bfloat16", "bfloat16", config.block_m, {"sinks": False})
    variants = [merged_variant(target)]
    if tokens > 1:
        drafter = launch.attention_config(128, tokens, 4)
        variants.append(merged_variant(attention_variants(128, "bfloat16", "bfloat16", drafter.block_m)[1]))
    for variant in variants:
        kernel = aot.compile_kernel(variant, aot.ARCHES["sm_90a"])
        report = kernel_audit.report(kernel, "jit")
        assert report.spill_stores == 0 and report.spill_loads == 0, (variant.function, report)
        atomic, read_back = kernel.ptx.find("atom.global.gpu.acq_rel.add"), kernel.ptx.find("ld.global.cg")
        stored = kernel.ptx.rfind("st.global", 0, atomic)  # the partials' last store before the count
        assert 0 < stored < kernel.ptx.find("bar.sync", stored) < atomic < read_back, variant.function


# a global memory access in PTX: a load, store, atomic or reduction, or an async copy from global memory
GLOBAL_ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld|st|atom|red|cp\.async)\.[\w.]*global", re.MULTILINE)


def _kernels_taking_pdl() -> set[str]:
    """The kernel functions in the kernel sources that take the dependent launch's `PDL` constexpr."""
    from trtllm_dflash.ops import kernels

    modules = [kernels.load(name) for name in kernels.KERNEL_SOURCES]
    return {name for m in modules for name, fn in vars(m).items() if name.endswith("_kernel") and "PDL" in getattr(fn, "arg_names", ())}


def test_dependent_launches_wait_for_the_kernel_ahead_before_touching_memory():
    """Every kernel a decode pass launches as a programmatic dependent launch (the fused-layer kernels,
    the skinny projections, the attention kernels in their single, split, merged and merge forms at
    Qwen3-8B's shapes, the verification kernels in every form and the shortlist's sampling),
    compiled for sm_90a with PDL: the PTX waits for the kernel ahead
    (`griddepcontrol.wait`) before its first global load, store, atomic or async copy, and then lets
    the next kernel launch; the skinny projections ask L2 for their weight's first tiles before it
    (a prefetch, which reads nothing into registers). Compiled without PDL (an engine's launch, and
    every launch by default) they have none of these: the kernels of before."""
    from trtllm_dflash.plugins.aot_variants import attention_variants, target_attention_split_variant, target_attention_variant

    tokens = 16
    target = launch.target_attention_config(128, 128, tokens, 4)
    drafter = launch.attention_config(128, tokens, 4)
    split = target_attention_split_variant(128, 128, "bfloat16", "bfloat16", target.block_m, {"sinks": False})
    block_attention = attention_variants(128, "bfloat16", "bfloat16", drafter.block_m)  # single, split, merge
    variants = [
        *fused_layer_variants("bfloat16"),
        skinny_variant(tokens, True, False),
        skinny_variant(1, True, True),
        *block_attention,
        merged_variant(block_attention[1]),
        target_attention_variant(128, 128, "bfloat16", "bfloat16", target.block_m, {"sinks": False}),
        split,
        merged_variant(split),
        verify_partials_variant("bfloat16"),
        *verify_variants("bfloat16"),
        commit_variant(),
        *verify_spread_variants("bfloat16"),
        *verify_shortlist_variants("bfloat16"),
    ]
    assert {v.function for v in variants} == _kernels_taking_pdl()  # none left out
    arch = aot.ARCHES["sm_90a"]
    for variant in variants:
        plain = aot.compile_kernel(variant, arch).ptx
        assert "griddepcontrol" not in plain and "prefetch" not in plain, variant.function
        ptx = aot.compile_kernel(dataclasses.replace(variant, constexprs=(*variant.constexprs, ("PDL", True))), arch).ptx
        body = ptx[ptx.index(".entry") :]
        wait, release = body.find("griddepcontrol.wait"), body.find("griddepcontrol.launch_dependents")
        first_access = GLOBAL_ACCESS.search(body)
        assert first_access is not None and 0 < wait < first_access.start() and wait < release, variant.function
        if variant.function == "skinny_linear_kernel":  # the weight's first tiles asked into L2 before the wait
            assert 0 < body.find("prefetch.global.L2") < wait, variant.function
