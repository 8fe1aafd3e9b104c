"""prepare end to end on tiny synthetic checkpoints: every step, idempotency, staleness, resume."""

import json
import os

import numpy as np
import pytest
from safetensors import safe_open

from hyperqwen.formats.safetensors import read_header
from hyperqwen.prepare.checkpoint import LM_HEAD_TARGET, OUR_GROUP
from hyperqwen.prepare.pipeline import MANIFEST_NAME, StatePaths, prepare
from hyperqwen.prepare.verify import verify_checkpoint

MTP_LINEARS = (
    ["mtp.fc"]
    + [f"mtp.layers.0.self_attn.{p}_proj" for p in "qkvo"]
    + [f"mtp.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")]
)


def _weight_map(directory):
    return json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]


def test_prepare_writes_a_verified_int8_checkpoint(pristine_source, models_dir, make_options):
    options = make_options(pristine_source, models_dir)
    result = prepare(options)
    out = options.output_dir
    assert result.changed
    weight_map = _weight_map(out)
    for module in ["lm_head", *MTP_LINEARS]:
        assert f"{module}.weight" not in weight_map
        for suffix in ("weight_packed", "weight_scale", "weight_shape"):
            assert f"{module}.{suffix}" in weight_map
    assert "model.language_model.embed_tokens.weight" in weight_map  # QUANTIZE_EMBED is off by default
    # The W4A16 body and everything else is carried over untouched.
    src_map = _weight_map(pristine_source)
    untouched = [n for n in src_map if n.startswith("model.")]
    for name in untouched:
        with safe_open(pristine_source / src_map[name], "numpy") as a, safe_open(out / weight_map[name], "numpy") as b:
            sa, sb = a.get_slice(name), b.get_slice(name)
            assert (sa.get_dtype(), sa.get_shape()) == (sb.get_dtype(), sb.get_shape())
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["targets"] == ["Linear"]  # the body's W4A16 group is kept
    ours = qc["config_groups"][OUR_GROUP]
    assert ours["weights"]["num_bits"] == 8 and ours["weights"]["group_size"] == 128 and ours["weights"]["symmetric"]
    assert sorted(ours["targets"]) == sorted([LM_HEAD_TARGET, *MTP_LINEARS])
    assert "lm_head" not in qc["ignore"] and not any(i.startswith("mtp.") for i in qc["ignore"])
    assert any(i.startswith("model.visual.") for i in qc["ignore"])  # still ignored
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["steps"] == ["source", "requantize", "verify", "manifest"]
    assert set(manifest["quantized"]) == {f"{m}.weight" for m in ["lm_head", *MTP_LINEARS]}
    assert all(0 < q["rel_frobenius_error"] < 0.01 for q in manifest["quantized"].values())
    files = sorted(p.name for p in out.iterdir() if p.name != MANIFEST_NAME)
    assert sorted(manifest["files"]) == files
    report = verify_checkpoint(out)
    assert report.quantized_modules > 9 and report.think_ids
    assert not StatePaths(out).staging.exists() and not StatePaths(out).progress.exists()


def test_body_tensor_bytes_survive_the_rewrite(pristine_source, models_dir, make_options):
    options = make_options(pristine_source, models_dir)
    prepare(options)
    shard = "model-00003-of-00003.safetensors"  # the MTP shard is rewritten; its norms are copied
    src = read_header(pristine_source / shard)
    dst = read_header(options.output_dir / shard)
    for name in ("mtp.norm.weight", "mtp.layers.0.self_attn.q_norm.weight"):
        a, b = src.tensors[name], dst.tensors[name]
        with open(src.path, "rb") as fa, open(dst.path, "rb") as fb:
            fa.seek(a.begin)
            fb.seek(b.begin)
            assert fa.read(a.nbytes) == fb.read(b.nbytes)


def test_rerun_is_a_noop(pristine_source, models_dir, make_options):
    options = make_options(pristine_source, models_dir)
    prepare(options)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in options.output_dir.iterdir()}
    result = prepare(options)
    assert not result.changed and result.files_written == []
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in options.output_dir.iterdir()} == before


