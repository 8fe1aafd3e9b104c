"""Each failure prepare can meet gives a clear error naming the file/knob and the fix, and writes nothing."""

import json
import shutil
import subprocess
import uuid

import pytest

from hyperqwen.prepare.errors import DiskSpaceError, PrepareCheckpointError, PrepareError
from hyperqwen.prepare.pipeline import StatePaths, _locked, prepare


def _assert_nothing_published(options):
    assert not options.output_dir.exists()


def test_other_architecture_is_refused(source, models_dir, make_options):
    config = json.loads((source / "config.json").read_text())
    config["architectures"], config["model_type"] = ["LlamaForCausalLM"], "llama"
    (source / "config.json").write_text(json.dumps(config))
    options = make_options(source, models_dir)
    with pytest.raises(PrepareCheckpointError) as info:
        prepare(options)
    message = str(info.value)
    assert "LlamaForCausalLM" in message and "'llama'" in message and "Qwen3_5ForConditionalGeneration" in message
    assert "MODEL_REPO" in message
    _assert_nothing_published(options)


def test_missing_tokenizer_json_is_refused(source, models_dir, make_options):
    (source / "tokenizer.json").unlink()
    options = make_options(source, models_dir)
    with pytest.raises(PrepareCheckpointError, match=r"tokenizer\.json is missing"):
        prepare(options)
    _assert_nothing_published(options)


def test_broken_tokenizer_is_refused(source, models_dir, make_options):
    (source / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(PrepareCheckpointError, match="does not load as a tokenizer"):
        prepare(make_options(source, models_dir))


def test_missing_config_is_refused(source, models_dir, make_options):
    (source / "config.json").unlink()
    with pytest.raises(PrepareError, match="MODEL_SOURCE_DIR=.* has no config.json"):
        prepare(make_options(source, models_dir))


def test_missing_shard_is_named(source, models_dir, make_options):
    (source / "model-00003-of-00003.safetensors").unlink()
    with pytest.raises(PrepareCheckpointError, match=r"model-00003-of-00003\.safetensors is missing"):
        prepare(make_options(source, models_dir))


def test_truncated_shard_is_named(source, models_dir, make_options):
    shard = source / "model-00002-of-00003.safetensors"
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 1000)
    with pytest.raises(PrepareCheckpointError) as info:
        prepare(make_options(source, models_dir))
    assert "model-00002-of-00003.safetensors" in str(info.value) and "truncated" in str(info.value)


def test_index_naming_a_tensor_the_shard_lacks(source, models_dir, make_options):
    index = json.loads((source / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.language_model.layers.99.mlp.up_proj.weight"] = "model-00001-of-00003.safetensors"
    (source / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PrepareCheckpointError, match="names 1 tensors missing from model-00001"):
        prepare(make_options(source, models_dir))


def test_quantization_config_of_another_method_is_refused(source, models_dir, make_options):
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(PrepareCheckpointError, match="quant_method is 'gptq'"):
        prepare(make_options(source, models_dir))


def test_second_prepare_on_the_same_model_is_refused(pristine_source, models_dir, make_options):
    options = make_options(pristine_source, models_dir)
    with _locked(StatePaths(options.output_dir)):
        with pytest.raises(PrepareError, match="another prepare is already working"):
            prepare(options)


def test_source_dir_that_does_not_exist(models_dir, make_options, tmp_path):
    with pytest.raises(PrepareError) as info:
        prepare(make_options(tmp_path / "nope", models_dir))
    assert "MODEL_SOURCE_DIR=" in str(info.value) and "is not a directory" in str(info.value)


# --- disk full, on a real small tmpfs ------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 3 MiB tmpfs (needs CAP_SYS_ADMIN, e.g. root in this dev box); skipped where mount is not allowed."""
    mountpoint = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mountpoint.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mountpoint)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False)


