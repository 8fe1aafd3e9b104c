"""The `hyperqwen` command line: bare `hyperqwen`, and no traceback from any command when an extra is missing.

A real base install (a fresh virtualenv, `pip install -e .`) is tested in tests/integration/test_base_install.py;
here the extras' packages are hidden from the import system (`sys.modules[name] = None` makes `import name` raise
ModuleNotFoundError, as on a base install), which costs a subprocess instead of a virtualenv.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys

import pytest

from hyperqwen.cli import COMMANDS
from support.commands import TYPICAL

EXTRA_PACKAGES = ("numpy", "aiohttp", "huggingface_hub", "safetensors", "tqdm", "prometheus_client", "matplotlib",
                  "tokenizers", "httpx", "requests")
HIDE_EXTRAS = (f"import sys\nfor name in {EXTRA_PACKAGES!r}:\n    sys.modules[name] = None\n"
               "from hyperqwen.cli import main\nsys.exit(main(sys.argv[1:]))")

def run(code: str, *args: str, cwd) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "MODELS_DIR": str(cwd / "models"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


def test_bare_hyperqwen_lists_the_commands_and_exits_2(tmp_path):
    result = run("from hyperqwen.cli import main; import sys; sys.exit(main([]))", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert all(name in result.stdout for name in COMMANDS) and "exits with status 2" in result.stdout


def test_every_command_has_a_typical_input():
    assert set(TYPICAL) == set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_registers_itself_with_the_help_line_of_the_table(name):
    """`hyperqwen --help` (the table, no import) and the command's own parser give the same line."""
    try:
        module = importlib.import_module(COMMANDS[name].module)
    except ModuleNotFoundError as exc:
        pytest.skip(f"{name}: {exc.name} is not installed")
    subparsers = argparse.ArgumentParser(prog="hyperqwen").add_subparsers(dest="command")
    module.register(subparsers)
    assert list(subparsers.choices) == [name]
    assert [action.help for action in subparsers._choices_actions] == [COMMANDS[name].help]


def test_prepare_lists_its_exit_statuses_and_takes_no_abbreviated_options():
    """What prepare's parser had before the command table: its exit statuses under --help, and no prefix of a
    long option standing for it (`--verify` is not `--verify-only`); draft-vocab-recount takes none either."""
    pytest.importorskip("huggingface_hub")
    from hyperqwen.prepare import cli as prepare_cli
    from hyperqwen.prepare import draft_vocab

    subparsers = argparse.ArgumentParser(prog="hyperqwen").add_subparsers(dest="command")
    prepare_cli.register(subparsers)
    draft_vocab.register(subparsers)
    prepare = subparsers.choices["prepare"]
    assert prepare.epilog == prepare_cli.EXIT_STATUSES and "exit status: 0 ready" in prepare.format_help()
    assert not prepare.allow_abbrev and not subparsers.choices["draft-vocab-recount"].allow_abbrev
    with pytest.raises(SystemExit):
        prepare.parse_args(["--verify"])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_traceback_with_the_extras_hidden(tmp_path, name):
    for args in (["--help"], TYPICAL[name][1:]):
        result = run(HIDE_EXTRAS, name, *args, cwd=tmp_path)
        assert "Traceback" not in result.stderr, f"hyperqwen {name} {' '.join(args)}:\n{result.stderr}"
        assert result.returncode in (0, 1, 2, 3, 4, 5), result.stderr
        assert "unrecognized arguments" not in result.stderr  # the typical input is a real invocation
        if result.returncode == 2 and "needs the Python package" in result.stderr:
            assert f"pip install 'hyperqwen[{COMMANDS[name].extra or 'all'}]'" in result.stderr
