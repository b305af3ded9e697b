"""runtime/host_memory.py: glibc's thresholds are set so that a freed step buffer is reused in the
process, not unmapped and faulted in again (checked by counting page faults)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from trtllm_dflash.runtime import host_memory

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc on Linux only")

# Allocate and free a 4 MiB buffer 200 times, then print the page faults taken meanwhile. The
# mmap threshold starts pinned at glibc's 128 KiB default (a fixed value, as the served model
# process behaved: every such buffer a fresh mapping), then keep_freed_memory() runs or not.
CHURN = """
import ctypes, resource, sys
from trtllm_dflash.runtime import host_memory
ctypes.CDLL("libc.so.6").mallopt(host_memory.M_MMAP_THRESHOLD, 128 * 1024)
if sys.argv[1] == "kept":
    assert host_memory.keep_freed_memory() is None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    buffer = bytearray(4 * 1024 * 1024)  # zero-filled: every page touched
    del buffer
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    return int(subprocess.run([sys.executable, "-c", CHURN, mode], check=True, capture_output=True, text=True).stdout)


def test_freed_step_buffers_are_reused_instead_of_faulted_in_again():
    churned, kept = _faults("churned"), _faults("kept")
    assert churned > 100 * 1024, churned  # a fresh mapping per buffer: ~1,024 faults each
    assert kept < 5 * 1024, kept  # about one buffer's pages, once
    assert host_memory.keep_freed_memory() is None  # and it can be set in a running process