def test_preflight_refuses_when_the_disk_is_too_small(pristine_source, small_tmpfs, make_options):
    options = make_options(pristine_source, small_tmpfs)
    with pytest.raises(DiskSpaceError) as info:
        prepare(options)
    message = str(info.value)
    assert "GiB free" in message and str(small_tmpfs) in message and "MODELS_DIR" in message
    _assert_nothing_published(options)


def test_disk_full_while_writing_is_clean(pristine_source, small_tmpfs, make_options):
    # Skip the preflight so the kernel's ENOSPC is what stops us, half-way through a shard.
    options = make_options(pristine_source, small_tmpfs, check_disk_space=False)
    with pytest.raises(DiskSpaceError) as info:
        prepare(options)
    assert "disk full while writing" in str(info.value) and "resumes" in str(info.value)
    _assert_nothing_published(options)
    assert not list(small_tmpfs.rglob("*.hyperqwen-tmp"))  # the partial file was removed
    # With room again (a bigger disk), the same command finishes from where it stopped.
    bigger = small_tmpfs.parent / "bigger"
    shutil.copytree(small_tmpfs, bigger, symlinks=True)
    retry = make_options(pristine_source, bigger)
    result = prepare(retry)
    assert result.changed and result.files_reused  # files finished before the disk filled were kept


def test_a_model_directory_prepare_did_not_make_is_never_replaced(pristine_source, models_dir, make_options):
    options = make_options(pristine_source, models_dir)
    options.output_dir.mkdir()
    (options.output_dir / "my-notes.txt").write_text("mine")
    with pytest.raises(PrepareError) as info:
        prepare(options)
    assert "was not made by hyperqwen prepare" in str(info.value) and "MODEL" in str(info.value)
    assert (options.output_dir / "my-notes.txt").read_text() == "mine"


# --- verification of a prepared directory (what `prepare --verify-only` and the server start rely on) -----


@pytest.fixture
def prepared_copy(pristine_source, tmp_path, make_options):
    options = make_options(pristine_source, tmp_path / "models")
    prepare(options)
    copy = tmp_path / "copy"
    shutil.copytree(options.output_dir, copy)
    return copy


def _edit_config(directory, edit):
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))


def test_verify_catches_a_config_that_no_longer_targets_the_int8_tensors(prepared_copy):
    from hyperqwen.prepare.verify import verify_checkpoint

    _edit_config(prepared_copy, lambda c: c["quantization_config"]["config_groups"].pop("hyperqwen_int8_g128"))
    with pytest.raises(PrepareCheckpointError, match="is packed but quantization_config does not target it"):
        verify_checkpoint(prepared_copy)


def test_verify_catches_a_group_size_that_disagrees_with_the_scales(prepared_copy):
    from hyperqwen.prepare.verify import verify_checkpoint

    def edit(config):
        config["quantization_config"]["config_groups"]["hyperqwen_int8_g128"]["weights"]["group_size"] = 64

    _edit_config(prepared_copy, edit)
    with pytest.raises(PrepareCheckpointError, match=r"weight_scale has shape \[\d+, \d+\], expected"):
        verify_checkpoint(prepared_copy)


def test_verify_catches_a_vocab_size_that_disagrees_with_lm_head(prepared_copy):
    from hyperqwen.prepare.verify import verify_checkpoint

    _edit_config(prepared_copy, lambda c: c["text_config"].update(vocab_size=999))
    with pytest.raises(PrepareCheckpointError, match="lm_head has 1024 rows but config vocab_size is 999"):
        verify_checkpoint(prepared_copy)


def test_verify_catches_a_missing_mtp_head(prepared_copy):
    from hyperqwen.prepare.verify import verify_checkpoint

    index_path = prepared_copy / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    (prepared_copy / "model-00003-of-00003.safetensors").unlink()  # the MTP shard
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    index_path.write_text(json.dumps(index))
    with pytest.raises(PrepareCheckpointError, match="no mtp"):
        verify_checkpoint(prepared_copy)
