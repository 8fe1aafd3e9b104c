"""Settings + the memory decision -> the vLLM server command line and environment. Pure: no I/O, no GPU.

Built once per launch, after the memory step (launch/budget.py) has fixed the context length; what
`hyperqwen serve --print` shows is this object, and the exec runs this object.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field

from hyperqwen.config.apikey import exposure_problem, shown_in_clear
from hyperqwen.config.extra_args import builder_overrides
from hyperqwen.config.keyrule import MASK
from hyperqwen.config.knobs import EMBED_OFFLOAD_CAP_GIB
from hyperqwen.config.settings import Problem, Settings, SettingsError

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SECRET_ENV = frozenset({"VLLM_API_KEY", "HF_TOKEN"})
# The vLLM flags build_command emits on its own, that no knob's maps_to names (knobs.py): EXTRA_ARGS may not
# override them either. A unit test builds the command over the knobs' choices and proves every flag it emits
# is a knob's or listed here.
BUILDER_FLAGS = ("--enable-prompt-tokens-details", "--tool-strict-level")


@dataclass(frozen=True)
class VllmCommand:
    """What `hyperqwen serve` will exec.

    argv: the full command, argv[0] the Python interpreter.
    env: variables set on top of the inherited environment; unset_env: variables removed from it.
    """

    argv: tuple[str, ...]
    env: dict[str, str]
    unset_env: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    kv_cache_dtype: str = "auto"
    max_model_len: int = 0

    @property
    def vllm_args(self) -> tuple[str, ...]:
        """The arguments after `python -m vllm.entrypoints.openai.api_server`."""
        return self.argv[3:]

    def shell_command(self) -> str:
        """The exact command, shell-quoted, one flag per line, secrets masked; what `--print` shows."""
        groups: list[list[str]] = []
        if self.env or self.unset_env:
            groups.append(
                [
                    "env",
                    *(f"--unset={name}" for name in self.unset_env),
                    *(f"{name}={value}" for name, value in sorted(self.masked_env().items())),
                ]
            )
        groups.append(list(self.argv[:3]))
        for word in self.argv[3:]:
            if word.startswith("--") or groups[-1][0] in ("env", self.argv[0]):
                groups.append([word])
            else:
                groups[-1].append(word)
        return " \\\n    ".join(shlex.join(group) for group in groups)

    def masked_env(self) -> dict[str, str]:
        """Values safe to print: secrets, names with KEY/TOKEN/SECRET/PASSWORD, near misses of a secret knob
        and variables outside the known settings families (a `.env` may pass anything through) are masked."""
        return {
            name: (MASK if name in SECRET_ENV or not shown_in_clear(name) else value)
            for name, value in self.env.items()
        }


def configured_max_model_len(settings: Settings) -> int:
    """MAX_LEN as configured (MAX_LEN, else the mode profile's, else the CTX preset's), before the memory step."""
    return settings.configured_max_model_len


def speculative_config(settings: Settings) -> dict | None:
    spec = settings["SPEC"]
    if spec == "mtp":
        return {"method": "mtp", "num_speculative_tokens": settings["DRAFT_TOKENS"]}
    if spec == "dflash2":
        # vLLM recognises a DFlash/DFlash2 drafter by its architecture; the method name is "dflash".
        return {
            "method": "dflash",
            "model": str(settings.under_models_dir(settings["DRAFT"])),
            "num_speculative_tokens": settings["DFLASH_TOKENS"],
        }
    if spec == "ngram":
        # Prompt lookup: the last 5..2 tokens are matched in the prompt and earlier output (longest first) and
        # the LOOKUP_TOKENS that followed the match are proposed. vLLM's default is min = max = 5, which misses
        # repeats shorter than 5 tokens (a judgement, not a measurement yet: the CPU test is still to come).
        return {
            "method": "ngram",
            "num_speculative_tokens": settings["LOOKUP_TOKENS"],
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        }
    if spec == "mtp+lookup":
        # Patch 0031 (context_lookup): each step the verify block is filled from a prompt-lookup match (same
        # 2..5-token rule as ngram) where the context has one, else from the MTP head, which drafts only
        # DRAFT_TOKENS of it (its later slots repeat its last draft). The block is max(DRAFT_TOKENS,
        # LOOKUP_TOKENS) wide for every request and step, so CUDA graph shapes stay fixed.
        return {
            "method": "mtp",
            "num_speculative_tokens": settings.num_speculative_tokens,
            "context_lookup": True,
            "context_lookup_min": 2,
            "context_lookup_max": 5,
            "context_drafter_tokens": settings["DRAFT_TOKENS"],
        }
    return None


def build_command(
    settings: Settings,
    *,
    max_model_len: int | None = None,
    api_key: str | None,
    listen_host: str | None = None,
    python: str = sys.executable,
) -> VllmCommand:
    """Settings (+ the decided context length, the API key, the in-container listen address) -> the command.

    max_model_len: what the memory step decided (launch/budget.py); None = as configured (tests, docs).

    api_key: the key clients must send, or None for no key. It goes to vLLM through VLLM_API_KEY,
    never the command line. listen_host: where the server listens when it differs from BIND (inside a
    container it listens on 0.0.0.0 while compose publishes the port on BIND only).
    Raises SettingsError when the combination is unsafe (exposed without a key) or EXTRA_ARGS overrides one of
    BUILDER_FLAGS.
    """
    refuse_exposed_without_key(settings, api_key)
    overrides = builder_overrides(settings["EXTRA_ARGS"], BUILDER_FLAGS)
    if overrides:
        raise SettingsError([Problem("error", f"EXTRA_ARGS: {message}", "EXTRA_ARGS") for message in overrides])

    kv_dtype = settings.kv_cache_dtype
    model_len = settings.configured_max_model_len if max_model_len is None else max_model_len
    args: list[str] = [
        "--model",
        str(settings.model_path),
        "--served-model-name",
        settings["SERVED_MODEL_NAME"],
        "--host",
        listen_host or settings["BIND"],
        "--port",
        str(settings["PORT"]),
        "--dtype",
        settings["DTYPE"],
        "--max-model-len",
        str(model_len),
        "--kv-cache-dtype",
        kv_dtype,
        "--mamba-ssm-cache-dtype",
        settings["STATE_DTYPE"],
        # Always explicit: recent vLLM turns prefix caching on by default for hybrid models.
        "--enable-prefix-caching" if settings["PREFIX_CACHE"] else "--no-enable-prefix-caching",
    ]
    args += feature_args(settings)
    args += list(settings["EXTRA_ARGS"])
    env, unset = server_env(settings, api_key)
    return VllmCommand(
        argv=(python, "-m", VLLM_SERVER_MODULE, *args),
        env=env,
        unset_env=unset,
        problems=settings.problems,
        kv_cache_dtype=kv_dtype,
        max_model_len=model_len,
    )


def refuse_exposed_without_key(settings: Settings, api_key: str | None) -> None:
    """The server may listen beyond this machine only with an API key (config/apikey.py's rule)."""
    problem = exposure_problem(settings, api_key, "the API")
    if problem is not None:
        raise SettingsError([problem])


def feature_args(settings: Settings) -> list[str]:
    """The flags of the knobs that switch features on or off (prefix caching details, TP, offloading,
    speculative decoding, tools, thinking, ...)."""
    args: list[str] = []
    if settings["PREFIX_CACHE"]:
        # usage.prompt_tokens_details.cached_tokens; /v1/messages reports it as cache_read_input_tokens.
        args.append("--enable-prompt-tokens-details")
    if settings["TP"] > 1:
        # One server over TP cards (docs/multi-gpu.md); memory/parallel.py plans one rank's share.
        args += ["--tensor-parallel-size", str(settings["TP"])]
    if settings["SCALE_OUT"]:
        # vllm-router's cache_aware policy renders each request on a replica to match prefixes by token ids
        # (vllm/entrypoints/scale_out/factories.py: without this flag those routes answer 403).
        args.append("--enable-scale-out")
    if not settings["VISION"]:
        args.append("--language-model-only")
    for knob, flag in (
        ("MAX_SEQS", "--max-num-seqs"),
        ("MAX_BATCHED_TOKENS", "--max-num-batched-tokens"),
        ("GPU_UTIL", "--gpu-memory-utilization"),
        ("KV_MEM", "--kv-cache-memory-bytes"),
    ):
        if settings[knob] is not None:
            args += [flag, str(settings[knob])]
    if settings["RAM_CACHE"] is not None:
        # vLLM's native offloading connector takes GiB (config/vllm.py, kv_offloading_size); the planner checked
        # the host has the RAM (memory/host.py).
        args += ["--kv-offloading-size", f"{settings['RAM_CACHE'] / 2**30:g}", "--kv-offloading-backend", "native"]
    if settings["EMBED_ON_HOST"]:
        # vLLM's UVA offloader limited to the embedding's parameters; patch 0065 passes the embedding through
        # it (memory/budget.py takes its bytes off the GPU weights and checks the host RAM).
        args += ["--cpu-offload-gb", str(EMBED_OFFLOAD_CAP_GIB), "--cpu-offload-params", "embed_tokens"]
    spec = speculative_config(settings)
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    if settings["TOOLS"]:
        # "parameter": a forced call (tool_choice named/required) is grammar-held to the tool's JSON schema,
        # not only its <function=NAME> frame (vllm/tool_parsers/structural_tag_registry.py,
        # resolve_tool_strictness); under tool_choice=auto a started call is held to it too. docs/agents.md.
        args += [
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            settings["TOOL_PARSER"],
            "--tool-strict-level",
            "parameter",
        ]
    if settings["REASONING_PARSER"] != "none":
        args += ["--reasoning-parser", settings["REASONING_PARSER"]]
    # 0.32.0 has no server-wide thinking switch; this sets the default a request can still override.
    args += ["--default-chat-template-kwargs", json.dumps({"enable_thinking": bool(settings["THINKING"])})]
    # Agents give up on a silent stream (a long prefill); patch 0022 extends this to /v1/messages and responses.
    args += ["--sse-keep-alive-interval", str(settings["STREAM_KEEPALIVE"])]
    if settings["TEMPERATURE"] is not None:
        args += ["--override-generation-config", json.dumps({"temperature": settings["TEMPERATURE"]})]
    return args


def server_env(settings: Settings, api_key: str | None) -> tuple[dict[str, str], tuple[str, ...]]:
    """Variables set for the server (the key, our patches' switches, passed-through ones) and those removed."""
    env = dict(settings.passthrough_env)
    unset: tuple[str, ...] = ()
    if api_key:
        env["VLLM_API_KEY"] = api_key
    else:
        unset = ("VLLM_API_KEY",)  # an inherited empty or stale value must not half-enable auth
    # Read by patch 0002 (vLLM's auth middleware); always explicit, so an inherited value cannot open /metrics.
    env["HYPERQWEN_METRICS_PUBLIC"] = "1" if settings["METRICS_PUBLIC"] else "0"
    # Read by patch 0023 (a request's effort may switch thinking only when allowed); docs/agents.md.
    env["HYPERQWEN_CLIENT_THINKING"] = "1" if settings["CLIENT_THINKING"] else "0"
    # Read by patch 0040 (engine stall sentinel); docs/troubleshooting.md.
    env["HYPERQWEN_ENGINE_STALL_TIMEOUT"] = str(settings["ENGINE_STALL_TIMEOUT"])
    # Read by patch 0060 (": prefill N/M" stream comments); docs/agents.md.
    env["HYPERQWEN_PREFILL_PROGRESS_INTERVAL"] = str(settings["STREAM_PROGRESS"])
    if settings["HF_TOKEN"]:
        env["HF_TOKEN"] = settings["HF_TOKEN"]

    return env, unset
