"""The int8 group-128 layout against the compressed-tensors library itself (not only our own code)."""

import json
import math

import numpy as np
import pytest
from safetensors import safe_open

from hyperqwen.prepare.checkpoint import OUR_GROUP
from hyperqwen.prepare.errors import QuantizationError
from hyperqwen.prepare.pipeline import prepare
from hyperqwen.prepare.quantize import GROUP_SIZE, dequantize, quantize_block, weight_scheme
from hyperqwen.prepare.safetensors_io import bf16_to_f32, f32_to_bf16_bits
from support.tools import require_modules

require_modules("torch", "compressed_tensors", why="the reference int8 packing comes from vLLM's requirements")
import torch  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme  # noqa: E402


def test_packing_is_bit_identical_to_compressed_tensors():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 256), dtype=np.float32)
    packed, stored, _, _ = quantize_block(w, "F32")
    scale = stored.astype(np.float32)
    q = np.clip(np.rint(w.reshape(16, 2, 128) / scale[:, :, None]), -127, 127).astype(np.int8).reshape(16, 256)
    theirs = pack_to_int32(torch.from_numpy(q), 8).numpy()
    assert packed.dtype == np.int32 and packed.shape == (16, 64)
    assert np.array_equal(packed, theirs)


def test_bf16_rounding_matches_torch():
    values = np.random.default_rng(2).standard_normal(10_000).astype(np.float32) * 3
    ours = f32_to_bf16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)
    assert np.array_equal(bf16_to_f32(ours), torch.from_numpy(values).to(torch.bfloat16).float().numpy())


def test_scales_never_clip_and_error_is_small():
    w = np.random.default_rng(3).standard_normal((64, 512), dtype=np.float32) * 0.02
    packed, stored, err_sq, ref_sq = quantize_block(w, "BF16")
    scale = bf16_to_f32(stored)
    amax = np.abs(w.reshape(64, 4, 128)).max(axis=2)
    assert np.all(amax / scale <= 127.0 + 1e-6)  # rounded up to the next bf16, never clipped
    restored = dequantize(packed, scale, (64, 512))
    assert math.isclose(float(((restored - w) ** 2).sum()), err_sq, rel_tol=1e-4)
    assert math.sqrt(err_sq / ref_sq) < 0.008


def test_all_zero_group_gets_a_nonzero_scale_and_dequantizes_to_zero():
    w = np.zeros((2, 256), np.float32)
    w[1, 128:] = np.linspace(-1, 1, 128)
    packed, stored, err_sq, _ = quantize_block(w, "BF16")
    scale = bf16_to_f32(stored)
    assert np.all(scale > 0)
    assert np.all(dequantize(packed, scale, (2, 256))[0] == 0)
    assert err_sq / float((w**2).sum()) < 1e-4


def test_block_size_does_not_change_a_single_byte(source, models_dir, tmp_path, make_options):
    small = make_options(source, models_dir, block_bytes=1)  # one row per block
    large = make_options(source, tmp_path / "other", output_dir=tmp_path / "other" / "m", block_bytes=1 << 30)
    prepare(small)
    prepare(large)
    for name in ("model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"):
        assert (small.output_dir / name).read_bytes() == (large.output_dir / name).read_bytes()


