"""SPEC=dflash2 on the vLLM CPU build: what runs here, and the exact line where the CPU build stops.

vLLM 0.32.0 serves a DFlash2 drafter (speculators `dflash2` config -> architecture `DFlash2DraftModel` ->
`DFlash2Qwen3ForCausalLM`, method "dflash") only through Model Runner V2: `VllmConfig._get_v1_model_runner_
unsupported_features` lists "DFlash candidate-head drafts" (vllm/config/vllm.py:2990, because the V1
`DFlashProposer` never calls the candidate selector and the draft would silently degrade to DFlash1), and
Model Runner V2 needs Triton (vllm/config/vllm.py:3213 "Model Runner V2 requires Triton."), which the CPU build
lacks ("Triton is installed, but doesn't include CPU backend"); V2's DFlash2 speculator is Triton kernels too
(vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py: `_selector_walk_kernel`, `_cache_draft_logits_kernel`).
That is a whole model runner, not one kernel, so there is no CPU-path patch for it. What the CPU build does run:

- vLLM's config detection of a speculators-format DFlash2 drafter, compared with `check_drafter` (the
  drafter `hyperqwen serve` checks before it starts vLLM) on the same folder;
- `DFlash2Qwen3ForCausalLM` built on CPU and loading every tensor of the drafter checkpoint (the grouped
  convolutions and the candidate selector included);
- the whole serving path of SPEC=dflash2 through `hyperqwen serve` (drafter check, --speculative-config with
  method "dflash", the target's auxiliary hidden states, the drafter's context K/V, non-causal attention over
  the block, verification), with the DFlash layout of the same drafter (`tiny-dflash`: the same decoder
  without the convolutions and the selector), which the V1 runner serves; with prefix caching on (single
  mode's default; the hybrid model's align-mode state copy runs on CPU with patch 0030), over single prompts,
  concurrent requests and a multi-turn conversation whose second turn hits the prefix cache.

What only a GPU shows: the DFlash2 candidate-head drafting itself (V2 runner, selector walk), its
acceptance with the real W4A16 drafter, and its speed (docs/benchmarks.md, field report).

The drafters are `tiny-dflash2` / `tiny-dflash` from support.testmodels, planted so that the first draft of
each block is tiny-qwen's own next token: the tests see accepted drafts, not only rejected ones. tiny-qwen's
greedy output without speculation is its planted successor chain (asserted against a SPEC=none server in
test_server_tiny_qwen.py::test_no_speculation_output_is_the_successor_chain), so the chain is the
no-speculation reference here without starting another server.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration]


def chain(succ: list[int], start: int, length: int) -> list[int]:
    out = [start]
    while len(out) < length:
        out.append(succ[out[-1]])
    return out

DFLASH_TOKENS = 4
# Prefix caching on, as single mode defaults: on the hybrid model it puts the GDN state in align mode (patch 0030
# gives its pre-copy a CPU path) and the drafter's context K/V must survive cache hits.
needs_0030 = pytest.mark.needs_patch("0030-mamba-align-precopy-cpu.patch")
DFLASH_KNOBS = {"DTYPE": "bfloat16", "SPEC": "dflash2", "DFLASH_TOKENS": str(DFLASH_TOKENS), "PREFIX_CACHE": "1"}
PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
]


@pytest.fixture(scope="module")
def succ(test_models) -> list[int]:
    from support.testmodels import tiny_qwen_successor

    return tiny_qwen_successor(test_models["tiny-qwen"])


# --- what the CPU build runs of DFlash2 itself (no server) ------------------------------------------------


def _engine_args(test_models, drafter: str):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(test_models["tiny-qwen"]), dtype="bfloat16", max_model_len=2048, enforce_eager=True,
        speculative_config={"method": "dflash", "model": str(test_models[drafter]),
                            "num_speculative_tokens": DFLASH_TOKENS},
    )


def test_cpu_build_refuses_dflash2_with_the_runner_reason(test_models):
    """The refusal this module works around. If a vLLM upgrade serves DFlash2 on CPU, this fails: then serve
    `tiny-dflash2` itself in the server tests below instead of the DFlash layout."""
    with pytest.raises(ValueError, match="Model Runner V1 does not support: DFlash candidate-head drafts"):
        _engine_args(test_models, "tiny-dflash2").create_engine_config()


@pytest.fixture(scope="module")
def dflash2_vllm_config(test_models):
    """vLLM's config for target + tiny DFlash2 drafter, past the V1-runner gate (config and model only)."""
    from vllm.config import VllmConfig

    mp = pytest.MonkeyPatch()
    # Only the runner gate is skipped: everything the config reads from the drafter still runs.
    mp.setattr(VllmConfig, "_validate_v1_model_runner", lambda self: None)
    try:
        yield _engine_args(test_models, "tiny-dflash2").create_engine_config()
    finally:
        mp.undo()


