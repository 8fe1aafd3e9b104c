"""`hyperqwen serve --print/--explain` and its refusals, run as a user runs them (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

KEY = "sk-never-print-me-0123456789"


def hyperqwen(*args, env=None, cwd=None):
    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "hyperqwen", *args], capture_output=True, text=True,
                          env=environ, cwd=cwd, timeout=60)


def test_print_shows_command_and_masks_key(tmp_path):
    result = hyperqwen("serve", "--mode", "single", "--print", env={"VLLM_API_KEY": KEY}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "-m vllm.entrypoints.openai.api_server" in result.stdout
    assert "VLLM_API_KEY=****" in result.stdout
    assert KEY not in result.stdout + result.stderr


def test_explain_shows_sources(tmp_path):
    (tmp_path / ".env").write_text("MAX_SEQS=2\n")
    result = hyperqwen("serve", "--mode", "single", "--explain", "--set", "PORT=18099",
                       env={"SPEC": "none", "VLLM_API_KEY": KEY}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert rows["MAX_SEQS"].split()[1:] == ["2", ".env"]
    assert rows["SPEC"].split()[1:] == ["none", "environment"]
    assert rows["PORT"].split()[1:] == ["18099", "command", "line"]
    assert rows["DRAFT_TOKENS"].split()[1:] == ["4", "single", "profile"]
    assert rows["SERVED_MODEL_NAME"].split()[1:] == ["qwen3.8-27b", "default"]
    assert rows["VLLM_API_KEY"].split()[1] == "****"
    assert KEY not in result.stdout


def test_api_key_file_is_read_and_masked(tmp_path):
    (tmp_path / "api_key.txt").write_text(KEY + "\n")
    result = hyperqwen("serve", "--print", env={"MODELS_DIR": str(tmp_path), "BIND": "0.0.0.0"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "VLLM_API_KEY=****" in result.stdout and KEY not in result.stdout


def test_exposed_without_key_refuses_and_starts_nothing(tmp_path):
    result = hyperqwen("serve", "--print", env={"BIND": "0.0.0.0", "MODELS_DIR": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 2
    assert "openssl rand -hex 16 > models/api_key.txt" in result.stderr
    assert "nothing was started" in result.stderr
    assert result.stdout == ""


def test_bad_value_error_names_knob(tmp_path):
    result = hyperqwen("serve", "--print", env={"SPEC": "eagle"}, cwd=tmp_path)
    assert result.returncode == 2
    assert "SPEC='eagle' (in the environment) is not one of the allowed values" in result.stderr


def test_missing_model_directory_says_to_run_prepare(tmp_path):
    result = hyperqwen("serve", env={"MODELS_DIR": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 2
    assert "no checkpoint at" in result.stderr and "prepare" in result.stderr


def test_warning_for_misspelled_knob_reaches_the_user(tmp_path):
    result = hyperqwen("serve", "--print", env={"DRAFT_TOKEN": "2"}, cwd=tmp_path)
    assert result.returncode == 0
    assert "did you mean DRAFT_TOKENS?" in result.stderr


@pytest.mark.parametrize("args", [["--set", "NOEQUALS"], ["--env-file", "/nonexistent/.env"]])
def test_bad_command_line_is_a_clean_error(tmp_path, args):
    result = hyperqwen("serve", "--print", *args, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr


# --- one way through: what --print shows is what the exec runs -------------------------------------------

def _printed_and_executed(tmp_path, capsys, argv, environ, gpu):
    """Run `serve --print` and `serve` (exec replaced by a recorder) on the same inputs; return both argvs."""
    import shlex

    from hyperqwen.cli import build_parser
    from hyperqwen.launch import serve

    def parse(words):
        return build_parser("serve").parse_args(["serve", *words])

    assert serve.run(parse(["--print", *argv]), environ, gpu_reader=lambda: gpu) == 0
    printed = capsys.readouterr().out
    words = shlex.split(printed.replace("\\\n", " "))
    executed: list = []
    code = serve.run(parse(argv), environ, gpu_reader=lambda: gpu,
                     execve=lambda path, args, env: executed.append((path, args, env)))
    assert code == 0 and len(executed) == 1
    path, args, env = executed[0]
    assert path == args[0]
    return tuple(words[words.index(args[0]):]), tuple(args), env, capsys.readouterr().err


@pytest.mark.parametrize("case", ["fits", "shortened"])
def test_print_and_exec_run_the_same_argv(tmp_path, capsys, monkeypatch, case):
    from pathlib import Path

    from hyperqwen.config.settings import resolve_settings
    from hyperqwen.config.sizes import GiB
    from hyperqwen.launch.command import argv_value
    from hyperqwen.memory import GpuFacts, plan_memory

    monkeypatch.chdir(tmp_path)  # no stray ./.env
    fixtures = Path(__file__).parents[1] / "memory" / "data"
    environ = {"MODELS_DIR": str(fixtures), "MODEL": "qwen3.8-27b-prepared", "VLLM_API_KEY": KEY,
               "HYPERQWEN_ENVIRONMENT_FILE": str(tmp_path / "environment.json")}
    settings = resolve_settings(environ, mode="single")
    gpu = GpuFacts.nominal(80 * GiB)
    if case == "shortened":  # the smallest card on which the 64k default is cut
        for quarter in range(12 * 4, 96 * 4):
            gpu = GpuFacts.nominal(int(quarter / 4 * GiB))
            budget = plan_memory(settings, gpu)
            if not budget.fits and budget.largest_fitting_max_len:
                break
    printed, executed, env, err = _printed_and_executed(tmp_path, capsys, ["--mode", "single"], environ, gpu)
    assert printed == executed
    max_len = int(argv_value(executed, "--max-model-len"))
    if case == "shortened":
        assert max_len < 65536 and f"MAX_LEN={max_len}" in err
    else:
        assert max_len == 65536
    assert "memory plan:" in err and KEY not in err
    assert env["VLLM_API_KEY"] == KEY
    # The facts the bench reads from the server: written before the exec, the knobs as they run, no key.
    import json

    facts_text = Path(env["HYPERQWEN_ENVIRONMENT_FILE"]).read_text()
    assert KEY not in facts_text
    assert str(max_len) in json.dumps(json.loads(facts_text)["knobs"])


def test_print_for_a_named_card_shows_what_would_run_there(tmp_path):
    from pathlib import Path

    fixtures = Path(__file__).parents[1] / "memory" / "data"
    env = {"MODELS_DIR": str(fixtures), "MODEL": "qwen3.8-27b-prepared"}
    big = hyperqwen("serve", "--print", "--gpu", "80GiB", env=env, cwd=tmp_path)
    assert big.returncode == 0, big.stderr
    assert "--max-model-len=65536" in big.stdout.replace(" \\\n    ", " ")
    small = hyperqwen("serve", "--print", "--gpu", "8GiB", env=env, cwd=tmp_path)
    assert small.returncode == 2 and "do not fit" in small.stderr and "Traceback" not in small.stderr


@pytest.mark.parametrize("card", ["rtx9999", "0", "abc"])
def test_unknown_card_is_one_clean_line(tmp_path, card):
    result = hyperqwen("serve", "--print", "--gpu", card, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_gpu_flag_is_only_for_print_and_explain(tmp_path):
    result = hyperqwen("serve", "--gpu", "rtx3090", cwd=tmp_path)
    assert result.returncode == 2 and "--print or --explain" in result.stderr
