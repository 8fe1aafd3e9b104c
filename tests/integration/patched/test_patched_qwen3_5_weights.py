"""Patches 0004-0007 on the real vLLM CPU engine with the tiny Qwen3.5 + MTP test model.

- 0004/0005: a checkpoint whose `model.embed_tokens` is int8 group-128 (compressed-tensors pack-quantized,
  written with prepare's own quantizer) loads into Qwen3_5ForCausalLM and its MTP drafter, and greedy
  output is token-for-token the output of the same model with that embedding dequantized to bf16 in an
  ordinary checkpoint (the quantized lookup is exact), which itself is within int8 rounding of the original.
- 0006: the MTP drafter is built without its own embed_tokens/lm_head: what it allocates while loading is
  exactly the checkpoint's `mtp.*` tensors, and after loading its embed_tokens and lm_head are the target's
  modules (same parameters, same storage).
- 0007: with `mtp_draft_vocab_size` in config.json and `mtp.draft_lm_head` / `mtp.d2t` in the checkpoint
  (ids counted from the model's own outputs), the drafter proposes only those ids and the output stays
  token-for-token the same.

One subprocess loads the engine four times (dequantized reference, int8 embedding, draft vocabulary, the
untouched checkpoint), each with MTP speculation and --enforce-eager: ~2-5 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.server,
    pytest.mark.needs_patch(
        "0004-qwen3_5-quantized-embed-tokens.patch",
        "0005-ct-embedding-cpu-dequant.patch",
        "0006-mtp-drafter-shares-target-embed-lm-head.patch",
    ),
]

EMBED = "model.embed_tokens.weight"

ENGINE_SCRIPT = r"""
import gc, json, os, sys
import torch
from safetensors.torch import load_file, save_file
from vllm import LLM, SamplingParams
from vllm.model_executor.models import qwen3_5_mtp

out_path, source_dir, ref_dir, quant_dir, draft_dir = sys.argv[1:]
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4,",
           "The quick brown fox", "Q: What is 2+2?\nA:"]
params = SamplingParams(temperature=0.0, max_tokens=24, seed=0)

fresh_drafters = []
original_load_weights = qwen3_5_mtp.Qwen3_5MTP.load_weights

def recording_load_weights(self, weights):
    # What the drafter allocated when it was built (its parameters as load_weights starts; the CPU build
    # repacks linear weights after loading, so later counts would miss them), and what it then loaded.
    allocated = {name: [list(p.shape), p.numel() * p.element_size()] for name, p in self.named_parameters()}
    loaded = original_load_weights(self, weights)
    fresh_drafters.append({"allocated": allocated, "loaded": sorted(loaded)})
    return loaded

qwen3_5_mtp.Qwen3_5MTP.load_weights = recording_load_weights

def inspect(worker):
    runner = worker.model_runner
    target, drafter = runner.get_model(), runner.drafter.model
    t_embed, d_embed = target.model.embed_tokens, drafter.model.embed_tokens
    info = {
        "embed_is_target": d_embed is t_embed,
        "lm_head_is_target": drafter.lm_head is target.lm_head,
        "embed_params": {n: p.data_ptr() for n, p in t_embed.named_parameters()},
        "drafter_embed_params": {n: p.data_ptr() for n, p in d_embed.named_parameters()},
        "lm_head_ptr": target.lm_head.weight.data_ptr(),
        "drafter_lm_head_ptr": drafter.lm_head.weight.data_ptr(),
        "embed_quant_method": type(t_embed.quant_method).__name__,
        "draft_head_shape": None,
    }
    head = getattr(drafter.model, "draft_lm_head", None)
    if head is not None:
        # The drafter's two scoring paths on arbitrary hidden states: both stay inside the draft vocabulary.
        torch.manual_seed(0)
        hidden = torch.randn(16, drafter.config.hidden_size, dtype=head.weight.dtype)
        logits = drafter.compute_logits(hidden)
        d2t = drafter.model.draft_id_to_target_id
        # ParallelLMHead pads its rows to a multiple of 64; the draft vocabulary is d2t's length.
        info["draft_head_shape"] = [d2t.shape[0], head.weight.shape[1]]
        info["d2t_targets"] = (torch.arange(d2t.shape[0]) + d2t).tolist()
        info["top_tokens"] = drafter.get_top_tokens(hidden).tolist()
        info["logits_argmax"] = logits.argmax(dim=-1).tolist()
        info["finite_logit_ids"] = sorted(set(torch.isfinite(logits).nonzero()[:, 1].tolist()))
        info["logits_width"] = logits.shape[-1]
    return info

