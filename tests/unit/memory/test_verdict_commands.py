"""`plan`, `serve`, `verify` and `replicas` give one verdict on the same inputs (memory/verdict.py).

A table of inputs that once split the commands (an empty MAX_LEN, TP that does not divide the heads, VISION,
a MAX_SEQS that collapses the context, KV_MEM beyond the card), each run through the four real commands
in-process (`hyperqwen.cli.main`) for an RTX 3090 by name (no GPU here: the card is described, not faked) and
the default model's bundled shapes (no 27B weights here).
"""

from __future__ import annotations

import json
import re

import pytest

from hyperqwen import cli, verify
from hyperqwen.config.knobs import KNOBS_BY_NAME
from hyperqwen.config.settings import resolve_settings
from hyperqwen.memory import parse_gpu
from hyperqwen.memory.verdict import judge

CARD = "rtx3090"

# input -> (plan's exit code, what serve runs: "default", "shorter" or None when it refuses)
CASES = {
    "MAX_LEN=": (0, "default"),  # empty = unset everywhere: the mode/CTX default
    "TP=3": (2, None),  # does not divide the KV heads
    "VISION=true": (0, "shorter"),  # the vision tower's weights shorten the unset MAX_LEN
    "MAX_SEQS=768": (2, None),  # per-slot reservations leave a few k tokens: refused, naming MAX_SEQS
    "KV_MEM=100000TiB": (4, None),  # the pinned pool cannot be allocated: vLLM would not boot
    "MAX_LEN=262144": (3, None),  # set, too long: refused with the largest that fits
}


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No .env and no knob from the test runner's environment; MODELS_DIR empty (the bundled shapes)."""
    monkeypatch.chdir(tmp_path)
    for name in list(__import__("os").environ):
        if name in KNOBS_BY_NAME:
            monkeypatch.delenv(name)
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    # verify's install checks import vLLM in a child process (seconds; test_verify.py covers them): skipped here,
    # the memory check after them is the real one.
    monkeypatch.setattr(verify, "run_install_checks", lambda report, *a, **k: None)
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("knob_value", list(CASES))
def test_the_four_commands_agree(clean, capsys, knob_value):
    want_exit, want_len = CASES[knob_value]
    setting = ["--set", knob_value]
    default_len = resolve_settings({}, mode="single").configured_max_model_len

    plan_code, plan_out, plan_err = run(capsys, "plan", "--gpu", CARD, "--json", *setting)
    assert plan_code == want_exit, plan_out + plan_err
    planned_len = json.loads(plan_out)["max_model_len"] if plan_code != 2 else None

    serve_code, serve_out, serve_err = run(capsys, "serve", "--print", "--gpu", CARD, *setting)
    served = re.search(r"--max-model-len[= ](\d+)", serve_out)
    if want_len is None:
        assert serve_code == 2 and served is None, serve_out + serve_err
    else:
        assert serve_code == 0, serve_err
        assert int(served.group(1)) == planned_len
        assert (planned_len == default_len) == (want_len == "default")

    _, verify_out, _ = run(capsys, "verify", "--no-gpu", "--gpu", CARD, *setting)
    memory = [line for line in verify_out.splitlines() if line.split(" ")[1:2] == ["memory:"]]
    assert memory and all(f"plan` exits {plan_code})" in line for line in memory if "exits" in line), verify_out
    assert any(line.startswith("FAIL") for line in memory) == (want_len is None), verify_out
    if want_len is not None:
        assert f"MAX_LEN={planned_len:,}" in memory[0]

    replicas_code, _, replicas_err = run(
        capsys, "replicas", "--print", "--no-device-check", "--gpu", CARD, "--set", "GPUS=0", *setting
    )
    assert (replicas_code == 0) == (want_len is not None), replicas_err


def test_refusals_name_the_knob_and_the_fix(clean):
    gpu = parse_gpu(CARD)
    seqs = judge(resolve_settings({"MAX_SEQS": "768", "MODELS_DIR": str(clean)}, mode="single"), gpu)
    (problem,) = seqs.refusals
    assert problem.knob == "MAX_SEQS"
    kept = int(re.search(r"MAX_SEQS=(\d+) keeps", problem.message).group(1))
    assert 4 < kept < 768
    fits = judge(resolve_settings({"MAX_SEQS": str(kept), "MODELS_DIR": str(clean)}, mode="single"), gpu)
    assert fits.starts and not fits.chosen
    too_many = judge(resolve_settings({"MAX_SEQS": str(kept + 1), "MODELS_DIR": str(clean)}, mode="single"), gpu)
    assert too_many.chosen or not too_many.starts

    kv = judge(resolve_settings({"KV_MEM": "100000TiB", "MODELS_DIR": str(clean)}, mode="single"), gpu)
    assert kv.exit_code == 4 and any("KV_MEM" in p for p in kv.budget.problems)
    assert any(h.startswith("KV_MEM=") for h in kv.budget.fix_hints)
