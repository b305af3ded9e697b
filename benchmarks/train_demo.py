"""Train the embedded demo pair: `python benchmarks/train_demo.py all` (see trtllm_dflash/demo/train.py)."""

from trtllm_dflash.demo.train import app

if __name__ == "__main__":
    app()
