"""What a build hands to its repository: one typed record.

The build makes it from its finished stages (builder/artifact.py) and gives it to its repository
stage in memory; manifest.json holds it under `artifact`, where `dflash-trt repo --build DIR` reads
it back (`read_build_artifact`). Nothing downstream reads stage summaries, the recipe dump or the
environment to learn what was built.

Paths the build wrote (quantized checkpoints, engines, the LLM-API options) are relative to the
build directory, so a build folder that moves still serves; `build_dir` is where it is now (set
when made or read, never written).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.served_model.model_parameters import RecipeLimits, ServingSource

MANIFEST = "manifest.json"
ARTIFACT_KEY = "artifact"  # its key in manifest.json


class BuildArtifact(BaseModel):
    """A build's deployment: the backend it was made for, its checkpoints and engines, the recipe's
    limits and serving defaults, and the backend's own options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["trt", "trtllm", "torch"]
    recipe: str  # the recipe's name, for titles
    build_dir: str = Field(exclude=True)  # where the build is (absolute)
    target: str  # the target checkpoint the build read (a directory)
    drafter: str
    quantized_target: Optional[str] = None  # relative to build_dir: the quantize stage's checkpoint, when it wrote one
    quantized_drafter: Optional[str] = None
    engines: Optional[str] = None  # relative: the engines folder, when the engines stage finished
    limits: RecipeLimits = RecipeLimits()
    decoupled: bool = True  # the recipe's triton.decoupled (streaming responses)
    trtllm_options: Optional[str] = None  # relative: the LLM-API options the trtllm stage checked
    llmapi_model: Optional[str] = None  # NVIDIA's LLM-API Triton model folder given with --llmapi-model (None: looked up where written)

    def path(self, relative: str) -> Path:
        """A path the build wrote, in the build directory as it is now."""
        return Path(self.build_dir) / relative

    @property
    def deployed_target(self) -> str:
        """The target a backend that loads checkpoints itself deploys: the quantized one when there is one."""
        return str(self.path(self.quantized_target)) if self.quantized_target else self.target

    @property
    def deployed_drafter(self) -> str:
        return str(self.path(self.quantized_drafter)) if self.quantized_drafter else self.drafter

    def serving_source(self) -> ServingSource:
        """What our Python-backend models serve: the engines when built, else the checkpoints on torch."""
        engines = str(self.path(self.engines)) if self.engines else None
        return ServingSource(self.target, self.drafter, engines, self.limits)


def read_manifest(build_dir: Path) -> dict:
    """The manifest.json of a `dflash-trt build` output directory."""
    path = build_dir / MANIFEST
    if not path.is_file():
        raise DFlashError(f"{build_dir} has no {MANIFEST}, so it is not a build", "run `dflash-trt build ... --out DIR` first")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as exc:
        raise DFlashError(f"{path} is not valid JSON ({exc})", "rebuild with `dflash-trt build --force`") from None
    if not isinstance(manifest, dict):
        raise DFlashError(f"{path} is not a build manifest", "rebuild with `dflash-trt build --force`")
    return manifest


def artifact_of(build_dir: Path, manifest: dict) -> BuildArtifact:
    """The artifact a manifest records, located in `build_dir`; refused in one line when there is none."""
    recorded = manifest.get(ARTIFACT_KEY)
    if not isinstance(recorded, dict):
        raise DFlashError(
            f"the build in {build_dir} records no artifact (its checkpoints stage did not finish)", "rerun its `dflash-trt build` command"
        )
    try:
        return BuildArtifact.model_validate({**recorded, "build_dir": str(build_dir)})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise DFlashError(
            f"the artifact in {build_dir / MANIFEST} is not readable ({'.'.join(map(str, first['loc']))}: {first['msg']})",
            "rebuild with `dflash-trt build --force`",
        ) from None
