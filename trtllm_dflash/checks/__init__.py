"""The checks of an installation and of a GPU: what `dflash-trt doctor` and `selftest --gpu` run.

    doctor.py          which build / serve stages this machine can run (`dflash-trt doctor`)
    selftest.py        `dflash-trt selftest --gpu` (`make gpu-check`): the steps and the report
    warmup.py          the selftest's kernel warm-up (compiles the variants the GPU tests launch)
    runs.py            runs subprocesses under a time limit, reading each test's progress
    progress.py        the pytest plugin that logs each test as it finishes (`-p trtllm_dflash.checks.progress`)
    system_install.py  `make gpu-check SYSTEM_PYTHON=1`: install into the interpreter already there

Nothing here is imported by the library; this package imports nothing at import time (system_install
runs before the dependencies are installed).
"""