def spec_counters(llm):
    return {m.name: m.value for m in llm.get_metrics()
            if "spec_decode" in m.name and isinstance(getattr(m, "value", None), (int, float))}

def run(model_dir):
    llm = LLM(model=model_dir, dtype="bfloat16", max_model_len=512, max_num_seqs=4, seed=0,
              enforce_eager=True, enable_prefix_caching=False, mamba_ssm_cache_dtype="float16",
              disable_log_stats=False, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    before = spec_counters(llm)
    outs = llm.generate(prompts, params, use_tqdm=False)
    after = spec_counters(llm)
    result = {
        "model_dir": model_dir,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "prompt_tokens": [list(o.prompt_token_ids) for o in outs],
        "spec": {k: after[k] - before.get(k, 0) for k in after},
        "inspect": llm.collective_rpc(inspect)[0],
        "fresh_drafter": fresh_drafters[-1],
    }
    del llm
    gc.collect()
    return result

def write_draft_vocab_checkpoint(reference):
    # The draft vocabulary counted from the model's own outputs (plus the prompts), as prepare's recount
    # does: rows of lm_head for those ids, and EAGLE-3 style offsets d2t[k] = id_k - k.
    ids = sorted({t for r in reference["tokens"] + reference["prompt_tokens"] for t in r} | set(range(32)))
    os.makedirs(draft_dir)
    for name in os.listdir(ref_dir):
        if name not in ("model.safetensors", "config.json"):
            os.symlink(os.path.join(ref_dir, name), os.path.join(draft_dir, name))
    state = load_file(os.path.join(ref_dir, "model.safetensors"))
    index = torch.tensor(ids, dtype=torch.long)
    state["mtp.draft_lm_head.weight"] = state["lm_head.weight"][index].contiguous()
    state["mtp.d2t"] = index - torch.arange(len(ids))
    save_file(state, os.path.join(draft_dir, "model.safetensors"), metadata={"format": "pt"})
    config = json.load(open(os.path.join(ref_dir, "config.json")))
    config["mtp_draft_vocab_size"] = len(ids)
    json.dump(config, open(os.path.join(draft_dir, "config.json"), "w"), indent=2)
    return ids

reference = run(ref_dir)
draft_ids = write_draft_vocab_checkpoint(reference)
results = {"reference": reference, "quantized": run(quant_dir), "draft_vocab": run(draft_dir),
           "original": run(source_dir), "draft_ids": draft_ids}
json.dump(results, open(out_path, "w"))
"""


def write_checkpoints(source: Path, root: Path) -> tuple[Path, Path, float]:
    """(int8-embedding checkpoint, dequantized-bf16 reference checkpoint, relative error of the embedding).

    Quantized with prepare's quantizer (hyperqwen.prepare.quantize) and config writer
    (hyperqwen.prepare.checkpoint.updated_quantization_config), limited to the embedding: the CPU build has
    no int8 linear kernel for lm_head/MTP (see tests/integration/test_prepare_vllm.py)."""
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    from hyperqwen.prepare.checkpoint import Targets, updated_quantization_config
    from hyperqwen.prepare.quantize import dequantize, quantize_block

    state = load_file(str(source / "model.safetensors"))
    weight = state[EMBED]
    assert weight.dtype == torch.bfloat16
    rows, cols = weight.shape
    packed, stored, err_sq, ref_sq = quantize_block(weight.float().numpy(), "BF16")
    scale = torch.from_numpy(np.ascontiguousarray(stored).view(np.int16)).view(torch.bfloat16)
    config = json.loads((source / "config.json").read_text())

    quant_dir, ref_dir = root / "int8-embed", root / "dequantized-embed"
    for directory in (quant_dir, ref_dir):
        directory.mkdir(parents=True)
        for item in source.iterdir():
            if item.name not in ("model.safetensors", "config.json"):
                (directory / item.name).symlink_to(item)

    quantized = {k: v for k, v in state.items() if k != EMBED}
    module = EMBED[: -len(".weight")]
    quantized[f"{module}.weight_packed"] = torch.from_numpy(np.ascontiguousarray(packed)).view(torch.int32)
    quantized[f"{module}.weight_scale"] = scale
    quantized[f"{module}.weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
    save_file(quantized, str(quant_dir / "model.safetensors"), metadata={"format": "pt"})
    targets = Targets(lm_head=(), mtp=(), embed=(EMBED,), already_quantized=())
    quant_config = {**config, "quantization_config": updated_quantization_config(config, targets)}
    (quant_dir / "config.json").write_text(json.dumps(quant_config, indent=2))

    reference = dict(state)
    reference[EMBED] = torch.from_numpy(dequantize(packed, scale.float().numpy(), (rows, cols))).to(torch.bfloat16)
    save_file(reference, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    (ref_dir / "config.json").write_text(json.dumps(config, indent=2))
    return quant_dir, ref_dir, (err_sq / ref_sq) ** 0.5


@pytest.fixture(scope="module")
def engine_runs(test_models, tmp_path_factory):
    source = test_models["tiny-qwen"]
    root = tmp_path_factory.mktemp("patched-qwen3_5")
    quant_dir, ref_dir, rel_error = write_checkpoints(source, root)
    out = root / "runs.json"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    draft_dir = root / "draft-vocab"
    done = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT, str(out), str(source), str(ref_dir),
                           str(quant_dir), str(draft_dir)],
                          env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-6000:]
    runs = json.loads(out.read_text())
    runs.update(rel_error=rel_error, mtp_bytes=checkpoint_bytes(source, prefix="mtp."),
                draft_mtp_bytes=checkpoint_bytes(draft_dir, prefix="mtp."))
    return runs


def checkpoint_bytes(model_dir: Path, prefix: str) -> int:
    from safetensors import safe_open

    total = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as handle:
        for name in handle.keys():
            if name.startswith(prefix):
                t = handle.get_slice(name)
                numel = 1
                for d in t.get_shape():
                    numel *= d
                total += numel * {"BF16": 2, "F16": 2, "F32": 4, "I64": 8}[t.get_dtype()]
    return total


def test_int8_embedding_is_quantized_and_close(engine_runs):
    info = engine_runs["quantized"]["inspect"]
    assert info["embed_quant_method"] == "CompressedTensorsEmbeddingWNA16Int"
    assert set(info["embed_params"]) == {"weight_packed", "weight_scale", "weight_shape"}
    assert engine_runs["reference"]["inspect"]["embed_quant_method"] == "UnquantizedEmbeddingMethod"
    assert 0 < engine_runs["rel_error"] < 0.01  # int8 group-128 of a bf16 matrix


def test_int8_embedding_answers_like_the_dequantized_model(engine_runs):
    """Same greedy tokens as the model whose embedding is the dequantized int8 weight in bf16: the
    quantized lookup (vLLM's method with the CPU dequant of patch 0005) reproduces those rows exactly."""
    reference, quantized = engine_runs["reference"]["tokens"], engine_runs["quantized"]["tokens"]
    assert all(len(t) == 24 for t in quantized)
    assert quantized == reference


RUNS = ["original", "reference", "quantized", "draft_vocab"]


def test_int8_embedding_answers_like_the_original_model(engine_runs):
    """And like the untouched bf16 checkpoint: int8 group-128 rounding of the embedding (under 1% relative
    error) changes no greedy token of the tiny model."""
    assert engine_runs["quantized"]["tokens"] == engine_runs["original"]["tokens"]


@pytest.mark.parametrize("run", RUNS)
def test_mtp_drafter_allocates_only_its_own_layers(engine_runs, run):
    """Right after loading, the drafter holds exactly the checkpoint's mtp.* tensors; no vocab x hidden
    matrix (a copy of embed_tokens or lm_head) is allocated or loaded for it. Unpatched 0.32.0 allocates
    both here: 2 x vocab x hidden x 2 bytes more (2 x 2.54 GB for the real model)."""
    fresh = engine_runs[run]["fresh_drafter"]
    allocated, loaded = fresh["allocated"], fresh["loaded"]
    assert allocated, "the drafter was not built (is MTP speculation on?)"
    vocab_sized = [n for n in [*allocated, *loaded] if "embed_tokens" in n or n.startswith("lm_head")]
    assert not vocab_sized, vocab_sized
    expected = engine_runs["draft_mtp_bytes" if run == "draft_vocab" else "mtp_bytes"]
    if run == "draft_vocab":
        # ParallelLMHead pads its rows to a multiple of 64 (vocab_parallel_embedding.py): the padding rows
        # are allocated but not in the checkpoint.
        (rows, hidden), _ = allocated["model.draft_lm_head.weight"]
        ids = len(engine_runs["draft_ids"])
        assert rows == -(-ids // 64) * 64
        expected += (rows - ids) * hidden * 2  # bf16
    # With a quantization config, attention layers also get scalar k/v/q scale parameters (not checkpoint
    # tensors); everything else is exactly the mtp.* tensors.
    scalars = {n: b for n, (shape, b) in allocated.items() if shape in ([], [1])}
    assert sum(b for n, (_, b) in allocated.items() if n not in scalars) == expected
    assert sum(scalars.values()) < 1024, scalars
    assert set(allocated) - set(scalars) <= set(loaded) <= set(allocated)


@pytest.mark.parametrize("run", RUNS)
def test_mtp_drafter_uses_the_target_modules(engine_runs, run):
    info = engine_runs[run]["inspect"]
    assert info["embed_is_target"] and info["lm_head_is_target"]
    assert info["drafter_embed_params"] == info["embed_params"]  # same parameters, same storage
    assert info["drafter_lm_head_ptr"] == info["lm_head_ptr"]


# --- patch 0007: draft vocabulary -------------------------------------------------------------------------

DRAFT_VOCAB = pytest.mark.needs_patch("0007-mtp-draft-vocabulary.patch")


@DRAFT_VOCAB
def test_draft_vocabulary_keeps_greedy_output_exact(engine_runs):
    """Drafting over a subset changes only what is proposed; verification is against the full vocabulary,
    so the output is token-for-token the full-vocabulary drafter's."""
    assert engine_runs["draft_vocab"]["tokens"] == engine_runs["reference"]["tokens"]


@DRAFT_VOCAB
def test_draft_vocabulary_drafts_only_its_ids(engine_runs):
    info, ids = engine_runs["draft_vocab"]["inspect"], engine_runs["draft_ids"]
    reference_info = engine_runs["reference"]["inspect"]
    assert reference_info["draft_head_shape"] is None  # no mtp_draft_vocab_size: full vocabulary, as before
    assert info["draft_head_shape"][0] == len(ids) < info["logits_width"]
    assert info["d2t_targets"] == ids  # d2t loaded: draft id k -> target id k + d2t[k]
    assert set(info["top_tokens"]) <= set(ids)
    assert info["finite_logit_ids"] == ids  # scattered into the full vocabulary, -inf elsewhere
    assert info["logits_argmax"] == info["top_tokens"]  # both scoring paths agree


@DRAFT_VOCAB
def test_draft_vocabulary_drafts_are_accepted(engine_runs):
    """The ids cover what the model generates, so restricting the drafter loses no accepted draft: a
    full-vocabulary draft that the target accepts is a generated token, hence in the subset and still its
    argmax."""
    def counter(run, part):
        spec = engine_runs[run]["spec"]
        names = [n for n in spec if n.split(":")[-1] in (f"spec_decode_{part}", f"spec_decode_{part}_total")]
        assert names, f"no spec_decode counter with {part!r} in {sorted(spec)}"
        return spec[names[0]]

    assert counter("draft_vocab", "num_drafts") > 0
    assert counter("draft_vocab", "num_accepted_tokens") >= counter("reference", "num_accepted_tokens") > 0
