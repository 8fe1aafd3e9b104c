"""`hyperqwen serve --explain` says what the SPEC choice implies (draft tokens, seats, context, GDN state, the
drafter and its memory, the reference's numbers labelled as theirs), run as a user runs it (a subprocess).

The target is the header-only Qwen3.8-27B fixture of the memory tests (real shapes, no weights); the DFlash2
drafter is a header-only speculators-format checkpoint shaped like the published one (5 layers, hidden 5,120).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hyperqwen.config.knobs import SPEC_METHODS

TARGET = Path(__file__).resolve().parents[1] / "memory" / "data" / "qwen3.8-27b-w4a16"
KEY = "sk-never-print-me-0123456789"


def explain(*sets: str, gpu: str | None = None) -> subprocess.CompletedProcess:
    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "VLLM_API_KEY": KEY}
    args = [sys.executable, "-m", "hyperqwen", "serve", "--mode", "single", "--explain", "--set", f"MODEL={TARGET}"]
    for item in sets:
        args += ["--set", item]
    if gpu:
        args += ["--gpu", gpu]
    return subprocess.run(args, capture_output=True, text=True, env=environ, timeout=120)


def spec_section(stdout: str) -> str:
    return stdout[stdout.index("Speculative decoding:"):]


def header_only_safetensors(path: Path, tensors: dict[str, list[int]]) -> int:
    """A bf16 safetensors header with correct offsets and no data (what the planner reads); returns its bytes."""
    header: dict = {}
    offset = 0
    for name, shape in tensors.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    return offset


def dflash2_drafter(folder: Path, hidden: int = 5120) -> int:
    """A speculators DFlash2 drafter for the 27B target (5 layers, as the published one); returns weight bytes."""
    folder.mkdir(parents=True)
    layer = {"model_type": "qwen3", "hidden_size": hidden, "intermediate_size": 17408, "num_hidden_layers": 5,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 248320}
    (folder / "config.json").write_text(json.dumps({
        "speculators_model_type": "dflash2", "architectures": ["DFlash2DraftModel"],
        "transformer_layer_config": layer, "aux_hidden_state_layer_ids": [2, 17, 33, 48, 63],
        "mask_token_id": 248077,
        "speculators_config": {"proposal_methods": [{"speculative_tokens": 7}],
                               "verifier": {"name_or_path": "Qwen/Qwen3.8-27B"}},
    }))
    tensors = {"fc.weight": [hidden, 5 * 5120]}
    for i in range(5):
        tensors |= {f"layers.{i}.self_attn.q_proj.weight": [4096, hidden],
                    f"layers.{i}.self_attn.k_proj.weight": [1024, hidden],
                    f"layers.{i}.self_attn.v_proj.weight": [1024, hidden],
                    f"layers.{i}.self_attn.o_proj.weight": [hidden, 4096]}
    return header_only_safetensors(folder / "model.safetensors", tensors)


@pytest.mark.parametrize(("spec", "knob", "k"), [("mtp", "DRAFT_TOKENS", 5), ("ngram", "LOOKUP_TOKENS", 6)])
def test_draft_tokens_seats_and_context_follow_the_knobs(spec, knob, k):
    result = explain(f"SPEC={spec}", f"{knob}={k}", "MAX_SEQS=3", "MAX_LEN=8192", "PREFIX_CACHE=1")
    assert result.returncode == 0, result.stderr
    section = spec_section(result.stdout)
    assert f"Speculative decoding: SPEC={spec} (command line)" in section
    assert f"up to {k} tokens per step" in section and f"checks up to {k + 1} tokens per request" in section
    assert "seats: 3 requests at once (--max-num-seqs); context: 8192 tokens (--max-model-len)" in section
    assert f"GDN state: {2 + k} pages per running request" in section and "prefix caching on" in section
    assert re.search(r"the reference's published numbers \(theirs, github\.com/syv-ai/qwen38-27b-rtx3090", section)
    assert KEY not in result.stdout


def test_mtp_and_lookup_say_what_they_suit_with_the_references_numbers():
    mtp = spec_section(explain("SPEC=mtp").stdout)
    assert "the model's own MTP head" in mtp and "chat and coding agents" in mtp and "~120 tok/s" in mtp
    lookup = spec_section(explain("SPEC=ngram").stdout)
    assert "document work" in lookup and "381 tok/s" in lookup and "14.97 tokens per verify step" in lookup
    assert "nothing is drafted when nothing matches" in lookup


def test_no_speculation_has_no_drafts_and_the_smallest_state():
    section = spec_section(explain("SPEC=none", "PREFIX_CACHE=0").stdout)
    assert "drafts: none" in section
    assert "GDN state: 1 pages per running request" in section and "prefix caching off" in section


def test_dflash2_shows_the_checked_drafter_and_its_planned_memory(tmp_path):
    drafter = tmp_path / "Qwen3.8-27B-DFlash2-W4A16"
    weight_bytes = dflash2_drafter(drafter)
    result = explain("SPEC=dflash2", f"DRAFT={drafter}", "MEMORY_CHECK=warn", gpu="rtx3090")
    assert result.returncode == 0, result.stderr
    section = spec_section(result.stdout)
    assert "up to 7 tokens per step (vLLM method 'dflash')" in section  # DFLASH_TOKENS default, the reference's
    assert f"drafter: {drafter} (DRAFT)" in section
    assert "drafter check: ok: dflash2 (speculators layout, vLLM DFlash2Qwen3ForCausalLM), reads target layers " \
           "[1, 16, 32, 47, 62]" in section
    on_disk = (drafter / "model.safetensors").stat().st_size
    assert f"{on_disk / 2**20:.1f} MiB of weights on disk" in section
    # The plan counts the drafter's weights from its headers (bf16 here: the fake's bytes exactly).
    assert f"the memory plan counts {weight_bytes / 2**20:.1f} MiB of drafter weights on the GPU" in section
    assert re.search(r"and [\d.]+ KiB of KV per token \(target and drafter layers\)", section)
    assert "127-130 tok/s" in section and "4.6-4.9 in its later reports" in section


def test_mismatched_drafter_stops_serve_with_one_error_naming_it(tmp_path):
    drafter = tmp_path / "drafter-for-another-model"
    dflash2_drafter(drafter, hidden=4096)
    result = explain("SPEC=dflash2", f"DRAFT={drafter}")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, result.stderr
    assert str(drafter) in errors[0] and "hidden_size 5120" in errors[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.skipif("mtp+lookup" not in SPEC_METHODS, reason="SPEC=mtp+lookup not in this tree")
def test_combined_lookup_and_mtp_shows_both_parts():
    section = spec_section(explain("SPEC=mtp+lookup", "DRAFT_TOKENS=3", "LOOKUP_TOKENS=8").stdout)
    assert "context drafting: the verify block is filled first by prompt lookup" in section
    assert "the MTP head drafts 3 tokens" in section
    assert "~120 tok/s" in section and "381 tok/s" in section
