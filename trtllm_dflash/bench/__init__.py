"""`dflash-trt bench`: autoregressive vs DFlash decoding measured side by side (see measure.py)."""
