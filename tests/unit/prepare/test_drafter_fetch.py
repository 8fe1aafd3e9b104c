"""prepare's drafter fetch: the main model's resumable, verified download path, pointed at the drafter repo.

Against the fake hub of test_hub_download (no network here; huggingface_hub's client and our download code
are real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperqwen.prepare.drafter import DRAFTER_DIR_NAME, fetch_drafter
from hyperqwen.prepare.errors import PrepareError
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.source import COMPLETE_MARKER
from hyperqwen.spec.drafter import check_drafter
from support.fakehub import REPO, FakeHub

DRAFTER_CONFIG = {
    "speculators_model_type": "dflash2",
    "transformer_layer_config": {"hidden_size": 256, "vocab_size": 49216, "num_hidden_layers": 1},
    "aux_hidden_state_layer_ids": [1, 3],
    "mask_token_id": 0,
    "speculators_config": {"proposal_methods": [{"speculative_tokens": 7}], "verifier": {"name_or_path": "t"}},
}


@pytest.fixture
def drafter_hub():
    files = {"config.json": json.dumps(DRAFTER_CONFIG).encode(), "model.safetensors": b"\1" * 4096}
    with FakeHub(files) as hub:
        yield hub


def options(tmp_path: Path, hub: FakeHub) -> PrepareOptions:
    return PrepareOptions(
        output_dir=tmp_path / "models" / "m",
        models_dir=tmp_path / "models",
        repo_id=REPO,
        revision="main",
        hf_endpoint=hub.endpoint,
        show_progress=False,
    )


def test_fetch_verifies_and_a_second_run_downloads_nothing(tmp_path, drafter_hub):
    folder = fetch_drafter(options(tmp_path, drafter_hub), repo_id=REPO, revision="main")
    assert folder == tmp_path / "models" / DRAFTER_DIR_NAME
    assert (folder / "model.safetensors").read_bytes() == b"\1" * 4096
    assert (folder / COMPLETE_MARKER).is_file()
    assert len(drafter_hub.gets("model.safetensors")) == 1
    fetch_drafter(options(tmp_path, drafter_hub), repo_id=REPO, revision="main")
    assert len(drafter_hub.gets("model.safetensors")) == 1, "a verified drafter was downloaded again"
    # serve's check accepts it against a target of the same shape
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 256, "vocab_size": 49216, "num_hidden_layers": 4}))
    assert check_drafter(folder, target).kind == "dflash2"


def test_a_repo_that_is_not_a_drafter_is_one_prepare_error(tmp_path):
    files = {
        "config.json": json.dumps({"architectures": ["Qwen3_5ForCausalLM"]}).encode(),
        "model.safetensors": b"\0" * 64,
    }
    with FakeHub(files) as hub, pytest.raises(PrepareError, match="not a DFlash/DFlash2 drafter") as excinfo:
        fetch_drafter(options(tmp_path, hub), repo_id=REPO, revision="main")
    assert "PREPARE_DRAFTER=off" in str(excinfo.value)
