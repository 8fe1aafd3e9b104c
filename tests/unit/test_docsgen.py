"""`.env.example` and `docs/knobs.md` are generated from the schema and must be current and usable."""

from __future__ import annotations

import re

from hyperqwen import docsgen
from hyperqwen.config.envfile import read_env_file
from hyperqwen.config.knobs import KNOBS
from hyperqwen.config.settings import resolve_settings


def test_generated_files_are_current():
    stale = docsgen.stale_files()
    assert not stale, f"stale generated files {stale}: run `hyperqwen knobs --write`"


def test_stale_file_is_detected(tmp_path):
    for relative, render in docsgen.GENERATED.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(render())
    assert docsgen.stale_files(tmp_path) == []
    (tmp_path / docsgen.KNOBS_DOC).write_text("hand edited\n")
    assert docsgen.stale_files(tmp_path) == [docsgen.KNOBS_DOC]


def test_every_knob_is_in_env_example_and_docs():
    env_example = docsgen.render_env_example()
    knobs_doc = docsgen.render_knobs_doc()
    for knob in KNOBS:
        assert re.search(rf"^#{knob.name}=", env_example, re.MULTILINE), knob.name
        assert f"| `{knob.name}` |" in knobs_doc, knob.name


def test_env_example_uncommented_is_a_valid_env_file(tmp_path):
    """A user who uncomments every line gets exactly the defaults, not an error."""
    lines = [line[1:] for line in docsgen.render_env_example().splitlines()
             if re.match(r"^#[A-Z_]+=", line)]
    path = tmp_path / ".env"
    path.write_text("\n".join(lines) + "\n")
    values = read_env_file(path)
    settings = resolve_settings({}, mode="single", env_file=values)
    assert settings["SPEC"] == "mtp" and settings["PORT"] == 18020


def test_secrets_have_no_value_in_env_example():
    env_example = docsgen.render_env_example()
    for knob in KNOBS:
        if knob.secret:
            assert f"#{knob.name}=\n" in env_example


def test_docs_table_shows_each_mode_profile_default():
    doc = docsgen.render_knobs_doc()
    row = next(line for line in doc.splitlines() if line.startswith("| `SPEC` |"))
    single, batch = row.split("|")[2].strip(), row.split("|")[3].strip()
    assert (single, batch) == ("`mtp`", "`none`")
