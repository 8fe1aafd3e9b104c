"""Names in `.env` and the environment that are not knobs but look meant as one: "did you mean".

`unknown_names` is the one place that decides it, for every command: `resolve_settings` keeps its findings
as warnings on the settings, and `report_unknown_names` prints them once per process, before any command
runs, so `plan`, `prepare`, `verify`, `bench`, ... all say the same line that `serve` says.

Three kinds of name get a warning:
- a misspelling of a knob (edit distance 1 for short names, 2 for longer ones; any letter case);
- vLLM's own spelling of a setting we own under another name (`MAX_MODEL_LEN`, the flag `--max-model-len`
  as a variable, is our `MAX_LEN`), and the names other local servers use for the model or the context;
- a prefixed name close to a knob with the same prefix (`VLLM_APIKEY` for `VLLM_API_KEY`).
Other prefixed names (`VLLM_...`, `HF_...`, `CUDA_...`) belong to the programs that read them and pass
through without a word, and so do the shell's usual variables.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TextIO

from hyperqwen.config.knobs import KNOBS_BY_NAME
from hyperqwen.config.spelling import did_you_mean

# vLLM's flag names written as variables (and a few names other servers' users bring)
# -> the knob that sets the same thing here. A name here is never silently ignored.
FOREIGN_SPELLINGS: dict[str, str] = {
    "MAX_MODEL_LEN": "MAX_LEN",
    "CONTEXT_LENGTH": "MAX_LEN",
    "CONTEXT_SIZE": "MAX_LEN",
    "GPU_MEMORY_UTILIZATION": "GPU_UTIL",
    "KV_CACHE_DTYPE": "KV",
    "KV_CACHE_MEMORY_BYTES": "KV_MEM",
    "KV_OFFLOADING_SIZE": "RAM_CACHE",
    "MAX_NUM_SEQS": "MAX_SEQS",
    "MAX_NUM_BATCHED_TOKENS": "MAX_BATCHED_TOKENS",
    "ENABLE_PREFIX_CACHING": "PREFIX_CACHE",
    "SPECULATIVE_CONFIG": "SPEC",
    "NUM_SPECULATIVE_TOKENS": "DRAFT_TOKENS",
    "MAMBA_SSM_CACHE_DTYPE": "STATE_DTYPE",
    "TENSOR_PARALLEL_SIZE": "TP",
    "ENFORCE_EAGER": "CUDA_GRAPHS",
    "ENABLE_AUTO_TOOL_CHOICE": "TOOLS",
    "TOOL_CALL_PARSER": "TOOL_PARSER",
    "API_KEY": "VLLM_API_KEY",
    "HOST": "BIND",
    "MODEL_NAME": "SERVED_MODEL_NAME",
    "MODEL_ID": "MODEL_REPO",
    "HF_MODEL": "MODEL_REPO",
    "HF_REPO": "MODEL_REPO",
    "REPO_ID": "MODEL_REPO",
    "REVISION": "MODEL_REVISION",
    "DOWNLOAD_DIR": "MODELS_DIR",
}

# Knobs that choose what `prepare` downloads: a misspelling of one of them must not end in the default download.
MODEL_SOURCE_KNOBS = ("MODEL_REPO", "MODEL_REVISION", "MODEL_SOURCE_DIR", "MODEL", "MODELS_DIR", "HF_HUB_OFFLINE")

# Shell and system variables that sit near a knob name by accident; never "did you mean" them.
COMMON_ENVIRONMENT = frozenset(
    {
        "PATH", "HOME", "PWD", "OLDPWD", "USER", "SHELL", "TERM", "LANG", "TZ", "CC", "CXX", "CPP", "LD",
        "HOSTNAME", "MAIL", "EDITOR", "PAGER", "DISPLAY", "SHLVL", "LOGNAME", "TMP", "TEMP", "TMPDIR", "CI", "_",
    }
)  # fmt: skip
# Families of other programs' variables that legitimately sit beside our knobs in a .env or container
# environment (no "did you mean" for them), and whether their values may be printed in clear by `--print` and
# `--explain` (apikey.py shown_in_clear; a name with a secret word in it is masked in any family). The
# clear ones are known to hold settings, not secrets; anything else passed through is shown masked: it may be a
# token under a name we do not know.
ENV_FAMILIES: dict[str, bool] = {
    "VLLM_": True,
    "CUDA_": True,
    "NVIDIA_": True,
    "PYTORCH_": True,
    "TORCH": True,
    "NCCL_": True,
    "OMP_": True,
    "MKL_": True,
    "HF_HUB_": True,
    "HF_HOME": True,
    "HF_DATASETS_": True,
    "HF_": False,
    "HUGGINGFACE_": False,
    "TRANSFORMERS_": True,
    "TOKENIZERS_": True,
    "HYPERQWEN_": True,
    "PYTHON": True,
    "TRITON_": True,
    "CUBLAS_": True,
    "TZ": True,
    "LANG": True,
    "LC_": True,
    "COMPOSE_": False,
    "DOCKER_": False,
}
# Prefixes of other programs' variables, which legitimately sit beside our knobs: no "did you mean" for them.
FOREIGN_PREFIXES = tuple(ENV_FAMILIES)


@dataclass(frozen=True)
class UnknownName:
    """A variable that is not a knob but looks meant as `guess`."""

    name: str
    where: str  # ".env" or "the environment"
    guess: str
    foreign: bool  # another program's spelling of the knob, not a typo

    @property
    def message(self) -> str:
        if self.foreign:
            return (
                f"{self.name} (in {self.where}) is vLLM's or another server's spelling, ignored here; "
                f"did you mean {self.guess}?"
            )
        return f"{self.name} (in {self.where}) is not a HyperQwen knob and is ignored; did you mean {self.guess}?"


def _guess(name: str) -> tuple[str, bool] | None:
    """The knob an unknown variable was probably meant to be, and whether it is a foreign spelling."""
    upper = name.upper()
    if name in COMMON_ENVIRONMENT:
        return None
    if upper in FOREIGN_SPELLINGS:
        return FOREIGN_SPELLINGS[upper], True
    if upper in KNOBS_BY_NAME:  # a lower-case spelling, e.g. "spec"
        return upper, False
    if len(name) < 3:
        return None
    guess = did_you_mean(name, KNOBS_BY_NAME)
    if guess is None:
        return None
    # A prefix marks another program's variable (VLLM_..., HF_...), unless the knob it is close to has the same
    # prefix: VLLM_APIKEY is a misspelt VLLM_API_KEY, not a vLLM setting.
    if upper.startswith(FOREIGN_PREFIXES) and not any(
        upper.startswith(p) and guess.startswith(p) for p in FOREIGN_PREFIXES
    ):
        return None
    return guess, False


def unknown_names(env_file: Mapping[str, str], environ: Mapping[str, str]) -> list[UnknownName]:
    """Every variable in the `.env` values or the environment that is not a knob but looks meant as one."""
    found: list[UnknownName] = []
    for where, layer in ((".env", env_file), ("the environment", environ)):
        for name in layer:
            if name in KNOBS_BY_NAME:
                continue
            guessed = _guess(name)
            if guessed is not None:
                found.append(UnknownName(name, where, *guessed))
    return found


_reported: set[str] = set()


def report_unknown_names(found: Iterable[UnknownName], stream: TextIO | None = None) -> None:
    """Print each finding once per process (`hyperqwen: warning: ...`), however many times settings load."""
    for unknown in found:
        line = f"hyperqwen: warning: {unknown.message}"
        if line not in _reported:
            _reported.add(line)
            print(line, file=stream or sys.stderr)


def already_reported(message: str) -> bool:
    """Whether `report_unknown_names` printed this message already (a command's own report skips it)."""
    return f"hyperqwen: warning: {message}" in _reported


def misspelt_model_source(found: Iterable[UnknownName], explicit: Iterable[str]) -> list[UnknownName]:
    """Findings that mean a model-source knob the user meant to set is unset: `prepare` must not download the
    default model then. `explicit` names the knobs that were set (a knob set correctly as well is no risk)."""
    explicit = set(explicit)
    return [u for u in found if u.guess in MODEL_SOURCE_KNOBS and u.guess not in explicit]
