"""Models with random weights, for the tests, the benchmarks and the GPU check: no library module
uses them (tests/test_architecture.py checks that nothing outside this package imports `tiny`).

    tiny.py             tiny random checkpoints written to disk in the real layouts (targets of every
                        family, drafters V1 and V2, ModelOpt drafters, trained cycle pairs)
    qwen3_8b_shaped.py  random models at Qwen3-8B's full width, built in memory (GPU step costs,
                        CUDA graphs, NVFP4 accuracy)

The tests' own helpers (the command line in a child process, servers, response sinks) are in
tests/support.py.
"""
