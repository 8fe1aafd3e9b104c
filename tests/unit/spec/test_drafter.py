"""hyperqwen.spec.drafter: a missing or mismatched DFlash/DFlash2 drafter is one clear error naming its path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperqwen.spec.drafter import DrafterError, check_drafter, read_drafter

# The real model's text shape (Qwen3.8-27B: hidden 5,120, vocabulary 248,320, 64 layers), multimodal layout.
TARGET = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "text_config": {"hidden_size": 5120, "vocab_size": 248320, "num_hidden_layers": 64},
}


def speculators_dflash2(hidden: int = 5120, vocab: int = 248320, aux: list[int] | None = None) -> dict:
    """A speculators-format DFlash2 config, the layout vLLM 0.32.0's `update_dflash2` converts."""
    return {
        "speculators_model_type": "dflash2",
        "transformer_layer_config": {"hidden_size": hidden, "vocab_size": vocab, "num_hidden_layers": 5},
        "aux_hidden_state_layer_ids": aux if aux is not None else [2, 17, 33, 48, 63],
        "mask_token_id": 248077,
        "speculators_config": {
            "proposal_methods": [{"speculative_tokens": 7}],
            "verifier": {"name_or_path": "Qwen/Qwen3.8-27B", "architectures": ["Qwen3_5ForConditionalGeneration"]},
        },
    }


def write(folder: Path, config: dict | None, weights: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / "model.safetensors").write_bytes(b"\0" * 8)
    return folder


@pytest.fixture
def target(tmp_path) -> Path:
    return write(tmp_path / "Qwen3.8-27B", TARGET)


def test_matching_speculators_dflash2_drafter(tmp_path, target):
    info = check_drafter(write(tmp_path / "drafter", speculators_dflash2()), target)
    assert (info.kind, info.layout, info.vllm_method, info.vllm_architecture) == (
        "dflash2", "speculators", "dflash", "DFlash2Qwen3ForCausalLM"
    )
    # vLLM's update_dflash maps the 1-based speculators ids with i - 1.
    assert info.target_layer_ids == (1, 16, 32, 47, 62)
    assert info.verifier == "Qwen/Qwen3.8-27B"


def test_matching_hf_layout_drafter(tmp_path, target):
    config = {"architectures": ["DFlash2DraftModel"], "hidden_size": 5120, "vocab_size": 248320,
              "dflash_config": {"target_layer_ids": [1, 16, 32, 47, 62]}}
    info = check_drafter(write(tmp_path / "drafter", config), target)
    assert (info.kind, info.layout) == ("dflash2", "hf")


@pytest.mark.parametrize(
    ("config", "weights", "expected"),
    [
        (None, True, "has no config.json"),
        (speculators_dflash2(), False, "no model.safetensors"),
        (speculators_dflash2(hidden=4096), True, "hidden states of size 4096, but the target"),
        (speculators_dflash2(vocab=151936), True, "vocab_size 151936, the target"),
        (speculators_dflash2(aux=[2, 17, 33, 48, 80]), True, "has 64 layers (bad: [79])"),
        ({"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 5120, "vocab_size": 248320}, True,
         "not a DFlash/DFlash2 drafter"),
        ({**speculators_dflash2(), "speculators_model_type": "eagle3"}, True, "speculators 'eagle3' checkpoint"),
    ],
)
def test_mismatch_is_one_error_naming_the_drafter(tmp_path, target, config, weights, expected):
    drafter = write(tmp_path / "drafter", config, weights)
    with pytest.raises(DrafterError) as excinfo:
        check_drafter(drafter, target)
    message = str(excinfo.value)
    assert expected in message
    assert str(drafter) in message


def test_missing_drafter_folder_names_the_knob(tmp_path, target):
    with pytest.raises(DrafterError, match=r"drafter .*missing-drafter \(DRAFT\) does not exist"):
        check_drafter(tmp_path / "missing-drafter", target)


def test_target_text_config_or_top_level(tmp_path):
    tiny = write(tmp_path / "tiny", {"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 256,
                                     "vocab_size": 49216, "num_hidden_layers": 4})
    drafter = write(tmp_path / "drafter", speculators_dflash2(hidden=256, vocab=49216, aux=[1, 3]))
    assert check_drafter(drafter, tiny).target_layer_ids == (0, 2)
    assert read_drafter(drafter).hidden_size == 256


def header_only(path: Path, names_shapes: dict[str, list[int]]) -> None:
    """A bf16 safetensors header with correct offsets and no data (the check reads names only)."""
    header, offset = {}, 0
    for name, shape in names_shapes.items():
        n = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)


def test_drafter_for_another_target_family_is_named(tmp_path, target):
    config = speculators_dflash2()
    config["speculators_config"]["verifier"] = {"name_or_path": "Qwen/Qwen3-32B", "architectures": ["Qwen3ForCausalLM"]}
    drafter = write(tmp_path / "drafter", config)
    with pytest.raises(DrafterError) as excinfo:
        check_drafter(drafter, target)
    message = str(excinfo.value)
    assert str(drafter) in message and "trained for a Qwen3ForCausalLM target (Qwen/Qwen3-32B)" in message
    assert "is Qwen3_5ForConditionalGeneration" in message


def test_text_only_and_multimodal_targets_are_one_family(tmp_path, target):
    config = speculators_dflash2()
    config["speculators_config"]["verifier"]["architectures"] = ["Qwen3_5ForCausalLM"]
    assert check_drafter(write(tmp_path / "drafter", config), target).verifier_architectures == ("Qwen3_5ForCausalLM",)


def test_narrow_drafter_on_the_targets_embedding_is_an_error(tmp_path, target):
    """hidden 4096 reading 5120-wide target states (target_hidden_size set), no embedding of its own: vLLM would
    keep a separate, never-loaded embedding and draft garbage without an error."""
    config = speculators_dflash2(hidden=4096)
    config["target_hidden_size"] = 5120
    drafter = write(tmp_path / "drafter", config, weights=False)
    header_only(drafter / "model.safetensors", {"fc.weight": [4096, 25600], "norm.weight": [4096]})
    with pytest.raises(DrafterError) as excinfo:
        check_drafter(drafter, target)
    message = str(excinfo.value)
    assert str(drafter) in message and "hidden_size 4096 and no embed_tokens/lm_head of its own" in message
    # With its own embedding and lm_head the narrower drafter is fine.
    header_only(drafter / "model.safetensors", {"fc.weight": [4096, 25600], "embed_tokens.weight": [248320, 4096],
                                                "lm_head.weight": [248320, 4096]})
    assert check_drafter(drafter, target).hidden_size == 4096
