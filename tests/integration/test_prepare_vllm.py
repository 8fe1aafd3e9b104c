"""What prepare writes, read by the real vLLM 0.32.0 code that will load it.

- vLLM's CompressedTensorsConfig parses the rewritten quantization_config and resolves every layer, under
  vLLM's own names (main model via Qwen3_5ForConditionalGeneration's name mapper, the MTP drafter
  Qwen3_5MTP unmapped, fused q/k/v and gate/up layers), to int8 group-128 WNA16 for lm_head and the MTP
  linears, 4-bit for the body, and nothing for ignored vision layers.
- vLLM's CompressedTensorsWNA16.create_weights builds exactly the parameters (names, dtypes, shapes) our
  tensors fill; vLLM's own unpacking helper decodes our packing back to the weights.

The CPU build has no int8 WNA16 kernel (vllm/model_executor/kernels/linear/mixed_precision/cpu.py accepts
uint4/uint4b8 only), so a requantized model cannot be *served* here; create_weights therefore runs with the
kernel choice replaced by a recorder (`fake_kernel`), the only thing that needs a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.pipeline import prepare
from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prepare-vllm")
    write_synthetic_checkpoint(root / "source", SyntheticShape())
    options = PrepareOptions(output_dir=root / "models" / "m", models_dir=root / "models",
                             source_dir=root / "source", show_progress=False)
    prepare(options)
    return options.output_dir


def _vllm_config(directory: Path, mapper=None, packed=None):
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    qc = json.loads((directory / "config.json").read_text())["quantization_config"]
    config = CompressedTensorsConfig.from_config(qc)
    config.packed_modules_mapping = packed or {}
    if mapper is not None:
        config.apply_vllm_mapper(mapper)
    return config


class _Named(torch.nn.Module):
    """A module whose class name is what vLLM's matcher compares against 'Linear'."""


def _module(class_name: str) -> torch.nn.Module:
    return type(class_name, (_Named,), {})()


def _bits(config, layer_name: str, class_name: str) -> int | None:
    scheme = config.get_scheme_dict(_module(class_name), layer_name)
    return None if scheme is None else scheme["weights"].num_bits


def test_vllm_resolves_every_layer_to_the_intended_scheme(prepared):
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration
    from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MTP

    main = _vllm_config(prepared, Qwen3_5ForConditionalGeneration.hf_to_vllm_mapper,
                        Qwen3_5ForConditionalGeneration.packed_modules_mapping)
    assert _bits(main, "language_model.lm_head", "ParallelLMHead") == 8
    assert _bits(main, "language_model.model.layers.0.mlp.gate_up_proj", "MergedColumnParallelLinear") == 4
    assert _bits(main, "language_model.model.layers.3.self_attn.qkv_proj", "QKVParallelLinear") == 4
    assert _bits(main, "language_model.model.layers.0.linear_attn.in_proj_qkvz", "MergedColumnParallelLinear") == 4
    assert _bits(main, "language_model.model.layers.0.linear_attn.in_proj_ba", "MergedColumnParallelLinear") is None
    assert _bits(main, "visual.blocks.0.attn.qkv", "QKVParallelLinear") is None
    assert _bits(main, "visual.merger.linear_fc1", "ColumnParallelLinear") is None

    drafter = _vllm_config(prepared, None, Qwen3_5MTP.packed_modules_mapping)
    assert _bits(drafter, "lm_head", "ParallelLMHead") == 8
    assert _bits(drafter, "mtp.fc", "ColumnParallelLinear") == 8
    assert _bits(drafter, "mtp.layers.0.self_attn.qkv_proj", "QKVParallelLinear") == 8
    assert _bits(drafter, "mtp.layers.0.self_attn.o_proj", "RowParallelLinear") == 8
    assert _bits(drafter, "mtp.layers.0.mlp.gate_up_proj", "MergedColumnParallelLinear") == 8
    assert _bits(drafter, "mtp.layers.0.mlp.down_proj", "RowParallelLinear") == 8

    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsWNA16

    scheme = main._get_scheme_from_parts(weight_quant=main.get_scheme_dict(_module("X"), "language_model.lm_head")
                                         ["weights"], input_quant=None, format="pack-quantized",
                                         layer_name="language_model.lm_head")
    assert isinstance(scheme, CompressedTensorsWNA16) and scheme.num_bits == 8 and scheme.group_size == 128
    assert str(scheme.quant_type) == "uint8b128"


