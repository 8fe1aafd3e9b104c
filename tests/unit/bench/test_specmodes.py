"""hyperqwen.bench.specmodes: the output comparison, the gate, and the rendered table (no server)."""

from __future__ import annotations

from hyperqwen.bench.render import render_results
from hyperqwen.bench.specmodes import SpecPrompt, compare_outputs, spec_modes_result

PROMPTS = [SpecPrompt("a", "chat", "x", 3), SpecPrompt("b", "chat", "y", 3), SpecPrompt("d", "document", [1, 2], 3)]
REFERENCE = {"a": [1, 2, 3], "b": [4, 5, 6], "d": [7, 8, 9]}


def mode(spec: str, outputs: dict[str, list[int]], spec_decode: dict | None) -> dict:
    workloads = {
        name: {"requests": n, "output_tokens": 3 * n, "wall_s": 1.0, "output_tok_s": 3.0 * n, "spec_decode": spec_decode}
        for name, n in (("chat", 2), ("document", 1))
    }
    return {"spec": spec, "knobs": {"DRAFT_TOKENS": 3} if spec == "mtp" else {}, "workloads": workloads,
            "identical": compare_outputs(REFERENCE, outputs, PROMPTS)}


def test_identical_outputs_and_the_first_difference():
    same = compare_outputs(REFERENCE, dict(REFERENCE), PROMPTS)
    assert same["chat"]["identical"] == 2 and same["chat"]["of"] == 2 and same["chat"]["first_difference"] == {}
    forked = compare_outputs(REFERENCE, {**REFERENCE, "b": [4, 0, 6]}, PROMPTS)
    assert forked["chat"]["identical"] == 1 and forked["chat"]["first_difference"] == {"b": 1}
    assert forked["document"]["identical"] == 1
    assert forked["chat"]["digests"]["a"] == same["chat"]["digests"]["a"] != forked["chat"]["digests"]["b"]


def test_gate_fails_when_any_mode_forks_and_the_table_shows_each_mode():
    spec = {"drafts": 10.0, "accepted_tokens": 15.0, "draft_tokens": 30.0, "tokens_per_verify_step": 2.5,
            "acceptance_rate": 0.5, "acceptance_per_position": [0.9, 0.4, 0.2]}
    modes = [mode("none", REFERENCE, None), mode("mtp", REFERENCE, spec)]
    doc = spec_modes_result(model="m", environment={}, modes=modes, run_id="r", seed=0, duration_s=1.0,
                            command="python scripts/bench_spec_cpu.py --out x.json", note="CPU numbers")
    assert doc["gates"]["identical_to_no_speculation"]["passed"]
    lines = render_results(doc)
    assert lines[0] == "CPU numbers" and "scripts/bench_spec_cpu.py" in lines[2]
    rows = [line for line in lines if line.startswith("| `")]
    assert len(rows) == 4
    assert rows[2].split(" | ")[:3] == ["| `mtp`", "DRAFT_TOKENS=3", "chat"]
    assert "| 2.50 | 0.90 / 0.40 / 0.20 | 0.50 | 2/2 |" in rows[2]
    assert "| – | – | – | – | 2/2 |" in rows[0]  # SPEC=none: no spec-decode counters

    forked = spec_modes_result(model="m", environment={}, modes=[*modes, mode("ngram", {**REFERENCE, "d": [7, 8, 0]},
                               spec)], run_id="r", seed=0, duration_s=1.0, command="c", note="")
    assert forked["gates"]["identical_to_no_speculation"] == {"passed": False, "forks": {"ngram": {"document": {"d": 2}}}}