def test_vllm_reads_the_dflash2_drafter_as_check_drafter_does(test_models, dflash2_vllm_config):
    from hyperqwen.spec.drafter import check_drafter

    info = check_drafter(test_models["tiny-dflash2"], test_models["tiny-qwen"])
    spec = dflash2_vllm_config.speculative_config
    hf = spec.draft_model_config.hf_config
    assert spec.method == info.vllm_method == "dflash"
    assert spec.draft_model_config.architectures == ["DFlash2DraftModel"]
    assert info.vllm_architecture == "DFlash2Qwen3ForCausalLM"
    assert tuple(hf.dflash_config["target_layer_ids"]) == info.target_layer_ids == (0, 1, 3)
    assert (hf.hidden_size, hf.vocab_size, hf.target_hidden_size) == (
        info.hidden_size, info.vocab_size, info.target_hidden_size
    )
    # The DFlash2 parts vLLM builds from the speculators config (update_dflash2).
    assert {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"} <= set(hf.dflash_config)
    assert spec.num_speculative_tokens == DFLASH_TOKENS and spec.parallel_drafting


def test_dflash2_model_builds_and_loads_every_tensor_on_cpu(test_models, dflash2_vllm_config, single_process_group):
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm.model_executor.models.qwen3_dflash2 import DFlash2Qwen3ForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    checkpoint = test_models["tiny-dflash2"] / "model.safetensors"
    with set_current_vllm_config(dflash2_vllm_config), set_default_torch_dtype(torch.bfloat16):
        model = DFlash2Qwen3ForCausalLM(vllm_config=dflash2_vllm_config, prefix="")
        model.load_weights(safetensors_weights_iterator([str(checkpoint)], False))
    params = dict(model.named_parameters())
    layer = model.model.layers[0]
    stored = load_file(str(checkpoint))
    # Unstacked names land where vLLM's DFlash loader puts them ("model." prefix; q/k/v and gate/up stacked).
    direct = {name: params[f"model.{name}"] for name in stored if f"model.{name}" in params}
    assert set(stored) - set(direct) == {
        "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
        "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
    }
    for name, param in direct.items():
        assert torch.equal(param.data, stored[name]), name
    assert torch.equal(layer.self_attn.qkv_proj.weight.data, torch.cat(
        [stored[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]))
    assert torch.equal(layer.mlp.gate_up_proj.weight.data, torch.cat(
        [stored["layers.0.mlp.gate_proj.weight"], stored["layers.0.mlp.up_proj.weight"]]))
    # The DFlash2-only modules exist with the checkpoint's shapes (the candidate head the GPU path drafts with).
    assert {"layers.0.attention_conv.base_kernel", "layers.0.mlp_conv.kernel_projection.weight",
            "candidate_selector.predecessor_codebook", "candidate_selector.hidden_projection.weight"} <= set(direct)
    # The grouped convolution's CPU path (qwen3_dflash2.py `_grouped_conv`, not the Triton kernel) runs and,
    # with the tiny drafter's identity kernels, passes hidden states through. (CPU linear layers are packed by
    # the loader's post-processing step first, as vLLM's model loader does.)
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    with set_current_vllm_config(dflash2_vllm_config):
        process_weights_after_loading(
            model, dflash2_vllm_config.speculative_config.draft_model_config, torch.device("cpu"))
    x = torch.randn(2 * (1 + DFLASH_TOKENS), 256, dtype=torch.bfloat16)
    with torch.inference_mode():
        out, coefficients = layer.attention_conv.prepare(x)
        assert torch.equal(out, x) and torch.equal(layer.attention_conv.finish(out, coefficients), x)


# --- SPEC=dflash2 through `hyperqwen serve` (the DFlash layout of the drafter) ----------------------------


@pytest.fixture(scope="module")
def dflash_server(server_factory, test_models):
    with server_factory("tiny-qwen-dflash", "tiny-qwen", {**DFLASH_KNOBS, "DRAFT": str(test_models["tiny-dflash"])}) \
            as server:
        yield server


def _spec_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in (
        "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total")}


@pytest.mark.server
@needs_0030
def test_serve_passes_the_checked_drafter_to_vllm(dflash_server, test_models):
    import json

    from hyperqwen.launch.command import argv_value

    args = dflash_server.planned_vllm_args()
    spec = json.loads(argv_value(args, "--speculative-config"))
    assert spec == {"method": "dflash", "model": str(test_models["tiny-dflash"]), "num_speculative_tokens": 4}
    assert "Resolved architecture: DFlashDraftModel" in dflash_server.log_text()


@pytest.mark.server
@needs_0030
def test_dflash_greedy_output_equals_no_speculation(dflash_server, succ):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dflash_server.model_dir)
    before = dflash_server.metrics()
    for prompt in PROMPTS:
        last = tokenizer(prompt)["input_ids"][-1]
        expected = [succ[last]]
        while len(expected) < 24:
            expected.append(succ[expected[-1]])
        assert dflash_server.greedy_token_ids(prompt, 24, timeout=300) == expected, prompt
    deltas = _spec_deltas(before, dflash_server.metrics())
    drafts = deltas["vllm:spec_decode_num_drafts_total"]
    assert drafts > 0, deltas
    assert deltas["vllm:spec_decode_num_draft_tokens_total"] == drafts * DFLASH_TOKENS, deltas
    # The planted drafter's first draft is the target's next token: accepted drafts took part in the output.
    assert deltas["vllm:spec_decode_num_accepted_tokens_total"] > 0, deltas


