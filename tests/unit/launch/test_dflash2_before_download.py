"""SPEC=dflash2 before `prepare` fetched the drafter: `serve --print/--explain` show the command with one warning
line naming DRAFT, the folder and how `prepare` fills it; a real start and `plan` stop with that line.

Run in-process through `hyperqwen.cli.main`; the target is the memory planner's header-only Qwen3.8-27B fixture
(no 27B weights here), the drafter folder simply does not exist yet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperqwen import cli
from hyperqwen.config.knobs import KNOBS_BY_NAME
from hyperqwen.prepare.drafter import DRAFTER_DIR_NAME

FIXTURES = Path(__file__).parents[1] / "memory" / "data"
MODEL = "qwen3.8-27b-prepared"


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in list(__import__("os").environ):
        if name in KNOBS_BY_NAME:
            monkeypatch.delenv(name)
    for name, value in {"MODELS_DIR": str(FIXTURES), "MODEL": MODEL, "SPEC": "dflash2"}.items():
        monkeypatch.setenv(name, value)
    return FIXTURES / DRAFTER_DIR_NAME


def warning_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "drafter is not downloaded" in line]


@pytest.mark.parametrize("flag", ["--print", "--explain"])
def test_print_and_explain_show_the_command_and_one_warning(env, capsys, flag):
    assert not env.exists()
    code = cli.main(["serve", flag, "--gpu", "rtx3090"])
    out = capsys.readouterr()
    assert code == 0, out.err
    text = out.out + out.err
    [line] = warning_lines(text)
    assert f"DRAFT={DRAFTER_DIR_NAME}" in line and str(env) in line and "hyperqwen prepare" in line
    if flag == "--print":
        assert f'"method":"dflash","model":"{env}"' in out.out


def test_a_real_start_stops_naming_draft_and_the_folder(env, capsys):
    executed = []
    from hyperqwen.launch import serve

    args = cli.build_parser("serve").parse_args(["serve"])
    code = serve.run(args, gpu_reader=lambda: None, execve=lambda *a: executed.append(a))  # no GPU here
    err = capsys.readouterr().err
    assert code == 2 and not executed
    [line] = warning_lines(err)
    assert line.startswith("hyperqwen: error:") and f"DRAFT={DRAFTER_DIR_NAME}" in line and str(env) in line


def test_plan_refuses_with_the_same_line(env, capsys):
    code = cli.main(["plan"])
    err = capsys.readouterr().err
    assert code == 2
    [line] = warning_lines(err)
    assert f"DRAFT={DRAFTER_DIR_NAME}" in line and str(env) in line