def test_quantize_embed_redoes_only_the_affected_files(pristine_source, models_dir, make_options, tree_bytes):
    prepare(make_options(pristine_source, models_dir))
    out = models_dir / "qwen3.8-27b"
    inodes = {p.name: p.stat().st_ino for p in out.iterdir()}
    result = prepare(make_options(pristine_source, models_dir, quantize_embed=True))
    assert result.changed
    assert sorted(result.files_written) == [
        "config.json",
        "model-00001-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    assert "model-00003-of-00003.safetensors" in result.files_reused
    assert out.joinpath("model-00003-of-00003.safetensors").stat().st_ino == inodes["model-00003-of-00003.safetensors"]
    weight_map = _weight_map(out)
    assert "model.language_model.embed_tokens.weight_packed" in weight_map
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "model.language_model.embed_tokens" in qc["config_groups"][OUR_GROUP]["targets"]
    assert result.quant_errors["model.language_model.embed_tokens.weight"] < 0.01
    # The same result as preparing with QUANTIZE_EMBED from scratch.
    fresh = make_options(
        pristine_source,
        models_dir.parent / "fresh",
        quantize_embed=True,
        output_dir=models_dir.parent / "fresh" / "qwen3.8-27b",
    )
    prepare(fresh)
    assert tree_bytes(fresh.output_dir) == tree_bytes(out)


def test_missing_and_damaged_files_are_rebuilt_and_nothing_else(pristine_source, models_dir, make_options, tree_bytes):
    options = make_options(pristine_source, models_dir)
    prepare(options)
    out = options.output_dir
    good = tree_bytes(out)
    (out / "model-00002-of-00003.safetensors").unlink()
    with open(out / "tokenizer_config.json", "r+b") as handle:  # same size, different bytes
        first = handle.read(1)
        handle.seek(0)
        handle.write(b"X" if first != b"X" else b"Y")
    result = prepare(options)
    assert result.changed
    assert sorted(result.files_written) == ["model-00002-of-00003.safetensors", "tokenizer_config.json"]
    assert tree_bytes(out) == good


def test_resume_after_a_crash_reuses_finished_files(pristine_source, models_dir, make_options, tree_bytes, monkeypatch):
    reference = make_options(pristine_source, models_dir.parent / "ref", output_dir=models_dir.parent / "ref" / "m")
    prepare(reference)
    options = make_options(pristine_source, models_dir)

    class Stop(Exception):
        pass

    import hyperqwen.prepare.pipeline as pipeline

    real = pipeline.write_rewritten_shard
    calls = []

    def failing(spec, target, opts):
        calls.append(spec.path)
        if len(calls) == 2:  # the second rewritten shard dies half-way (an exception, like a full disk)
            raise Stop()
        return real(spec, target, opts)

    monkeypatch.setattr(pipeline, "write_rewritten_shard", failing)
    with pytest.raises(Stop):
        prepare(options)
    assert not options.output_dir.exists()  # nothing published
    monkeypatch.setattr(pipeline, "write_rewritten_shard", real)
    result = prepare(options)
    assert calls[0] in result.files_reused and calls[1] in result.files_written
    assert tree_bytes(options.output_dir) == tree_bytes(reference.output_dir)


def test_source_change_makes_the_model_stale(source, models_dir, make_options):
    options = make_options(source, models_dir)
    prepare(options)
    os.utime(source / "tokenizer.json", ns=(1, 1))  # the source file changed (mtime/size identity)
    result = prepare(options)
    assert result.changed and result.files_written == ["tokenizer.json"]


def test_single_file_checkpoint_without_index(tmp_path, make_options):
    from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint

    src = tmp_path / "single"
    layout = write_synthetic_checkpoint(src, SyntheticShape(shards=1))
    (shard,) = layout
    (src / shard).rename(src / "model.safetensors")
    (src / "model.safetensors.index.json").unlink()
    options = make_options(src, tmp_path / "models")
    result = prepare(options)
    assert "lm_head.weight" in result.quant_errors
    assert not (options.output_dir / "model.safetensors.index.json").exists()
    with safe_open(options.output_dir / "model.safetensors", "numpy") as handle:
        assert handle.get_tensor("lm_head.weight_packed").dtype == np.int32


def test_publish_without_rename_exchange_fake_fs_recovers_from_a_crash(
    pristine_source, models_dir, make_options, tree_bytes, monkeypatch
):
    """Filesystems without renameat2(RENAME_EXCHANGE) (faked here by making the swap report EINVAL-unsupported):
    old model renamed away, new one renamed in. A crash between the two renames leaves no model directory;
    the next run puts a complete one back."""
    import hyperqwen.prepare.pipeline as pipeline

    reference = make_options(
        pristine_source, models_dir.parent / "ref", output_dir=models_dir.parent / "ref" / "m", quantize_embed=True
    )
    prepare(reference)
    prepare(make_options(pristine_source, models_dir))
    monkeypatch.setattr(pipeline, "exchange_dirs", lambda a, b: False)

    class Crash(BaseException):
        pass

    def crash_between_renames(label):
        if label == "between-renames":
            raise Crash()

    monkeypatch.setattr(pipeline, "crash_point", crash_between_renames)
    options = make_options(pristine_source, models_dir, quantize_embed=True)
    with pytest.raises(Crash):
        prepare(options)
    paths = StatePaths(options.output_dir)
    assert not options.output_dir.exists() and paths.old.is_dir() and paths.staging.is_dir()
    monkeypatch.setattr(pipeline, "crash_point", lambda label: None)
    result = prepare(options)  # recovery: the old model is put back, then replaced properly
    assert result.changed
    assert tree_bytes(options.output_dir) == tree_bytes(reference.output_dir)
    assert not paths.old.exists() and not paths.staging.exists()
