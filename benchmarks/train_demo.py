"""Train the embedded demo pair: `python benchmarks/train_demo.py all` (see trtllm_dflash/training/demo_pair.py)."""

from trtllm_dflash.training.demo_pair import app

if __name__ == "__main__":
    app()
