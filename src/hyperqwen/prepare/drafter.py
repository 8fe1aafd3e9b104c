"""Fetch the DFlash2 drafter for SPEC=dflash2 through the same download path as the main model.

The drafter needs no requantization (it is published as W4A16 compressed-tensors), so it is the download
itself: `source.hub_source` fetches it file by file with resumable partial files, checks every file against
the hub's size and sha256 at the pinned revision, fsyncs each file before its final name and writes the
completion marker last. A folder without that marker (an interrupted fetch) has no `model.safetensors`, so
`hyperqwen.spec.drafter.check_drafter` refuses it at serve time instead of vLLM failing deep in loading.

Hook (for the prepare pipeline's owner to wire): after the main model, `fetch_drafter(options)` unless a
knob (PREPARE_DRAFTER=off) skips the ~1.2 GB download; DRAFT's default names DRAFTER_DIR_NAME. The PrepareError
messages below already name that knob.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from hyperqwen.config.knobs import DFLASH2_DRAFTER_DIR
from hyperqwen.prepare.errors import PrepareError
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.source import hub_source
from hyperqwen.spec.drafter import (
    DFLASH2_DRAFTER_REPO,
    DFLASH2_DRAFTER_REVISION,
    DFLASH2_DRAFTER_WEIGHTS,
    DrafterError,
    read_drafter,
)

log = logging.getLogger("hyperqwen.prepare")

# The folder under MODELS_DIR: DRAFT's default (config/knobs.py), so a fetched drafter needs no setting.
DRAFTER_DIR_NAME = DFLASH2_DRAFTER_DIR


def drafter_dir(models_dir: Path) -> Path:
    return Path(models_dir) / DRAFTER_DIR_NAME


def drafter_options(
    options: PrepareOptions, *, repo_id: str = DFLASH2_DRAFTER_REPO, revision: str = DFLASH2_DRAFTER_REVISION
) -> PrepareOptions:
    """The main model's options (token, endpoint, offline, disk checks) pointed at the drafter repo."""
    target = drafter_dir(options.models_dir)
    return dataclasses.replace(
        options,
        output_dir=target,
        download_dir=target,
        repo_id=repo_id,
        revision=revision,
        source_dir=None,
        draft_vocab=0,
        draft_vocab_ids=None,
    )


def fetch_drafter(
    options: PrepareOptions, *, repo_id: str = DFLASH2_DRAFTER_REPO, revision: str = DFLASH2_DRAFTER_REVISION
) -> Path:
    """Download (or verify an earlier download of) the drafter; returns its folder, ready for DRAFT."""
    opts = drafter_options(options, repo_id=repo_id, revision=revision)
    source = hub_source(opts)
    folder = source.directory
    if repo_id == DFLASH2_DRAFTER_REPO and revision == DFLASH2_DRAFTER_REVISION:
        # The hub's own sha256 was checked per file; these are the pinned file sizes as published, so a
        # force-pushed revision or a different repo content shows up here by name.
        for name, (size, _sha256) in DFLASH2_DRAFTER_WEIGHTS.items():
            actual = (folder / name).stat().st_size if (folder / name).is_file() else None
            if actual != size:
                raise PrepareError(
                    f"drafter {folder}: {name} is {actual} bytes, the pinned {repo_id}@{revision} has {size}",
                    fix="delete the folder and run prepare again",
                    knob="PREPARE_DRAFTER",
                )
    try:
        info = read_drafter(folder)
    except DrafterError as exc:
        raise PrepareError(
            str(exc),
            fix=f"PREPARE_DRAFTER=off skips the drafter; {repo_id}@{revision} should be a DFlash2 checkpoint",
            knob="PREPARE_DRAFTER",
        ) from None
    log.info(
        "drafter ready at %s (%s, %s layout); set SPEC=dflash2 DRAFT=%s",
        folder,
        info.kind,
        info.layout,
        DRAFTER_DIR_NAME,
    )
    return folder
