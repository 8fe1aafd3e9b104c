"""docs/agents.md and the Codex model catalog it ships (docs/agents/codex-models.json) agree with the knobs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hyperqwen.config.settings import resolve_settings

REPO_ROOT = Path(__file__).resolve().parents[2]
CATALOG = REPO_ROOT / "docs" / "agents" / "codex-models.json"
AGENTS_DOC = REPO_ROOT / "docs" / "agents.md"


def test_codex_catalog_entry_names_the_served_model_with_the_single_mode_context():
    single = resolve_settings({}, mode="single")
    (entry,) = json.loads(CATALOG.read_text())["models"]
    assert entry["slug"] == single.by_name["SERVED_MODEL_NAME"].value
    assert entry["context_window"] == entry["max_context_window"] == single.configured_max_model_len
    # Codex 0.171 refuses a catalog entry without instructions; ours are short and our own.
    assert entry["base_instructions"].strip()
    # Every effort the entry offers is one the thinking gate maps (none/minimal off, the rest on).
    assert {level["effort"] for level in entry["supported_reasoning_levels"]} <= {
        "none", "minimal", "low", "medium", "high", "xhigh", "max"}


def test_agents_doc_config_toml_points_at_the_catalog_with_the_same_context():
    text = AGENTS_DOC.read_text()
    (entry,) = json.loads(CATALOG.read_text())["models"]
    window = re.search(r"^model_context_window = (\d+)", text, re.MULTILINE)
    assert window and int(window.group(1)) == entry["context_window"]
    assert re.search(r'^model_catalog_json = "/[^"]+\.json"', text, re.MULTILINE)


def test_every_json_and_yaml_block_in_the_agents_doc_parses():
    """The client configuration files docs/agents.md gives (opencode.json, aider's model metadata, Continue's and
    llm's YAML, the LiteLLM proxy's config) are valid as printed, so a copy-paste starts from a file that loads."""
    import yaml

    blocks = re.findall(r"^```(json|yaml)\n(.*?)^```", AGENTS_DOC.read_text(), re.MULTILINE | re.DOTALL)
    kinds = [kind for kind, _ in blocks]
    assert kinds.count("yaml") >= 3 and kinds.count("json") >= 2, kinds
    for kind, text in blocks:
        loaded = json.loads(text) if kind == "json" else yaml.safe_load(text)
        assert loaded, text


def test_codex_catalog_instructions_name_no_tool_codex_does_not_offer():
    """Codex 0.171 offers a custom provider exec_command/write_stdin, the goal tools, view_image, request_user_input
    and web search (recorded in tests/integration/test_agents_clients.py), not apply_patch, which its own built-in
    instructions describe."""
    (entry,) = json.loads(CATALOG.read_text())["models"]
    assert "apply_patch" not in entry["base_instructions"]
    assert "shell" in entry["base_instructions"]
