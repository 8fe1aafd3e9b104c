"""Settings + the memory decision -> the vLLM server command line and environment. Pure: no I/O, no GPU.

Built once per launch, after the memory step (launch/budget.py) has fixed the context length; what
`hyperqwen serve --print` shows is this object, and the exec runs this object.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePath
from typing import Any

from hyperqwen.config.apikey import exposure_problem, shown_in_clear
from hyperqwen.config.extra_args import argv_value as argv_value  # re-exported: the argv's reader lives in config/
from hyperqwen.config.extra_args import builder_overrides
from hyperqwen.config.keyrule import MASK, mask_assignments
from hyperqwen.config.knobs import EMBED_OFFLOAD_CAP_GIB, STRUCTURED_OUTPUT_CONFIGS
from hyperqwen.config.settings import Problem, Settings, SettingsError, listen_address

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SECRET_ENV = frozenset({"VLLM_API_KEY", "HF_TOKEN"})
# The vLLM flags build_command emits on its own, that no knob's maps_to names (knobs.py): EXTRA_ARGS may not
# override them either. A unit test builds the command over the knobs' choices and proves every flag it emits
# is a knob's or listed here.
BUILDER_FLAGS = ("--enable-prompt-tokens-details", "--tool-strict-level")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def option(flag: str, value: object) -> str:
    """`--flag=value`, one word: vLLM's parser takes everything after the first '=' as the value, so a value
    that looks like an option (`--x.y`, `-h`) can never become one or swallow the next word, as `--flag value`
    lets it (FlexibleArgumentParser rewrites a word `--name.key` into JSON for --name and takes the next word)."""
    return f"{flag}={value}"


@dataclass(frozen=True)
class OwnedValues:
    """What HyperQwen decided for the settings that decide who can reach the server and what it serves; the
    final argv must parse to exactly these (check_command). The key is never on the command line (it goes
    through VLLM_API_KEY), and the server listens on TCP (no Unix socket)."""

    host: str
    port: int
    model: str
    served_model_name: str

    def expected(self) -> dict[str, Any]:
        """vLLM's parsed attribute -> the value it must have."""
        return {
            "host": self.host,
            "port": self.port,
            "model": self.model,
            "served_model_name": [self.served_model_name],
            "api_key": None,
            "uds": None,
            "headless": False,
            "grpc": False,
            "model_tag": None,
        }


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
    owned: OwnedValues | None = None

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
    knobs = settings.knobs
    spec = knobs.spec
    if spec == "mtp":
        return {"method": "mtp", "num_speculative_tokens": knobs.draft_tokens}
    if spec == "dflash2":
        # vLLM recognises a DFlash/DFlash2 drafter by its architecture; the method name is "dflash".
        return {
            "method": "dflash",
            "model": str(settings.under_models_dir(knobs.draft)),
            "num_speculative_tokens": knobs.dflash_tokens,
        }
    if spec == "ngram":
        # Prompt lookup: the last 5..2 tokens are matched in the prompt and earlier output (longest first) and
        # the LOOKUP_TOKENS that followed the match are proposed. vLLM's default is min = max = 5, which misses
        # repeats shorter than 5 tokens (a judgement, not a measurement yet: the CPU test is still to come).
        return {
            "method": "ngram",
            "num_speculative_tokens": knobs.lookup_tokens,
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
            "context_drafter_tokens": knobs.draft_tokens,
        }
    return None


def gdn_prefill_fallback(compute_capability: tuple[int, int] | None, cute_dsl_installed: bool) -> str | None:
    """Why GDN_PREFILL=auto must pick Triton here, or None. vLLM 0.32.0 picks FlashInfer's GDN prefill on
    Hopper and newer (vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py), a kernel that imports
    `cutlass.cute` (nvidia-cutlass-dsl); without that package the engine fails to start (seen on an H200)."""
    if compute_capability is None or compute_capability < (9, 0) or cute_dsl_installed:
        return None
    major, minor = compute_capability
    return (
        f"GDN_PREFILL=auto: Triton GDN prefill on this compute capability {major}.{minor} card, since vLLM's "
        "FlashInfer kernel needs nvidia-cutlass-dsl, which is not installed"
    )