@pytest.mark.parametrize("path", ["numpy", "fused"])
def test_compressed_tensors_decompresses_what_prepare_wrote(source, models_dir, make_options, monkeypatch, path):
    from hyperqwen.prepare import quantize

    if path == "fused":
        if quantize.kernels() is None:
            pytest.skip("numba is not installed")
        monkeypatch.setattr(quantize, "FUSED_MIN_ELEMENTS", 0)  # every tensor through the fused kernels
    # Small blocks: many blocks per tensor, so block boundaries are exercised too.
    options = make_options(source, models_dir, quantize_embed=True, block_bytes=1 << 20)
    result = prepare(options)
    config = json.loads((options.output_dir / "config.json").read_text())
    qconfig = QuantizationConfig.model_validate(config["quantization_config"])  # the library accepts it
    group = qconfig.config_groups[OUR_GROUP]
    assert group.weights == QuantizationArgs.model_validate(weight_scheme())
    scheme = QuantizationScheme(targets=group.targets, weights=group.weights)
    index = json.loads((options.output_dir / "model.safetensors.index.json").read_text())["weight_map"]
    source_index = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    checked = 0
    for weight_name, err in result.quant_errors.items():
        module = weight_name[: -len(".weight")]
        with safe_open(options.output_dir / index[f"{module}.weight_packed"], framework="pt") as handle:
            state = {k: handle.get_tensor(f"{module}.{k}") for k in ("weight_packed", "weight_scale", "weight_shape")}
        with safe_open(source / source_index[weight_name], framework="pt") as handle:
            original = handle.get_tensor(weight_name).float()
        assert state["weight_scale"].dtype == torch.bfloat16 and state["weight_shape"].tolist() == list(original.shape)
        # As stored (bf16 scales -> the library dequantizes to bf16, as a bf16 kernel would):
        restored = PackedQuantizationCompressor.decompress(state, scheme)["weight"].float()
        assert restored.shape == original.shape
        rel_bf16 = float(torch.linalg.norm(restored - original) / torch.linalg.norm(original))
        assert rel_bf16 < 0.01
        # With the same scales in float32 the library reproduces q * scale exactly: the error prepare reports.
        exact = PackedQuantizationCompressor.decompress(
            state | {"weight_scale": state["weight_scale"].float()}, scheme
        )["weight"]
        rel = float(torch.linalg.norm(exact - original) / torch.linalg.norm(original))
        assert math.isclose(rel, err, rel_tol=1e-4)
        checked += 1
    assert checked == 10  # lm_head, embed_tokens, mtp.fc and 7 MTP layer linears


def test_outliers_fail_the_error_bound_and_leave_nothing_behind(source, models_dir, make_options):
    # One large value per group and a bulk only ~1 int8 step wide: the bulk loses most of its detail.
    from hyperqwen.formats.safetensors import read_header

    shard = source / "model-00002-of-00003.safetensors"
    info = read_header(shard).tensors["lm_head.weight"]
    rows, cols = info.shape
    values = np.random.default_rng(5).standard_normal((rows, cols), dtype=np.float32) / 254
    values[:, ::GROUP_SIZE] = 1.0
    with open(shard, "r+b") as handle:
        handle.seek(info.begin)
        handle.write(f32_to_bf16_bits(values).tobytes())
    options = make_options(source, models_dir)
    with pytest.raises(QuantizationError) as exc:
        prepare(options)
    message = str(exc.value)
    assert "lm_head.weight: row " in message and "per group" in message
    assert not options.output_dir.exists()
    assert not list(models_dir.rglob("*.hyperqwen-tmp"))


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_fused_kernel_and_numpy_write_identical_bytes(dtype):
    """Big tensors use the fused numba kernel (needs numba, which vLLM ships); small ones numpy."""
    from hyperqwen.prepare.quantize import kernels

    if kernels() is None:
        pytest.skip("numba is not installed: only the numpy path exists here")
    from hyperqwen.prepare.safetensors_io import from_float_bits, to_float_bits

    w = np.random.default_rng(7).standard_normal((33, 512), dtype=np.float32) * 0.05
    w[4, :128] = 0.0
    w[5, 3] = 40.0  # an outlier group
    w = from_float_bits(to_float_bits(w, dtype), dtype)  # values representable in the source dtype
    fused = quantize_block(w, dtype, use_fused=True)
    plain = quantize_block(w, dtype, use_fused=False)
    assert np.array_equal(fused[0], plain[0]) and np.array_equal(fused[1], plain[1])
    assert math.isclose(fused[2], plain[2], rel_tol=1e-5) and math.isclose(fused[3], plain[3], rel_tol=1e-5)
