"""The suite's report: report.json (everything), report.md (for people) and plots/*.png (matplotlib, Agg).

The Markdown puts the user's numbers beside the reference's published ones (bench/reference.json, each row
naming its source) with the ratio ours/theirs, shows both decode definitions by name, and ends with a block
to paste into a field-report issue.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hyperqwen.bench import render
from hyperqwen.bench.definitions import DEFINITIONS, DEFINITIONS_VERSION

REPORT_SCHEMA = "hyperqwen-bench-report/1"
REFERENCE_NAME = "reference.json"  # in the bench data directory (bench/data of the repo, or the wheel's copy)
ISSUE_FORM = ".github/ISSUE_TEMPLATE/field-report.yml"


# ---- reference comparison ----------------------------------------------------------------------------
_PART = re.compile(r"^([A-Za-z_0-9]+)(?:\[(\d+|[A-Za-z_]+=[\d.]+)\])?$")
_SELECTOR_FIELDS = {"C": "concurrency", "target": "target_tokens"}


def resolve(steps: dict[str, dict], path: str) -> Any:
    """A value of a step's results by a path like `ladder.steps[C=8].aggregate_tok_s` or
    `chat_greedy.cohorts[0].spec_decode.tokens_per_verify_step`; None when any part is missing."""
    first, _, rest = path.partition(".")
    doc = steps.get(first)
    if doc is None:
        return None
    value: Any = doc.get("results") or {}
    for part in rest.split(".") if rest else []:
        match = _PART.match(part)
        if match is None or not isinstance(value, dict):
            return None
        value = value.get(match.group(1))
        selector = match.group(2)
        if selector is None:
            continue
        if not isinstance(value, list):
            return None
        if selector.isdigit():
            index = int(selector)
            value = value[index] if index < len(value) else None
        else:
            key, _, wanted = selector.partition("=")
            field = _SELECTOR_FIELDS.get(key, key)
            value = next(
                (item for item in value if isinstance(item, dict) and float(item.get(field, -1)) == float(wanted)), None
            )
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def load_reference(path: Path | None = None) -> dict:
    from hyperqwen.bench.data import data_dir

    return json.loads((path or data_dir() / REFERENCE_NAME).read_text(encoding="utf-8"))


def spec_of(environment: dict) -> str | None:
    knobs = environment.get("knobs") or {}
    value = knobs.get("SPEC")  # by name: the server's environment file (JSON, masked display text), not a Settings
    return str(value).lower() if value not in (None, "") else None


def compare(steps: dict[str, dict], environment: dict, reference: dict) -> list[dict]:
    """Each reference row with our comparable number and the ratio ours/theirs (lower-is-better rows:
    theirs/ours, so above 1 always means better than the reference)."""
    spec = spec_of(environment)
    rows = []
    for row in reference["rows"]:
        ours = resolve(steps, row["ours"])
        ratio = None
        if ours is not None and row["value"]:
            ratio = (row["value"] / ours if ours else None) if row.get("lower_is_better") else ours / row["value"]
        same = None if spec is None or row["spec"] == "any" else (row["spec"] == spec)
        source = reference["sources"][row["source"]]
        rows.append(
            {
                "id": row["id"],
                "what": row["what"],
                "theirs": row["value"],
                "ours": ours,
                "ratio": ratio,
                "unit": row["unit"],
                "definition": row["definition"],
                "same_configuration": same,
                "source": source["title"],
                "source_url": source.get("url"),
            }
        )
    return rows


# ---- plots ---------------------------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only, no display (a container or an SSH session has none)
    import matplotlib.pyplot as plt

    return plt


def make_plots(out: Path, steps: dict[str, dict]) -> dict[str, str]:
    """PNG files under out/plots; returns {plot name: relative path}. Missing data: that plot is left out."""
    plt = _pyplot()
    if plt is None:
        return {}
    made: dict[str, str] = {}
    (out / "plots").mkdir(parents=True, exist_ok=True)

    ladder = (steps.get("ladder") or {}).get("results", {}).get("steps") or []
    points = [s for s in ladder if s.get("decode_tok_s")]
    if points:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        cs = [s["concurrency"] for s in points]
        series = [
            ("aggregate (output tokens / wall time)", [s.get("aggregate_tok_s") for s in points]),
            ("steady decode", [s.get("steady_decode_tok_s") for s in points]),
            ("reference def.: C x 1000 / mean TPOT", [s.get("decode_reference_tok_s") for s in points]),
            ("per-stream decode, ours (median)", [s["decode_tok_s"]["median"] for s in points]),
        ]
        for label, values in series:
            xs = [c for c, v in zip(cs, values) if v is not None]
            ys = [v for v in values if v is not None]
            if ys:
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrency (C)")
        ax.set_ylabel("tokens/s")
        ax.set_title("Decode vs concurrency")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "plots" / "decode_vs_concurrency.png", dpi=110)
        plt.close(fig)
        made["decode_vs_concurrency"] = "plots/decode_vs_concurrency.png"

    rows = [r for r in (steps.get("prefill") or {}).get("results", {}).get("rows") or [] if r.get("ttft_s")]
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [(r.get("prompt_tokens") or {}).get("median") or r["target_tokens"] for r in rows]
        ax.plot(xs, [r["ttft_s"]["median"] for r in rows], marker="o", label="TTFT (median)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("seconds to first token")
        ax.set_title("TTFT vs prompt length (salted, no prefix cache)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "plots" / "ttft_vs_prompt_length.png", dpi=110)
        plt.close(fig)
        made["ttft_vs_prompt_length"] = "plots/ttft_vs_prompt_length.png"

    acceptance = []
    for name, label in (
        ("chat_greedy", "chat C1, greedy"),
        ("chat_default", "chat C1, default sampling"),
        ("reproduce", "document reproduction"),
    ):
        results = (steps.get(name) or {}).get("results") or {}
        spec = (
            results.get("spec_decode")
            if name == "reproduce"
            else ((results.get("cohorts") or [{}])[0].get("spec_decode"))
        )
        if spec and spec.get("acceptance_per_position"):
            acceptance.append((label, spec["acceptance_per_position"]))
    if acceptance:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        width = 0.8 / len(acceptance)
        for i, (label, values) in enumerate(acceptance):
            ax.bar([p + i * width for p in range(len(values))], values, width=width, label=label)
        positions = max(len(v) for _, v in acceptance)
        ax.set_xticks([p + 0.4 - width / 2 for p in range(positions)], [str(p) for p in range(positions)])
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted / drafts")
        ax.set_ylim(0, 1)
        ax.set_title("Acceptance per draft position")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "plots" / "acceptance_per_position.png", dpi=110)
        plt.close(fig)
        made["acceptance_per_position"] = "plots/acceptance_per_position.png"
    return made


# ---- the report ----------------------------------------------------------------------------------------
def _gates(steps: dict[str, dict]) -> dict[str, dict]:
    gates = {}
    for name, doc in steps.items():
        for gate, value in (doc.get("gates") or {}).items():
            gates[f"{name}.{gate}"] = value
    return gates


def _gate_detail(gate: dict) -> str:
    keys = (
        "exact_match",
        "found",
        "reproduced_share",
        "agreed",
        "checked",
        "failed",
        "requests",
        "pass_mark",
        "first_error",
    )
    return "; ".join(
        f"{k} {render.num(gate[k], 3) if isinstance(gate[k], float) else gate[k]}"
        for k in keys
        if k in gate and gate[k] not in (None, [])
    )


def _server_lines(environment: dict) -> list[str]:
    server = environment.get("server") or {}
    live = server.get("live") or {}
    model = server.get("model") or {}
    series = (server.get("patch_series") or {}).get("patches") or []
    versions = server.get("versions") or {}
    lines = [
        f"- GPU: {render.gpu_text(environment)}",
        f"- platform: {server.get('platform') or 'unknown'} (kernel {server.get('kernel') or '?'})",
        (
            f"- vLLM {live.get('vllm_version') or versions.get('vllm') or environment.get('vllm_version') or '?'}, "
            f"torch {live.get('torch') or versions.get('torch') or '?'}, CUDA {live.get('torch_cuda') or '–'}"
        ),
        f"- patch series: {', '.join(p['name'].split('-')[0] for p in series) or 'unknown'}",
        (
            f"- model: {model.get('repo')} @ {model.get('revision')}; prepared files sha256 {model.get('files_sha256')}"
            if model.get("manifest")
            else f"- model: {model.get('path') or '?'} ({model.get('note') or 'no manifest'})"
        ),
    ]
    lines.append(f"- calibration: {calibration_text(server)}")
    if environment.get("server_note"):
        lines.append(f"- **server environment unavailable**: {environment['server_note']}")
    return lines


def calibration_text(server: dict) -> str:
    """What `hyperqwen calibrate` measured beside the server's model: vLLM's pool against the planner's guess."""
    calibration = server.get("calibration")
    if not calibration:
        return "not reported by the server"
    if calibration.get("error"):
        return f"unusable ({calibration['error']})"
    rows = []
    for m in calibration.get("measurements") or []:
        vllm, planner = m.get("vllm") or {}, m.get("planner") or {}
        text = (
            f"{(m.get('gpu') or {}).get('name')} {m.get('date')} {m.get('mode')} ({m.get('compile_cache')}): "
            f"vLLM {vllm.get('pool_tokens', 0):,} pool tokens, model loading {vllm.get('model_loading_gib')} GiB, "
            f"peak activation {vllm.get('peak_activation_gib')} GiB"
        )
        if planner.get("pool_tokens") and vllm.get("pool_tokens"):
            text += f", planner estimate {planner['pool_tokens']:,} ({planner['pool_tokens'] / vllm['pool_tokens'] - 1:+.1%})"
        rows.append(text)
    return "; ".join(rows) or "none (`hyperqwen calibrate` adds this card's memory numbers)"