def build_command(
    settings: Settings,
    *,
    max_model_len: int | None = None,
    api_key: str | None,
    listen_host: str | None = None,
    gdn_prefill_fallback: bool = False,
    python: str = sys.executable,
) -> VllmCommand:
    """Settings (+ the decided context length, the API key, the in-container listen address) -> the command.

    max_model_len: what the memory step decided (launch/budget.py); None = as configured (tests, docs).

    api_key: the key clients must send, or None for no key. It goes to vLLM through VLLM_API_KEY,
    never the command line. listen_host: where the server listens when it differs from BIND (inside a
    container it listens on 0.0.0.0 while compose publishes the port on BIND only).
    gdn_prefill_fallback: GDN_PREFILL=auto on a card where vLLM's own pick cannot load (gdn_prefill_fallback()).
    Raises SettingsError when the combination is unsafe (exposed without a key) or EXTRA_ARGS overrides one of
    BUILDER_FLAGS.
    """
    knobs = settings.knobs
    bind = knobs.bind
    refuse_exposed_without_key(settings, api_key)
    overrides = builder_overrides(knobs.extra_args, BUILDER_FLAGS)
    if overrides:
        raise SettingsError([Problem("error", f"EXTRA_ARGS: {message}", "EXTRA_ARGS") for message in overrides])

    value_problems = check_owned_values(settings)
    if value_problems:
        raise SettingsError(value_problems)
    host = listen_host or listen_address(bind)
    kv_dtype = settings.kv_cache_dtype
    model_len = settings.configured_max_model_len if max_model_len is None else max_model_len
    args: list[str] = [
        option("--model", str(settings.model_path)),
        option("--served-model-name", knobs.served_model_name),
        option("--host", host),
        option("--port", knobs.port),
        option("--dtype", knobs.dtype),
        option("--max-model-len", model_len),
        option("--kv-cache-dtype", kv_dtype),
        option("--mamba-ssm-cache-dtype", knobs.state_dtype),
        # Always explicit: recent vLLM turns prefix caching on by default for hybrid models.
        "--enable-prefix-caching" if knobs.prefix_cache else "--no-enable-prefix-caching",
    ]
    args += feature_args(settings)
    gdn_prefill = knobs.gdn_prefill
    if gdn_prefill == "auto" and gdn_prefill_fallback:
        gdn_prefill = "triton"
    if gdn_prefill != "auto":
        args.append(option("--gdn-prefill-backend", gdn_prefill))
    args += list(knobs.extra_args)
    env, unset = server_env(settings, api_key)
    return VllmCommand(
        argv=(python, "-m", VLLM_SERVER_MODULE, *args),
        env=env,
        unset_env=unset,
        problems=settings.problems,
        kv_cache_dtype=kv_dtype,
        max_model_len=model_len,
        owned=OwnedValues(host, knobs.port, str(settings.model_path), knobs.served_model_name),
    )


def refuse_exposed_without_key(settings: Settings, api_key: str | None) -> None:
    """The server may listen beyond this machine only with an API key (config/apikey.py's rule)."""
    problem = exposure_problem(settings, api_key, "the API")
    if problem is not None:
        raise SettingsError([problem])


