"""The `trtllm` backend: TensorRT-LLM's native DFlash mode, all of it in this folder.

backend.py           TrtllmBackend (what `plan`, `build`, `repo` and `serve` ask of it) and the start command
options.py           the LLM-API options a recipe writes (model.yaml, trtllm-serve.yaml), checked key by key
llm_args_check.py    the check itself: TensorRT-LLM's argument classes, from llm_args.json or the installed package
llm_args_extract.py  regenerates llm_args.json from a TensorRT-LLM checkout
llm_args.json        the pinned extract of TensorRT-LLM's llm_args.py (shipped as package data)
drafters.py          how TensorRT-LLM runs each drafter, and the config overlay that makes it run as published
repository.py        its Triton model repository: NVIDIA's LLM-API model, configured for DFlash
"""
