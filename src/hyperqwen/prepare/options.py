"""What `hyperqwen prepare` is asked to do, built from the prepare knobs (see CONTRACT.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperqwen.prepare.errors import PrepareError

DEFAULT_MODEL_REPO = "dbirks/Qwen3.8-27B-W4A16-AutoRound"
DEFAULT_MODEL_REVISION = "main"
DEFAULT_MODELS_DIR = "/models"
DEFAULT_MODEL = "qwen3.8-27b"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(knob: str, value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise PrepareError(f"{knob}={value!r} is not a boolean", fix=f"set {knob} to one of 1/0, true/false, yes/no, on/off",
                       knob=knob)


def mask_secret(value: str) -> str:
    """Enough to tell two tokens apart in a log, never enough to use one."""
    if not value:
        return "(unset)"
    return f"***{value[-2:]}" if len(value) >= 12 else "***"


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
    """Everything prepare needs. `output_dir` is the servable checkpoint (MODELS_DIR/MODEL)."""

    output_dir: Path
    models_dir: Path = Path(DEFAULT_MODELS_DIR)
    repo_id: str = DEFAULT_MODEL_REPO
    revision: str = DEFAULT_MODEL_REVISION
    token: str = dataclasses.field(default="", repr=False)
    source_dir: Path | None = None
    offline: bool = False
    quantize_embed: bool = False
    hf_endpoint: str | None = None
    # Where hub downloads land (resumable, kept between runs); default under MODELS_DIR.
    download_dir: Path | None = None
    # Relative Frobenius error bound for int8 group-128 (issue #4: <= 1%).
    max_rel_error: float = 0.01
    # Bytes of float32 working set per row block; bounds peak RSS whatever the tensor size.
    block_bytes: int = 64 << 20
    check_disk_space: bool = True
    show_progress: bool = True

    def __post_init__(self) -> None:
        if not self.repo_id or self.repo_id.count("/") != 1 or any(not p for p in self.repo_id.split("/")):
            if self.source_dir is None:
                raise PrepareError(f"MODEL_REPO={self.repo_id!r} is not a Hugging Face repo id",
                                   fix=f"use the form owner/name, e.g. {DEFAULT_MODEL_REPO}", knob="MODEL_REPO")
        if not self.revision:
            raise PrepareError("MODEL_REVISION is empty", fix="use a branch, tag or commit, e.g. main",
                               knob="MODEL_REVISION")
        if not 0 < self.max_rel_error < 1:
            raise PrepareError(f"max_rel_error={self.max_rel_error} must be in (0, 1)")

    @property
    def source_download_dir(self) -> Path:
        if self.download_dir is not None:
            return self.download_dir
        safe_repo = self.repo_id.replace("/", "--")
        safe_rev = self.revision.replace("/", "--")
        return self.models_dir / ".hyperqwen-source" / f"{safe_repo}@{safe_rev}"

    def describe(self) -> dict[str, Any]:
        """For logs and the manifest: never contains the token itself."""
        return {
            "MODEL_REPO": self.repo_id,
            "MODEL_REVISION": self.revision,
            "HF_TOKEN": mask_secret(self.token),
            "MODEL_SOURCE_DIR": str(self.source_dir) if self.source_dir else "",
            "HF_HUB_OFFLINE": self.offline,
            "QUANTIZE_EMBED": self.quantize_embed,
            "output_dir": str(self.output_dir),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "PrepareOptions":
        """Read the prepare knobs from an environment mapping (os.environ by default).

        A stand-in until the lead's `hyperqwen.settings` builds these; knob names follow CONTRACT.md.
        """
        env = os.environ if environ is None else environ
        models_dir = Path(env.get("MODELS_DIR") or DEFAULT_MODELS_DIR).expanduser()
        model = env.get("MODEL") or DEFAULT_MODEL
        model_path = Path(model).expanduser()
        output_dir = model_path if model_path.is_absolute() else models_dir / model_path
        source = env.get("MODEL_SOURCE_DIR") or ""
        values: dict[str, Any] = dict(
            output_dir=output_dir,
            models_dir=models_dir,
            repo_id=env.get("MODEL_REPO") or DEFAULT_MODEL_REPO,
            revision=env.get("MODEL_REVISION") or DEFAULT_MODEL_REVISION,
            token=env.get("HF_TOKEN") or "",
            source_dir=Path(source).expanduser() if source else None,
            offline=parse_bool("HF_HUB_OFFLINE", env.get("HF_HUB_OFFLINE", "")),
            quantize_embed=parse_bool("QUANTIZE_EMBED", env.get("QUANTIZE_EMBED", "")),
            hf_endpoint=env.get("HF_ENDPOINT") or None,
        )
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> "PrepareOptions":
        """From the lead's typed `Settings` (mapping-like, `settings.model_path`)."""
        source = settings["MODEL_SOURCE_DIR"] or ""
        values: dict[str, Any] = dict(
            output_dir=Path(settings.model_path),
            models_dir=Path(settings["MODELS_DIR"]),
            repo_id=settings["MODEL_REPO"],
            revision=settings["MODEL_REVISION"],
            token=settings["HF_TOKEN"] or "",
            source_dir=Path(source).expanduser() if source else None,
            offline=bool(settings["HF_HUB_OFFLINE"]),
            quantize_embed=bool(settings["QUANTIZE_EMBED"]),
            hf_endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
        values.update(overrides)
        return cls(**values)