def paste_block(report: dict) -> str:
    env = report["environment"]
    server = env.get("server") or {}
    steps = report["steps"]

    def value(path: str, digits: int = 1) -> str:
        return render.num(resolve(steps, path), digits)

    failed = report["failed_gates"]
    lines = [
        f"hyperqwen field report ({'QUICK, not a measurement' if report['quick'] else 'full'}) "
        f"{report['generated_utc']}",
        f"gpu: {render.gpu_text(env)}",
        f"platform: {server.get('platform') or 'unknown'}; hardware: {env.get('hardware')}",
        f"vllm: {((server.get('live') or {}).get('vllm_version')) or env.get('vllm_version')}; "
        f"commit: {env.get('project_commit')}",
        f"knobs: {render.knobs_text(env)}",
        f"calibration: {calibration_text(server)}",
        f"C1 decode greedy: ours {value('chat_greedy.cohorts[0].decode_tok_s.median')} tok/s, reference def. "
        f"{value('chat_greedy.cohorts[0].decode_reference_tok_s')} tok/s; tokens/verify step "
        f"{value('chat_greedy.cohorts[0].spec_decode.tokens_per_verify_step', 2)}",
        f"C1 decode default sampling: reference def. {value('chat_default.cohorts[0].decode_reference_tok_s')} tok/s",
        f"ladder C8 aggregate {value('ladder.steps[C=8].aggregate_tok_s')} tok/s; C64 steady "
        f"{value('ladder.steps[C=64].steady_decode_tok_s')} tok/s",
        f"prefill 16k: {value('prefill.rows[target=16384].prefill_tok_s.median')} tok/s; prefix turn 2: "
        f"{value('prefix.ttft_turn2_s.median', 2)} s",
        f"reproduce: {value('reproduce.decode_reference_tok_s')} tok/s, "
        f"{value('reproduce.spec_decode.tokens_per_verify_step', 2)} tokens/step",
        f"gsm8k: {value('gsm8k.exact_match', 3)}; needle: {value('needle.found', 0)} found; "
        f"perplexity: {value('perplexity.perplexity', 3)}",
        f"gates: {'all passed' if not failed else 'FAILED ' + ', '.join(failed)}",
    ]
    return "\n".join(lines)


