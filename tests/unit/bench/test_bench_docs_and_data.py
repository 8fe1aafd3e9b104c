"""Committed docs match the code and the committed results; the shipped workload data is usable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperqwen.bench import data
from hyperqwen.bench.cli import main
from hyperqwen.bench.client import BenchError
from hyperqwen.bench.definitions import DEFINITIONS
from hyperqwen.bench.render import render

REPO = Path(__file__).resolve().parents[3]
RESULTS = sorted((REPO / "bench" / "results").glob("*.json"))


def test_readme_carries_every_definition_verbatim():
    readme = (REPO / "bench" / "README.md").read_text(encoding="utf-8")
    for name, text in DEFINITIONS.items():
        assert f"- **{name}**: {text}" in readme, f"bench/README.md lacks the current definition of {name}"


def test_docs_benchmarks_is_generated_from_committed_results():
    if not RESULTS:
        pytest.skip("no committed results in bench/results yet")
    committed = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert committed == render(RESULTS), (
        "docs/benchmarks.md is stale: run `hyperqwen bench render bench/results/*.json > docs/benchmarks.md`")


def test_committed_cpu_results_are_labelled_cpu():
    for path in RESULTS:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not doc["environment"].get("gpus"):
            assert doc["environment"]["hardware"] == "cpu", path
            assert "CPU numbers" in render([path])


def test_render_rejects_foreign_json(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "other"}')
    assert main(["bench", "render", str(bad)]) == 2
    assert "field 'schema'" in capsys.readouterr().err
    with pytest.raises(BenchError):
        render([])


def test_chat_prompts_cover_english_code_and_other_languages():
    prompts = data.chat_prompts(data.data_dir())
    assert len(prompts) >= 8
    langs = {p["lang"] for p in prompts}
    assert {"en", "code"} <= langs and len(langs - {"en", "code"}) >= 3
    assert len({p["id"] for p in prompts}) == len(prompts)
    for p in prompts:
        assert p["messages"][0]["role"] == "user" and p["messages"][0]["content"].strip()


def test_longdoc_tasks_point_at_real_paragraphs():
    root = data.data_dir()
    paragraphs = data.corpus_paragraphs(root)
    tasks = json.loads((root / "longdoc_tasks.json").read_text())
    corpus_text = "\n\n".join(p.text for p in paragraphs)
    for task in tasks["copy"] + tasks["edit"]:
        assert any(p.doc == task["doc"] and p.text.startswith(task["paragraph_starts"]) for p in paragraphs), task
    for task in tasks["edit"]:
        paragraph = next(p.text for p in paragraphs if p.text.startswith(task["paragraph_starts"]))
        assert task["replace"] in paragraph
    for task in tasks["quote"]:
        assert all(term in corpus_text for term in task["must_contain"]), task
    for task in tasks["answer"]:
        doc = (root / "corpus" / task["doc"]).read_text().lower()
        assert any(a.lower() in doc or a == "11" for a in task["accept"]), task


def test_gsm8k_sample_is_well_formed():
    rows = data.read_jsonl(data.data_dir() / "gsm8k_sample.jsonl")
    assert len(rows) >= 20
    for row in rows:
        target = row["answer"].split("####")[-1].strip()
        float(target)
        # The worked solution ends with the same number it claims.
        assert target in row["answer"].split("####")[0]


def test_data_dir_error_names_the_option(tmp_path):
    with pytest.raises(BenchError, match="--data-dir"):
        data.data_dir(tmp_path)


class _CharCounter:
    exact = False

    async def count(self, text: str) -> int:
        return max(1, len(text) // 4)


def test_document_of_tokens_reaches_target_and_cycles():
    import asyncio

    paragraphs = data.corpus_paragraphs(data.data_dir())
    counter = _CharCounter()
    short = asyncio.run(data.document_of_tokens(counter, paragraphs, 500))
    assert 400 <= len(short) // 4 <= 515
    long = asyncio.run(data.document_of_tokens(counter, paragraphs, 12000))
    assert "(Collection, part 2)" in long and 11000 <= len(long) // 4 <= 12360
    rotated = asyncio.run(data.document_of_tokens(counter, paragraphs, 500, rotate=7))
    assert rotated != short


def test_readme_speed_numbers_are_the_references_and_say_so():
    """The README's "What speed to expect" quotes only the reference setup's published numbers (one source:
    bench/data/reference.json), labelled as theirs; none is presented as ours."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### What speed to expect", 1)[1].split("\n### ", 1)[0]
    assert "not ours" in section and "RTX 3090" in section and "hyperqwen bench suite" in section
    published = {row["value"] for row in json.loads((REPO / "bench" / "data" / "reference.json").read_text())["rows"]}
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| their")]
    quoted = [float(line.rstrip(" |").rsplit("|", 1)[1]) for line in rows]
    assert quoted and all(value in published for value in quoted), (quoted, sorted(published))
