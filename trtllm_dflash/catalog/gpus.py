"""The GPUs that recipes name: datasheet figures, what each can run, and which TensorRT builds for it.

Memory is the datasheet capacity in decimal gigabytes (1 GB = 1e9 bytes). The driver reports a
little less or more than the marketing figure (an "80 GB" H100 shows 79.6 GiB = 85.5e9 bytes in
nvidia-smi); planning with the decimal datasheet value is the conservative side for every GPU
here. Bandwidths are per GPU; NVLink is the bidirectional per-GPU figure.

Sources (datasheets and NVIDIA product pages; checked through the project's search tool):
- H100 SXM: NVIDIA H100 Tensor Core GPU datasheet: 80 GB HBM3, 3.35 TB/s, NVLink 900 GB/s.
- H200 SXM: NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e, 4.8 TB/s, NVLink 900 GB/s.
- B200: NVIDIA HGX B200 (8 GPUs, 1.44 TB total HBM3e = 180 GB per GPU; 64 TB/s = 8 TB/s per
  GPU; NVLink 5, 1.8 TB/s per GPU). PLATFORM.md: "B200 ~180 GB".
- B300 (Blackwell Ultra): NVIDIA HGX B300 (8 GPUs, 2.3 TB HBM3e = 288 GB per GPU, 8 TB/s per
  GPU, NVLink 5 1.8 TB/s per GPU); compute capability 10.3 (sm_103).
- GB200 / GB300: NVIDIA GB200 NVL72 (13.4 TB HBM3e over 72 GPUs = 186 GB per GPU, 8 TB/s) and
  GB300 NVL72 (up to 288 GB HBM3e per Blackwell Ultra GPU, 8 TB/s); one NVLink domain of 72.
- RTX PRO 6000 Blackwell (Workstation / Server Edition): 96 GB GDDR7, 512-bit at 28 Gbps =
  1792 GB/s, no NVLink, compute capability 12.0.
- A100 SXM 80GB (kept to explain FP8 refusals): 80 GB HBM2e, 2.039 TB/s, NVLink 600 GB/s, SM 8.0.
Precision support: FP8 needs SM >= 8.9, NVFP4 SM >= 10.0 (PLATFORM.md; NVIDIA Transformer
Engine / ModelOpt support matrices). Kernel arch strings match what Triton 3.9 emits for each
compute capability (PLATFORM.md: sm_90a, sm_100a, sm_103a; sm_120 for RTX Blackwell).
"""

from __future__ import annotations

import dataclasses

from trtllm_dflash.errors import UnknownNameError

FP8_MIN_SM = (8, 9)
NVFP4_MIN_SM = (10, 0)
MXFP4_MIN_SM = (9, 0)  # TensorRT-LLM runs gpt-oss MXFP4 experts from Hopper on (Triton MoE backend)

TENSORRT = "tensorrt"  # full TensorRT: Hopper and Blackwell datacenter GPUs (needs the GPU to build)
TENSORRT_RTX = "tensorrt-rtx"  # TensorRT for RTX: RTX GPUs; builds ahead of time without a GPU