def build_markdown(report: dict) -> str:
    env = report["environment"]
    steps = report["steps"]
    out = ["# HyperQwen field report", ""]
    if env.get("hardware") == "cpu":
        out += ["**CPU numbers (vLLM CPU build, no GPU): not comparable with GPU results.**", ""]
    if report["quick"]:
        out += ["**Quick run (`--quick`): every workload shrunk to a smoke test; not a measurement.**", ""]
    out += [
        f"Generated {report['generated_utc']} by `hyperqwen bench suite` against `{report['server_url']}` "
        f"(model `{report['model']}`). Definitions of every number are at the end.",
        "",
    ]
    failed = report["failed_gates"]
    out += [
        "## Verdict",
        "",
        "All gates passed." if not failed else f"**{len(failed)} gate(s) FAILED**: " + ", ".join(failed),
        "",
    ]
    out += render.table(
        ["gate", "result", "detail"],
        [[name, "pass" if g["passed"] else "**FAIL**", _gate_detail(g)] for name, g in report["gates"].items()],
    ) + [""]
    if report["warnings"]:
        out += ["Warnings:", ""] + [f"- {text}" for text in report["warnings"].values()] + [""]
    out += ["## Server", ""] + _server_lines(env)
    out += [f"- knobs ({env.get('knobs_source')}; every knob in report.json): {render.knobs_text(env)}"]
    host = env.get("bench_host") or {}
    out += [
        f"- bench host (recorded separately): {host.get('cpus')} CPUs, {host.get('platform')}, load average "
        f"{render.num(host.get('load_average_1m_at_end'), 2)} at the end",
        "",
    ]
    for name, doc in steps.items():
        note = (doc.get("suite") or {}).get("note", "")
        out += [f"## {name}" + (f" ({note})" if note else ""), ""]
        if doc.get("error"):
            out += [f"**Did not run**: {doc['error']}", ""]
            continue
        out += render.render_results(doc) + [""]
        plot = {"ladder": "decode_vs_concurrency", "prefill": "ttft_vs_prompt_length"}.get(name)
        if plot and plot in report["plots"]:
            out += [f"![{plot}]({report['plots'][plot]})", ""]
    if "acceptance_per_position" in report["plots"]:
        out += [
            "## Acceptance per draft position",
            "",
            f"![acceptance]({report['plots']['acceptance_per_position']})",
            "",
        ]
    out += [
        "## Against the reference",
        "",
        "The reference's published numbers (bench/data/reference.json; theirs, measured on an RTX 3090 at 250 W "
        "with vLLM 0.27.1 and that project's patches). Ratio: ours / theirs, inverted for lower-is-better rows, so "
        "above 1 is better than the reference. Decode rows use the reference's definition (C x 1000 / mean "
        "TPOT), printed beside ours in the tables above.",
        "",
    ]
    out += render.table(
        ["reference", "theirs", "ours", "ratio", "definition", "same configuration", "source"],
        [
            [
                r["what"],
                f"{render.num(r['theirs'], 2)} {r['unit']}",
                render.num(r["ours"], 2),
                render.num(r["ratio"], 2),
                r["definition"],
                {True: "yes", False: "no", None: "unknown"}[r["same_configuration"]],
                r["source"] + (f" ({r['source_url']})" if r["source_url"] else ""),
            ]
            for r in report["reference"]
        ],
    ) + [""]
    out += ["## Definitions", ""] + [f"- **{name}**: {text}" for name, text in DEFINITIONS.items()] + [""]
    out += [
        "## Field report",
        "",
        f"Paste this block into a new issue with the *Field report* form ({ISSUE_FORM}) and attach `report.json`:",
        "",
        "```text",
        paste_block(report),
        "```",
        "",
    ]
    return "\n".join(out)


def write_report(out: Path, steps: dict[str, dict], *, environment: dict, quick: bool, planned: list[str]) -> dict:
    """Write report.json, report.md and the plots into out; return the report document."""
    ordered = {name: steps[name] for name in planned if name in steps}
    first = next(iter(ordered.values()), {})
    warnings: dict[str, str] = {}
    for doc in ordered.values():
        warnings.update(doc.get("warnings") or {})
    gates = _gates(ordered)
    missing = [name for name in planned if name not in ordered]
    report = {
        "schema": REPORT_SCHEMA,
        "definitions_version": DEFINITIONS_VERSION,
        "generated_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": quick,
        "model": first.get("model"),
        "server_url": first.get("server_url"),
        "environment": environment,
        "gates": gates,
        "failed_gates": [name for name, g in gates.items() if not g["passed"]] + [f"{m}.missing" for m in missing],
        "warnings": warnings,
        "reference": compare(ordered, environment, load_reference()),
        "plots": make_plots(out, ordered),
        "definitions": DEFINITIONS,
        "steps": ordered,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "report.md").write_text(build_markdown(report), encoding="utf-8")
    return report