def feature_args(settings: Settings) -> list[str]:
    """The flags of the knobs that switch features on or off (prefix caching details, TP, offloading,
    speculative decoding, tools, thinking, ...)."""
    knobs = settings.knobs
    args: list[str] = []
    if knobs.prefix_cache:
        # usage.prompt_tokens_details.cached_tokens; /v1/messages reports it as cache_read_input_tokens.
        args.append("--enable-prompt-tokens-details")
    if knobs.tp > 1:
        # One server over TP cards (docs/multi-gpu.md); memory/parallel.py plans one rank's share.
        args.append(option("--tensor-parallel-size", knobs.tp))
    if knobs.scale_out:
        # vllm-router's cache_aware policy renders each request on a replica to match prefixes by token ids
        # (vllm/entrypoints/scale_out/factories.py: without this flag those routes answer 403).
        args.append("--enable-scale-out")
    if not knobs.vision:
        args.append("--language-model-only")
    optional: tuple[tuple[int | float | None, str], ...] = (
        (knobs.max_seqs, "--max-num-seqs"),
        (knobs.max_batched_tokens, "--max-num-batched-tokens"),
        (knobs.gpu_util, "--gpu-memory-utilization"),
        (knobs.kv_mem, "--kv-cache-memory-bytes"),
    )
    for value, flag in optional:
        if value is not None:
            args.append(option(flag, value))
    if knobs.ram_cache is not None:
        # vLLM's native offloading connector takes GiB (config/vllm.py, kv_offloading_size); the planner checked
        # the host has the RAM (memory/host.py).
        args += [
            option("--kv-offloading-size", f"{knobs.ram_cache / 2**30:g}"),
            option("--kv-offloading-backend", "native"),
        ]
    if knobs.embed_on_host:
        # vLLM's UVA offloader limited to the embedding's parameters; patch 0065 passes the embedding through
        # it (memory/budget.py takes its bytes off the GPU weights and checks the host RAM).
        args += [option("--cpu-offload-gb", EMBED_OFFLOAD_CAP_GIB), option("--cpu-offload-params", "embed_tokens")]
    spec = speculative_config(settings)
    if spec is not None:
        args.append(option("--speculative-config", json.dumps(spec, separators=(",", ":"))))
    if knobs.tools:
        # "parameter": a forced call (tool_choice named/required) is grammar-held to the tool's JSON schema,
        # not only its <function=NAME> frame (vllm/tool_parsers/structural_tag_registry.py,
        # resolve_tool_strictness); under tool_choice=auto a started call is held to it too. docs/agents.md.
        args += [
            "--enable-auto-tool-choice",
            option("--tool-call-parser", knobs.tool_parser),
            option("--tool-strict-level", "parameter"),
        ]
    # The structured-output grammar (STRUCTURED_OUTPUT_CONFIGS in config/knobs.py says why compact by default);
    # dotted flags, which vLLM's parser merges into one --structured-outputs-config.
    for key, value in STRUCTURED_OUTPUT_CONFIGS[knobs.structured_output].items():
        args.append(
            option(f"--structured-outputs-config.{key}", value if isinstance(value, str) else json.dumps(value))
        )
    if knobs.reasoning_parser != "none":
        args.append(option("--reasoning-parser", knobs.reasoning_parser))
    # 0.32.0 has no server-wide thinking switch; this sets the default a request can still override.
    args.append(option("--default-chat-template-kwargs", json.dumps({"enable_thinking": bool(knobs.thinking)})))
    # Agents give up on a silent stream (a long prefill); patch 0022 extends this to /v1/messages and responses.
    args.append(option("--sse-keep-alive-interval", knobs.stream_keepalive))
    if knobs.temperature is not None:
        args.append(option("--override-generation-config", json.dumps({"temperature": knobs.temperature})))
    return args


def server_env(settings: Settings, api_key: str | None) -> tuple[dict[str, str], tuple[str, ...]]:
    """Variables set for the server (the key, our patches' switches, passed-through ones) and those removed."""
    knobs = settings.knobs
    env = dict(settings.passthrough_env)
    unset: tuple[str, ...] = ()
    if api_key:
        env["VLLM_API_KEY"] = api_key
    else:
        unset = ("VLLM_API_KEY",)  # an inherited empty or stale value must not half-enable auth
    # Read by patch 0002 (vLLM's auth middleware); always explicit, so an inherited value cannot open /metrics.
    env["HYPERQWEN_METRICS_PUBLIC"] = "1" if knobs.metrics_public else "0"
    # Read by patch 0017 (size limits enforced before the key check and before JSON parsing).
    env["HYPERQWEN_MAX_HEADER_BYTES"] = str(knobs.max_header_bytes)
    env["HYPERQWEN_MAX_BODY_BYTES"] = str(knobs.max_body_bytes)
    # Read by patch 0023 (a request's effort may switch thinking only when allowed); docs/agents.md.
    env["HYPERQWEN_CLIENT_THINKING"] = "1" if knobs.client_thinking else "0"
    # Read by patch 0040 (engine stall sentinel); docs/troubleshooting.md.
    env["HYPERQWEN_ENGINE_STALL_TIMEOUT"] = str(knobs.engine_stall_timeout)
    # Read by patch 0060 (": prefill N/M" stream comments); docs/agents.md.
    env["HYPERQWEN_PREFILL_PROGRESS_INTERVAL"] = str(knobs.stream_progress)
    if knobs.hf_token:
        env["HF_TOKEN"] = knobs.hf_token

    return env, unset