def test_vllm_parameters_match_the_written_tensors_fake_kernel(prepared, monkeypatch, single_process_group):
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import compressed_tensors_wNa16 as wna16
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    class RecordingKernel:  # stands in for the GPU kernel (Marlin/Machete); records nothing, runs nothing
        def __init__(self, config, **names):
            self.config = config

    monkeypatch.setattr(wna16, "choose_mp_linear_kernel", lambda config: RecordingKernel)
    index = json.loads((prepared / "model.safetensors.index.json").read_text())["weight_map"]
    source = prepared.parent.parent / "source"
    source_index = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    for module in ("lm_head", "mtp.fc", "mtp.layers.0.mlp.down_proj"):
        with safe_open(prepared / index[f"{module}.weight_packed"], framework="pt") as handle:
            ours = {k: handle.get_tensor(f"{module}.{k}") for k in ("weight_packed", "weight_scale", "weight_shape")}
        rows, cols = ours["weight_shape"].tolist()
        layer = torch.nn.Module()
        wna16.CompressedTensorsWNA16(strategy="group", num_bits=8, group_size=128, symmetric=True,
                                     layer_name=module).create_weights(
            layer, output_size=rows, input_size=cols, output_partition_sizes=[rows],
            input_size_per_partition=cols, params_dtype=torch.bfloat16, weight_loader=lambda *a: None)
        for name, tensor in ours.items():
            param = getattr(layer, name)
            assert (param.dtype, tuple(param.shape)) == (tensor.dtype, tuple(tensor.shape)), (module, name)
        # vLLM's own unpacking (what its kernels' repacking starts from) decodes our layout.
        q = unpack_quantized_values_into_int32(ours["weight_packed"], scalar_types.uint8b128, packed_dim=1)
        q = q.to(torch.float32) - scalar_types.uint8b128.bias
        restored = (q.view(rows, cols // 128, 128) * ours["weight_scale"].float()[:, :, None]).view(rows, cols)
        with safe_open(source / source_index[f"{module}.weight"], framework="pt") as handle:
            original = handle.get_tensor(f"{module}.weight").float()
        rel = float(torch.linalg.norm(restored - original) / torch.linalg.norm(original))
        assert rel < 0.01, (module, rel)


GREEDY_SCRIPT = r"""
import json, sys, os
import torch
from safetensors import safe_open
from vllm import LLM, SamplingParams

model_dir, prepared_dir, out_path = sys.argv[1:4]
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4,",
           "The quick brown fox", "In a hole in the ground there lived", "import numpy as np\n", "Q: What is 2+2?\nA:"]
params = SamplingParams(temperature=0.0, max_tokens=32, logprobs=5, seed=0)
llm = LLM(model=model_dir, dtype="bfloat16", max_model_len=512, enforce_eager=True, max_num_seqs=8,
          enable_prefix_caching=False, mamba_ssm_cache_dtype="float16", seed=0)

def run():
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [{"tokens": list(o.outputs[0].token_ids),
             "top": [{str(t): float(v.logprob) for t, v in lp.items()} for lp in o.outputs[0].logprobs]}
            for o in outs]

before = run()
# The int8 lm_head exactly as prepare wrote it, decoded by the compressed-tensors library.
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
config = json.load(open(os.path.join(prepared_dir, "config.json")))["quantization_config"]
group = config["config_groups"]["hyperqwen_int8_g128"]
scheme = QuantizationScheme(targets=group["targets"], weights=QuantizationArgs.model_validate(group["weights"]))
with safe_open(os.path.join(prepared_dir, "model.safetensors"), framework="pt") as handle:
    state = {k: handle.get_tensor(f"lm_head.{k}") for k in ("weight_packed", "weight_scale", "weight_shape")}
weight = PackedQuantizationCompressor.decompress(state, scheme)["weight"].to(torch.bfloat16)

def swap(model):
    old = model.lm_head.weight.detach().clone()
    loaded = sorted(model.load_weights([("lm_head.weight", weight)]))
    # The CPU build prepacks the head's weight when loading; redo that step so the new weight is used.
    model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
    new = model.lm_head.weight.detach()
    return {"loaded": loaded, "changed": float((new.float() - old.float()).abs().max()),
            "equals_int8": float((new.float() - weight.float()).abs().max())}

loaded = llm.apply_model(swap)
after = run()
json.dump({"before": before, "after": after, "swap": loaded[0]}, open(out_path, "w"))
"""


@pytest.mark.server
def test_int8_lm_head_keeps_tiny_qwen_greedy_output(test_models, tmp_path):
    """The CPU build cannot run the int8 kernel, so this measures the next best thing in the real engine:
    the tiny Qwen3.5 model's greedy output with its lm_head replaced by prepare's int8 lm_head (decoded to
    bf16 by compressed-tensors) against the original. One engine start (~1-2 min on 2 cores)."""
    import subprocess
    import sys

    source = test_models["tiny-qwen"]
    options = PrepareOptions(output_dir=tmp_path / "models" / "m", models_dir=tmp_path / "models",
                             source_dir=source, show_progress=False)
    result = prepare(options)
    assert result.quant_errors["lm_head.weight"] < 0.01
    out = tmp_path / "greedy.json"
    env = {**__import__("os").environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, "-c", GREEDY_SCRIPT, str(source), str(options.output_dir), str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    data = json.loads(out.read_text())
    swap = data["swap"]
    assert swap["loaded"] == ["lm_head.weight"] and swap["changed"] > 0 and swap["equals_int8"] == 0
    total = same = identical_prompts = 0
    diffs: list[float] = []
    for before, after in zip(data["before"], data["after"]):
        n = len(before["tokens"])
        prefix = next((i for i in range(n) if before["tokens"][i] != after["tokens"][i]), n)
        same += prefix
        total += n
        identical_prompts += prefix == n
        for top_b, top_a in zip(before["top"][:prefix], after["top"][:prefix]):
            diffs += [abs(top_b[t] - top_a[t]) for t in top_b.keys() & top_a.keys()]
    agreement = same / total
    print(f"greedy agreement (identical prefix tokens / all): {agreement:.3f}; identical prompts "
          f"{identical_prompts}/{len(data['before'])}; |logprob change| of top-5 tokens on the shared prefix: "
          f"mean {sum(diffs) / len(diffs):.4f}, max {max(diffs):.4f}")
    assert max(diffs) > 0  # the engine really computed with the int8 head (the swap took effect)
    assert identical_prompts >= len(data["before"]) // 2
    assert agreement >= 0.75
