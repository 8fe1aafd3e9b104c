"""What `hyperqwen prepare` is asked to do, built from the prepare knobs (docs/knobs.md) by the one settings loader."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperqwen.config.keyrule import masked
from hyperqwen.config.knobs import KNOBS_BY_NAME
from hyperqwen.prepare.errors import PrepareError

if TYPE_CHECKING:
    from hyperqwen.config.settings import Settings, SettingsError

# The defaults of a PrepareOptions built by hand (tests, tools) are the knobs' own (config/knobs.py).
DEFAULT_MODEL_REPO: str = KNOBS_BY_NAME["MODEL_REPO"].default


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
    """Everything prepare needs. `output_dir` is the servable checkpoint (MODELS_DIR/MODEL)."""

    output_dir: Path
    models_dir: Path = Path(KNOBS_BY_NAME["MODELS_DIR"].default)
    repo_id: str = DEFAULT_MODEL_REPO
    revision: str = KNOBS_BY_NAME["MODEL_REVISION"].default
    token: str = dataclasses.field(default=KNOBS_BY_NAME["HF_TOKEN"].default, repr=False)
    source_dir: Path | None = None
    offline: bool = KNOBS_BY_NAME["HF_HUB_OFFLINE"].default
    quantize_embed: bool = KNOBS_BY_NAME["QUANTIZE_EMBED"].default
    hf_endpoint: str | None = None
    # Where hub downloads land (resumable, kept between runs); default under MODELS_DIR.
    download_dir: Path | None = None
    # Relative Frobenius error bound for a whole int8 group-128 tensor (a Gaussian tensor measures ~0.65%).
    max_rel_error: float = 0.01
    # Bound for every 128-group: the relative error of the group's weights other than its largest one (that one
    # is always exact to half a step). A group whose largest weight is ~40x the RMS of the others reaches it:
    # those weights then round to a handful of levels or to zero, which the per-tensor bound cannot see.
    max_group_rel_error: float = 0.10
    # Bytes of float32 working set per row block; bounds peak RSS whatever the tensor size.
    block_bytes: int = 64 << 20
    check_disk_space: bool = True
    show_progress: bool = True
    # DRAFT_VOCAB: N most used token ids for the MTP drafter (patch 0007); 0 = off.
    draft_vocab: int = KNOBS_BY_NAME["DRAFT_VOCAB"].default
    # DRAFT_VOCAB_IDS: counts from `hyperqwen draft-vocab-recount` instead of the shipped corpus.
    draft_vocab_ids: Path | None = None
    # The corpus counted when no ids file is given (default: prepare/draft-vocab-corpus/).
    draft_vocab_corpus: Path | None = None

    def __post_init__(self) -> None:
        # Only what the knob table cannot say: a knob's type, range and default are checked by the settings
        # loader (an empty MODEL_REVISION is unset, so it is `main`; DRAFT_VOCAB has min=0).
        if not self.repo_id or self.repo_id.count("/") != 1 or any(not p for p in self.repo_id.split("/")):
            if self.source_dir is None:
                raise PrepareError(
                    f"MODEL_REPO={self.repo_id!r} is not a Hugging Face repo id",
                    fix=f"use the form owner/name, e.g. {DEFAULT_MODEL_REPO}",
                    knob="MODEL_REPO",
                )
        if self.draft_vocab_ids is not None and not self.draft_vocab:
            raise PrepareError(
                f"DRAFT_VOCAB_IDS={str(self.draft_vocab_ids)!r} is set but DRAFT_VOCAB is 0 (off)",
                fix="set DRAFT_VOCAB to the number of ids to keep (e.g. 40960), or unset DRAFT_VOCAB_IDS",
                knob="DRAFT_VOCAB",
            )
        if not 0 < self.max_rel_error < 1:
            raise PrepareError(f"max_rel_error={self.max_rel_error} must be in (0, 1)")
        if not 0 < self.max_group_rel_error <= 1:
            raise PrepareError(f"max_group_rel_error={self.max_group_rel_error} must be in (0, 1]")

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
            "HF_TOKEN": masked(self.token),
            "MODEL_SOURCE_DIR": str(self.source_dir) if self.source_dir else "",
            "HF_HUB_OFFLINE": self.offline,
            "QUANTIZE_EMBED": self.quantize_embed,
            "DRAFT_VOCAB": self.draft_vocab,
            "DRAFT_VOCAB_IDS": str(self.draft_vocab_ids) if self.draft_vocab_ids else "",
            "output_dir": str(self.output_dir),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> PrepareOptions:
        """Resolve the prepare knobs from an environment mapping (os.environ by default) through the one
        settings loader (defaults < mode profile < ./.env < environment), so types, defaults and error
        messages are the server's."""
        from hyperqwen.config.load import load_settings
        from hyperqwen.config.settings import SettingsError

        env = os.environ if environ is None else environ
        try:
            settings = load_settings(env)
        except SettingsError as exc:
            raise _settings_error(exc) from None
        return cls.from_settings(settings, **overrides)

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None) -> PrepareOptions:
        """From the `--mode/--env-file/--set` flags `add_settings_arguments` gave the command."""
        return cls.from_settings(resolve_settings_from_args(args, environ))

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> PrepareOptions:
        """From the typed `Settings`: the prepare knobs, MODEL's path and DRAFT_VOCAB_IDS under MODELS_DIR."""
        knobs = settings.knobs
        ids_file = knobs.draft_vocab_ids
        values: dict[str, Any] = dict(
            output_dir=settings.model_path,
            models_dir=Path(knobs.models_dir),
            repo_id=knobs.model_repo,
            revision=knobs.model_revision,
            token=knobs.hf_token,
            source_dir=Path(knobs.model_source_dir).expanduser() if knobs.model_source_dir else None,
            offline=knobs.hf_hub_offline,
            quantize_embed=knobs.quantize_embed,
            draft_vocab=knobs.draft_vocab,
            draft_vocab_ids=settings.under_models_dir(ids_file) if ids_file else None,
            hf_endpoint=os.environ.get("HF_ENDPOINT") or None,  # huggingface_hub's variable, not a knob
        )
        values.update(overrides)
        return cls(**values)