@pytest.mark.server
@needs_0030
def test_dflash_concurrent_requests_equal_no_speculation(dflash_server, succ):
    """Several requests in one verify batch: each one's drafts are checked against its own context."""
    from concurrent.futures import ThreadPoolExecutor

    starts = [1000 + 997 * i for i in range(6)]
    prompts = [[s, succ[s], succ[succ[s]]] for s in starts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        outputs = list(pool.map(lambda p: dflash_server.greedy_token_ids(p, 30, timeout=300), prompts))
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = [succ[prompt[-1]]]
        while len(expected) < 30:
            expected.append(succ[expected[-1]])
        assert output == expected, prompt


@pytest.mark.server
@needs_0030
def test_dflash_multi_turn_with_prefix_cache_hits_equals_no_speculation(dflash_server, succ):
    """Turn 2 extends turn 1 (sent twice, so its blocks are cached): cache hits, and still the exact answer."""
    first = chain(succ, 4242, 600)
    answer_1 = dflash_server.greedy_token_ids(first, 24, timeout=300)
    assert answer_1 == chain(succ, succ[first[-1]], 24)
    assert dflash_server.greedy_token_ids(first, 24, timeout=300) == answer_1
    second = first + answer_1 + chain(succ, 777, 40)
    before = dflash_server.metrics()
    answer_2 = dflash_server.greedy_token_ids(second, 40, timeout=300)
    after = dflash_server.metrics()
    assert answer_2 == chain(succ, succ[second[-1]], 40)
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert hits >= 256, hits  # at least one 256-token block of turn 1 reused
    deltas = _spec_deltas(before, after)
    assert deltas["vllm:spec_decode_num_accepted_tokens_total"] > 0, deltas
