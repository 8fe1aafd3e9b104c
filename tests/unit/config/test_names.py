"""Unknown names in .env and the environment: one "did you mean" line, from every command, once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hyperqwen.config.knobs import KNOBS_BY_NAME
from hyperqwen.config.names import FOREIGN_SPELLINGS, misspelt_model_source, unknown_names


def guesses(env_file=None, environ=None) -> dict[str, str]:
    return {u.name: u.guess for u in unknown_names(env_file or {}, environ or {})}


@pytest.mark.parametrize(
    "name,knob",
    [("MAX_MODEL_LEN", "MAX_LEN"), ("GPU_MEMORY_UTILIZATION", "GPU_UTIL"), ("KV_CACHE_DTYPE", "KV"),
     ("MAX_NUM_SEQS", "MAX_SEQS"), ("API_KEY", "VLLM_API_KEY"), ("HOST", "BIND"),
     ("MAX_NUM_BATCHED_TOKENS", "MAX_BATCHED_TOKENS"), ("max_model_len", "MAX_LEN")],
)
def test_vllm_spellings_point_at_our_knob(name, knob):
    for layer in ("env_file", "environ"):
        found = unknown_names(**{"env_file": {}, "environ": {}, layer: {name: "1"}})
        assert [(u.name, u.guess, u.foreign) for u in found] == [(name, knob, True)]
        assert f"did you mean {knob}?" in found[0].message and "spelling" in found[0].message


def test_every_foreign_spelling_maps_to_a_real_knob_and_is_not_one():
    for name, knob in FOREIGN_SPELLINGS.items():
        assert knob in KNOBS_BY_NAME and name not in KNOBS_BY_NAME, name


def test_misspellings_and_other_programs_variables():
    found = guesses(env_file={"MODEL_REPOO": "x/y", "SPECC": "mtp", "VLLM_LOGGING_LEVEL": "DEBUG"},
                    environ={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HOME": "/h", "PATH": "/bin", "HOSTNAME": "box",
                             "VLLM_APIKEY": "k", "MAX_LEN": "4096"})
    assert found == {"MODEL_REPOO": "MODEL_REPO", "SPECC": "SPEC", "VLLM_APIKEY": "VLLM_API_KEY"}


def test_a_misspelt_model_source_is_flagged_unless_the_knob_is_set_too():
    found = unknown_names({"MODEL_REPOO": "someone/other-model", "SPECC": "mtp"}, {})
    assert [u.name for u in misspelt_model_source(found, explicit=[])] == ["MODEL_REPOO"]
    assert misspelt_model_source(found, explicit=["MODEL_REPO"]) == []


def hyperqwen(*args: str, cwd, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run([sys.executable, "-m", "hyperqwen", *args], capture_output=True, text=True, cwd=cwd,
                          env=environ, timeout=120)


@pytest.mark.parametrize("args", [["plan"], ["serve", "--print"], ["replicas", "--print", "--no-device-check"],
                                  ["verify"], ["knobs", "--check"]])
def test_every_command_warns_once(tmp_path, args):
    (tmp_path / ".env").write_text("SPECC=mtp\n")
    result = hyperqwen(*args, cwd=tmp_path, env={"GPU_MEMORY_UTILIZATION": "0.9", "MODELS_DIR": str(tmp_path)})
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert sum("SPECC (in .env)" in line and "did you mean SPEC?" in line for line in lines) == 1, result.stderr
    assert sum("GPU_MEMORY_UTILIZATION (in the environment)" in line and "did you mean GPU_UTIL?" in line
               for line in lines) == 1, result.stderr


def test_prepare_refuses_a_misspelt_model_repo_before_any_download(tmp_path):
    (tmp_path / ".env").write_text("MODEL_REPOO=someone/other-model\n")
    # HF_ENDPOINT: nothing listens there, so a download attempt would fail with a different, network message.
    result = hyperqwen("prepare", cwd=tmp_path, env={"MODELS_DIR": str(tmp_path / "models"),
                                                     "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert result.returncode == 1, result.stderr
    assert "MODEL_REPOO (in .env) is not a knob, so MODEL_REPO keeps its default" in result.stderr
    assert "nothing was downloaded" in result.stderr and "rename MODEL_REPOO to MODEL_REPO" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "models" / "qwen3.8-27b").exists()