def resolve_settings_from_args(args: Any, environ: Mapping[str, str] | None = None) -> Settings:
    """The typed Settings for the command's flags; a bad knob becomes a PrepareError naming it."""
    from hyperqwen.config.load import settings_from_args
    from hyperqwen.config.settings import SettingsError

    environ = os.environ if environ is None else environ
    try:
        settings = settings_from_args(args, environ)
    except SettingsError as exc:
        raise _settings_error(exc) from None
    refuse_misspelt_model_source(settings, getattr(args, "env_file", None), environ)
    return settings


def refuse_misspelt_model_source(settings: Settings, env_file: str | Path | None, environ: Mapping[str, str]) -> None:
    """A misspelt model-source knob (MODEL_REPOO=...) would leave the real one at its default, and prepare would
    download the default model (~20 GB) instead of the one meant: stop before anything is fetched."""
    from hyperqwen.config.load import read_env_layer
    from hyperqwen.config.names import MODEL_SOURCE_KNOBS, misspelt_model_source, unknown_names

    env_values, _ = read_env_layer(env_file)
    explicit = [name for name in MODEL_SOURCE_KNOBS if settings.explicit(name)]
    misspelt = misspelt_model_source(unknown_names(env_values, environ), explicit)
    if misspelt:
        unknown = misspelt[0]
        # The knob is named at run time (whichever one was misspelt), so it is read by name.
        raise PrepareError(
            f"{unknown.name} (in {unknown.where}) is not a knob, so {unknown.guess} keeps its default "
            f"({settings[unknown.guess]!r}); nothing was downloaded",
            fix=f"rename {unknown.name} to {unknown.guess} (or remove it to use the default)",
            knob=unknown.guess,
        )


def _settings_error(exc: SettingsError) -> PrepareError:
    first = next((p for p in exc.problems if p.severity == "error"), exc.problems[0])
    return PrepareError(first.message, fix="see docs/knobs.md for the allowed values", knob=first.knob or "")