GB = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """One GPU model as the planner and the builder see it."""

    name: str  # canonical short name used in recipe paths: engine_recipes/<model>/<name>.yaml
    full_name: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_gb: float  # datasheet, decimal GB
    memory_bandwidth_tbs: float  # TB/s
    nvlink_gbs: float | None  # bidirectional GB/s per GPU; None: PCIe only
    max_gpus_per_node: int  # GPUs one NVLink/PCIe node offers (8 for HGX, 72 for an NVL72 domain)
    trt_flavour: str  # TENSORRT or TENSORRT_RTX
    sm_arch: str  # the kernel target for Triton/PTX (`dflash-trt plugins build --arch`)
    aliases: tuple[str, ...] = ()
    nvml_names: tuple[str, ...] = ()  # substrings of the NVML device name that identify it

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GB)

    @property
    def sm(self) -> int:
        """Compute capability as one number (9.0 -> 90, 10.3 -> 103)."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def supports_fp8(self) -> bool:
        return self.compute_capability >= FP8_MIN_SM

    @property
    def supports_nvfp4(self) -> bool:
        return self.compute_capability >= NVFP4_MIN_SM

    @property
    def supports_mxfp4(self) -> bool:
        return self.compute_capability >= MXFP4_MIN_SM

    @property
    def compute_capability_str(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"

    def supports(self, precision: str) -> bool:
        """Whether weights or KV cache in `precision` can run on this GPU."""
        precision = precision.lower()
        if precision in ("fp32", "bf16", "fp16"):
            return True
        if precision == "fp8":
            return self.supports_fp8
        if precision == "nvfp4":
            return self.supports_nvfp4
        if precision == "mxfp4":
            return self.supports_mxfp4
        return False


GPUS: dict[str, GPUSpec] = {
    gpu.name: gpu
    for gpu in (
        GPUSpec(
            "h100",
            "NVIDIA H100 SXM5 80GB",
            "hopper",
            (9, 0),
            80,
            3.35,
            900,
            8,
            TENSORRT,
            "sm_90a",
            aliases=("h100-sxm", "h100-80gb", "h100-sxm5"),
            nvml_names=("H100",),
        ),
        GPUSpec(
            "h200",
            "NVIDIA H200 SXM 141GB",
            "hopper",
            (9, 0),
            141,
            4.8,
            900,
            8,
            TENSORRT,
            "sm_90a",
            aliases=("h200-sxm", "h200-141gb"),
            nvml_names=("H200",),
        ),
        GPUSpec(
            "b200",
            "NVIDIA B200 (HGX B200)",
            "blackwell",
            (10, 0),
            180,
            8.0,
            1800,
            8,
            TENSORRT,
            "sm_100a",
            aliases=("hgx-b200", "dgx-b200"),
            nvml_names=("B200",),
        ),
        GPUSpec(
            "b300",
            "NVIDIA B300 Blackwell Ultra (HGX B300)",
            "blackwell-ultra",
            (10, 3),
            288,
            8.0,
            1800,
            8,
            TENSORRT,
            "sm_103a",
            aliases=("hgx-b300", "dgx-b300", "blackwell-ultra"),
            nvml_names=("B300",),
        ),
        GPUSpec(
            "gb200",
            "NVIDIA GB200 (one Blackwell GPU of the superchip)",
            "blackwell",
            (10, 0),
            186,
            8.0,
            1800,
            72,
            TENSORRT,
            "sm_100a",
            aliases=("gb200-nvl72",),
            nvml_names=("GB200",),
        ),
        GPUSpec(
            "gb300",
            "NVIDIA GB300 (one Blackwell Ultra GPU of the superchip)",
            "blackwell-ultra",
            (10, 3),
            288,
            8.0,
            1800,
            72,
            TENSORRT,
            "sm_103a",
            aliases=("gb300-nvl72",),
            nvml_names=("GB300",),
        ),
        GPUSpec(
            "rtx-pro-6000",
            "NVIDIA RTX PRO 6000 Blackwell",
            "blackwell-rtx",
            (12, 0),
            96,
            1.792,
            None,
            8,
            TENSORRT_RTX,
            "sm_120",
            aliases=("rtx-pro-6000-blackwell", "rtx6000-pro", "rtxpro6000", "rtx-pro-6000-server"),
            nvml_names=("RTX PRO 6000",),
        ),
        GPUSpec(
            "a100",
            "NVIDIA A100 SXM4 80GB",
            "ampere",
            (8, 0),
            80,
            2.039,
            600,
            8,
            TENSORRT,
            "sm_80",
            aliases=("a100-sxm", "a100-80gb"),
            nvml_names=("A100",),
        ),
    )
}

# The pseudo-device of CPU-only machines: the torch runtime runs there, nothing is built for it.
CPU = "cpu"


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def resolve_gpu(name: str) -> GPUSpec:
    """The catalog entry for a GPU name or alias ("b300", "H100", "rtx-pro-6000-blackwell", ...)."""
    key = _key(name)
    for gpu in GPUS.values():
        if key == gpu.name or key in gpu.aliases:
            return gpu
    raise UnknownNameError(
        f"unknown GPU {name!r}",
        f"use one of: {', '.join(GPUS)} (or 'cpu' for the torch runtime on a CPU machine)",
    )


def is_gpu_name(name: str) -> bool:
    try:
        resolve_gpu(name)
    except UnknownNameError:
        return False
    return True


def gpus_supporting(precision: str) -> list[GPUSpec]:
    """Catalog GPUs that can run `precision` (for refusal messages that name the alternatives)."""
    return [gpu for gpu in GPUS.values() if gpu.supports(precision)]


def match_nvml_name(device_name: str) -> GPUSpec | None:
    """The catalog GPU behind an NVML device name such as 'NVIDIA H100 80GB HBM3', if any."""
    upper = device_name.upper()
    # Longest marker first, so "GB200" wins over "B200".
    candidates = sorted(((marker, gpu) for gpu in GPUS.values() for marker in gpu.nvml_names), key=lambda m: -len(m[0]))
    for marker, gpu in candidates:
        if marker.upper() in upper:
            return gpu
    return None


@dataclasses.dataclass(frozen=True)
class LocalGPU:
    """A GPU found on this machine through NVML."""

    index: int
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    catalog: GPUSpec | None  # the matching catalog entry, None for a GPU the catalog does not list


@dataclasses.dataclass(frozen=True)
class LocalGPUs:
    """What NVML reported: the GPUs, the driver version, or why there is nothing to report."""

    gpus: tuple[LocalGPU, ...]
    driver_version: str | None
    reason: str | None  # set when no GPU could be listed (no NVML, no driver, no device)


def detect_local_gpus() -> LocalGPUs:
    """List this machine's NVIDIA GPUs through NVML (nvidia-ml-py); never raises.

    NVML ships with the driver, so a machine without a driver reports no GPU and says why.
    """
    try:
        import pynvml
    except ImportError:
        return LocalGPUs((), None, "nvidia-ml-py (pynvml) is not installed: pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPUs, said why
        return LocalGPUs((), None, f"NVML is not available ({exc}): no NVIDIA driver on this machine")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(LocalGPU(index, name, memory, (int(major), int(minor)), match_nvml_name(name)))
        reason = None if gpus else "the NVIDIA driver is loaded but reports no GPU"
        return LocalGPUs(tuple(gpus), driver, reason)
    except Exception as exc:  # noqa: BLE001 - any NVML failure means no GPUs to plan for, said why
        return LocalGPUs((), None, f"NVML query failed ({exc})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting NVML down after a query: nothing left to report
            pass


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