def check_owned_values(settings: Settings) -> list[Problem]:
    """The string knobs that become owned vLLM values, checked before they go on the command line.

    MODEL names a checkpoint directory: an absolute path, or a relative one that stays under MODELS_DIR (no
    `..` part, so MODELS_DIR plus a relative MODEL cannot point the server elsewhere); neither MODEL nor
    SERVED_MODEL_NAME may be empty, start with '-' (an option to any reader who splits on spaces) or hold
    control characters (settings refuse those on input; this guards every other caller)."""
    knobs = settings.knobs
    problems: list[Problem] = []
    for name, configured in (
        ("MODELS_DIR", knobs.models_dir),
        ("MODEL", knobs.model),
        ("SERVED_MODEL_NAME", knobs.served_model_name),
        ("DRAFT", knobs.draft),
    ):
        value = str(configured or "")
        if name == "DRAFT" and not value:
            continue
        shown = value if len(value) <= 60 else value[:57] + "..."
        if not value.strip() or value.startswith("-") or _CONTROL_RE.search(value):
            problems.append(
                Problem(
                    "error",
                    f"{name}={shown!r} is empty, starts with '-' or holds a control character; "
                    f"{'name a directory, e.g. qwen3.8-27b' if name != 'SERVED_MODEL_NAME' else 'use a name such as qwen3.8-27b'}",
                    name,
                )
            )
        elif name in ("MODEL", "DRAFT") and not PurePath(value).is_absolute() and ".." in PurePath(value).parts:
            problems.append(
                Problem(
                    "error",
                    f"{name}={shown!r} climbs out of MODELS_DIR with '..'; give a directory under MODELS_DIR "
                    "(e.g. qwen3.8-27b) or an absolute path",
                    name,
                )
            )
    return problems


@lru_cache(maxsize=1)
def _vllm_parser() -> Any:
    """vLLM's server parser, built once per process (building it takes about a second; importing vLLM more)."""
    from hyperqwen.config.extra_args import vllm_parser

    return vllm_parser()


def parsed_owned_values(vllm_args: Sequence[str], parser: Any | None = None) -> dict[str, Any]:
    """What vLLM's own parser (the one `python -m vllm.entrypoints.openai.api_server` builds) makes of the owned
    settings in `vllm_args`. Imports vLLM. Raises SystemExit/ValueError where vLLM refuses the arguments."""
    parsed = (parser or _vllm_parser()).parse_args(list(vllm_args))
    return {name: getattr(parsed, name, None) for name in OwnedValues("", 0, "", "").expected()}


def _table_owned_values(vllm_args: Sequence[str]) -> dict[str, Any]:
    """The same, read with the committed option table (extra_args.resolve) where vLLM is not importable."""
    from hyperqwen.config.extra_args import resolve

    values: dict[str, Any] = {"api_key": None, "uds": None, "headless": False, "grpc": False, "model_tag": None}
    words = resolve(vllm_args)
    for n, word in enumerate(words):
        if word.kind in ("unknown", "ambiguous", "control"):
            raise ValueError(f"vLLM's parser would refuse word {word.index + 1} {word.shown()!r} ({word.kind})")
        if word.kind == "positional":
            values["model_tag"] = word.text
        if word.kind != "option" or word.dest not in OwnedValues("", 0, "", "").expected():
            continue
        if "=" in word.text:
            value: Any = word.text.split("=", 1)[1]
        elif n + 1 < len(words) and words[n + 1].kind == "value" and words[n + 1].dest == word.dest:
            value = words[n + 1].text
        else:
            value = True
        if word.dest == "port":
            value = int(value) if str(value).isdigit() else value
        elif word.dest == "served_model_name":
            value = [value]
        values[word.dest] = value
    return values


def check_command(command: VllmCommand, parser: Any | None = None) -> list[str]:
    """The whole final argv read as vLLM's parser reads it: every owned setting must come out exactly as
    HyperQwen decided. One message per difference; the key's value is never shown.

    parser None: vLLM's option table (config/vllm_options.json, generated from vLLM's parser; an integration
    test proves both read our argv alike). It takes milliseconds, so `--print`, `--explain` and the start all
    run it and agree. The start also runs the real parser (`check_command_with_vllm`) right before the exec."""
    if command.owned is None:
        return []
    import contextlib
    import io

    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(captured):
            if parser is not None:
                got = parsed_owned_values(command.vllm_args, parser)
            else:
                got = _table_owned_values(command.vllm_args)
    except SystemExit:
        said = [line for line in captured.getvalue().splitlines() if line.strip()]
        message = mask_assignments(said[-1].strip()) if said else "it exits"
        return [f"vLLM's own parser refuses the final command line: {message}"]
    except ValueError as exc:
        return [f"vLLM's own parser refuses the final command line: {mask_assignments(str(exc))}"]
    messages = []
    for name, want in command.owned.expected().items():
        if got.get(name) != want:
            shown = "(set)" if name == "api_key" else repr(got.get(name))[:80]
            messages.append(
                f"the final command line makes vLLM's {name} {shown}, not {want!r} as HyperQwen decided; "
                "something in the settings or EXTRA_ARGS is read as an option"
            )
    return messages


def check_command_with_vllm(command: VllmCommand) -> list[str]:
    """check_command with vLLM's own parser (imports vLLM: seconds), where vLLM is installed; [] elsewhere
    (then nothing could be exec'd anyway)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return []
    return check_command(command, _vllm_parser())
