from pathlib import Path

import pytest

from hyperqwen.config.keyrule import masked
from hyperqwen.prepare.errors import PrepareError
from hyperqwen.prepare.options import DEFAULT_MODEL_REPO, PrepareOptions


def test_defaults_follow_the_contract():
    options = PrepareOptions.from_env({})
    assert options.repo_id == DEFAULT_MODEL_REPO == "dbirks/Qwen3.8-27B-W4A16-AutoRound"
    assert options.revision == "main"
    assert options.output_dir == Path("/models/qwen3.8-27b")
    assert (
        options.source_dir is None and not options.offline and options.quantize_embed
    )  # default on (patches 0004/0005)
    assert options.source_download_dir == Path("/models/.hyperqwen-source/dbirks--Qwen3.8-27B-W4A16-AutoRound@main")


def test_knobs_are_read(tmp_path):
    env = {
        "MODELS_DIR": str(tmp_path),
        "MODEL": "mine",
        "MODEL_REPO": "org/repo",
        "MODEL_REVISION": "v2",
        "MODEL_SOURCE_DIR": "/src",
        "HF_HUB_OFFLINE": "yes",
        "QUANTIZE_EMBED": "On",
        "HF_TOKEN": "hf_secret123456",
    }
    options = PrepareOptions.from_env(env)
    assert options.output_dir == tmp_path / "mine"
    assert (options.repo_id, options.revision, options.source_dir) == ("org/repo", "v2", Path("/src"))
    assert options.offline and options.quantize_embed and options.token == "hf_secret123456"


def test_absolute_model_path_is_not_under_models_dir():
    assert PrepareOptions.from_env({"MODEL": "/elsewhere/m"}).output_dir == Path("/elsewhere/m")


@pytest.mark.parametrize("knob", ["HF_HUB_OFFLINE", "QUANTIZE_EMBED"])
def test_bad_boolean_names_the_knob(knob):
    with pytest.raises(PrepareError) as info:
        PrepareOptions.from_env({knob: "maybe"})
    assert knob in str(info.value) and "'maybe'" in str(info.value) and "true | false" in str(info.value)


def test_bad_repo_id_is_explained():
    with pytest.raises(PrepareError) as info:
        PrepareOptions.from_env({"MODEL_REPO": "not-a-repo"})
    assert "MODEL_REPO='not-a-repo'" in str(info.value) and "owner/name" in str(info.value)


def test_token_never_appears_in_repr_or_description():
    token = "hf_abcdefghijklmnopqrstuvwxyz"
    options = PrepareOptions.from_env({"HF_TOKEN": token})
    assert token not in repr(options)
    assert token not in str(options.describe())
    assert options.describe()["HF_TOKEN"] == masked(token) != token
    assert masked("") == "(unset)" and masked("short") == "****"
