"""Prepare's draft vocabulary (DRAFT_VOCAB), read by the real vLLM 0.32.0 code patch 0007 builds it with.

Patch 0007 builds `ParallelLMHead(mtp_draft_vocab_size, hidden, quant_config=..., prefix="mtp.draft_lm_head")`
in the MTP drafter. Here that exact layer is built from prepare's output: vLLM's CompressedTensorsConfig must
resolve `mtp.draft_lm_head` to int8 group-128 WNA16 (as prepare's config says), the layer's parameters must
have our tensors' dtypes and shapes, and vLLM's own weight loader must take our tensors (including N that is
not a multiple of ParallelLMHead's 64-row padding). The int8 layer cannot run on the CPU build (its WNA16
kernels take 4-bit only, see tests/integration/test_prepare_vllm.py), so the kernel choice is replaced by a
recorder (`fake_kernel`): the only part that needs a GPU. Loading a whole prepared model with MTP into the
patched engine needs that kernel too; the patch's own test (test_patched_qwen3_5_weights.py) serves a bf16
draft head in prepare's format instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hyperqwen.prepare import draft_vocab as dv
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.pipeline import prepare
from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.needs_patch("0007-mtp-draft-vocabulary.patch")]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("draft-vocab-vllm") / "source"
    write_synthetic_checkpoint(directory, SyntheticShape())
    return directory


def _prepared(source: Path, root: Path, n: int) -> Path:
    options = PrepareOptions(output_dir=root / "models" / f"m{n}", models_dir=root / "models", source_dir=source,
                             show_progress=False, draft_vocab=n)
    return prepare(options).output_dir


@pytest.mark.parametrize("n", [100, 128])
def test_vllm_builds_and_loads_the_int8_draft_head_fake_kernel(source, tmp_path, monkeypatch, single_process_group,
                                                               n):
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        compressed_tensors_wNa16 as wna16,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MTP
    from vllm.utils.torch_utils import set_default_torch_dtype

    class RecordingKernel:  # stands in for the GPU kernel (Marlin/Machete); runs nothing
        def __init__(self, config, **names):
            self.config = config

    monkeypatch.setattr(wna16, "choose_mp_linear_kernel", lambda config: RecordingKernel)
    prepared = _prepared(source, tmp_path, n)
    config = json.loads((prepared / "config.json").read_text())
    size = config["text_config"][dv.CONFIG_KEY]
    hidden = config["text_config"]["hidden_size"]
    assert size == n
    quant_config = CompressedTensorsConfig.from_config(config["quantization_config"])
    quant_config.packed_modules_mapping = Qwen3_5MTP.packed_modules_mapping
    # Exactly as patch 0007 builds it (Qwen3_5MultiTokenPredictor's prefix is "mtp"), under the model dtype
    # vLLM's loader makes the default while building the model.
    with set_default_torch_dtype(torch.bfloat16):
        head = ParallelLMHead(size, hidden, quant_config=quant_config, prefix=dv.HEAD_MODULE)
    assert type(head.quant_method).__name__ == "CompressedTensorsLinearMethod"
    assert isinstance(head.scheme, wna16.CompressedTensorsWNA16)
    assert (head.scheme.num_bits, head.scheme.group_size) == (8, 128)

    index = json.loads((prepared / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(prepared / index[dv.D2T], framework="pt") as handle:
        ours = {k: handle.get_tensor(f"{dv.HEAD_MODULE}.{k}") for k in ("weight_packed", "weight_scale")}
        d2t = handle.get_tensor(dv.D2T)
    params = dict(head.named_parameters())
    for name, tensor in ours.items():
        param = params[name]
        assert param.dtype == tensor.dtype and param.shape[1:] == tensor.shape[1:], name
        assert param.shape[0] >= size  # padded to a multiple of 64 rows
        param.weight_loader(param, tensor)
        torch.testing.assert_close(param.data[:size], tensor, rtol=0, atol=0)
    assert d2t.dtype == torch.int64 and d2t.shape == (size,)
    ids = d2t + torch.arange(size)
    assert bool((ids[1:] > ids[:-1]).all()) and int(ids[-1]) < config["text_config"]["vocab_size"]
