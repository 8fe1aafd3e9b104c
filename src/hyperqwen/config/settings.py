"""Resolve knobs from their sources into typed, validated settings.

Precedence, lowest first: the knob's default (knobs.py) < the mode profile (single-user/, batch/) <
a `.env` file < the process environment < the command line. Resolution reads only what it is given
(mappings and the profile files); it never touches the network or the GPU.
"""

from __future__ import annotations

import ipaddress
import math
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from hyperqwen.config.extra_args import check_extra_args
from hyperqwen.config.keyrule import MASK, key_policy_violation, masked, path_problem
from hyperqwen.config.knobs import CTX_PRESETS, KNOBS, KNOBS_BY_NAME, KV_DTYPES, MODE_FOLDERS, MODES, Knob
from hyperqwen.config.names import unknown_names
from hyperqwen.config.sizes import SizeError, parse_size
from hyperqwen.config.spelling import did_you_mean
from hyperqwen.config.values import KnobValues

DEFAULT = "default"
ENV_FILE = ".env"
ENVIRONMENT = "environment"
COMMAND_LINE = "command line"
PLANNER = "memory planner"


def profile_source(mode: str) -> str:
    return f"{mode} profile"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Problem:
    """One finding about the settings. Errors stop the start; warnings are printed and the start goes on."""

    severity: str  # "error" | "warning"
    message: str
    knob: str | None = None

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


class SettingsError(ValueError):
    """Raised when the settings have errors; carries every problem found, not just the first."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class Setting:
    knob: Knob
    value: Any
    source: str
    raw: str | None = None  # the text the user gave, for messages; None for defaults

    @property
    def explicit(self) -> bool:
        """True when the user set it (a .env file, the environment or the command line)."""
        return self.source in (ENV_FILE, ENVIRONMENT, COMMAND_LINE)

    def display(self) -> str:
        """The value as safe to show: secrets masked, never partially."""
        if self.knob.secret:
            return masked(self.value)
        return format_value(self.knob, self.value)


@dataclass(frozen=True)
class Settings(Mapping[str, Any]):
    """Typed knob values for one mode, with where each came from."""

    mode: str
    by_name: Mapping[str, Setting]  # knob name -> its Setting (not `items`: Mapping.items() must stay the method)
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    passthrough_env: Mapping[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.by_name[name].value

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_name)

    def __len__(self) -> int:
        return len(self.by_name)

    def setting(self, name: str) -> Setting:
        return self.by_name[name]

    def with_value(self, name: str, value: Any, source: str) -> Settings:
        """A copy with one knob replaced (e.g. MAX_LEN chosen by the memory planner)."""
        items = dict(self.by_name)
        items[name] = Setting(items[name].knob, value, source)
        return Settings(self.mode, items, self.problems, self.passthrough_env)

    def explicit(self, name: str) -> bool:
        return self.by_name[name].explicit

    @cached_property
    def knobs(self) -> KnobValues:
        """Every knob's value as a typed attribute (config/values.py, generated from the knob table):
        `settings.knobs.spec` is checked by mypy where `settings["SPEC"]` is not. Built once per Settings (its
        values never change; `with_value` makes a new one)."""
        return KnobValues.from_values(self)

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "warning")

    def under_models_dir(self, value: str) -> Path:
        try:
            path = Path(value).expanduser()
        except RuntimeError:  # "~name" for a user that does not exist: a literal folder name, as the shell keeps it
            path = Path(value)
        return path if path.is_absolute() else Path(self.knobs.models_dir) / path

    @property
    def model_path(self) -> Path:
        return self.under_models_dir(self.knobs.model)

    # Typed views the launcher and the memory planner share, so both read a knob the same way.

    @property
    def kv_cache_dtype(self) -> str:
        """vLLM's --kv-cache-dtype: KV when set (batch's profile sets it), else the single-mode CTX preset's."""
        knobs = self.knobs
        if knobs.kv is not None:
            return KV_DTYPES[knobs.kv]
        return KV_DTYPES[CTX_PRESETS[knobs.ctx]["kv"]]

    @property
    def configured_max_model_len(self) -> int:
        """MAX_LEN if set, else the mode profile's, else the CTX preset's (before the memory check)."""
        knobs = self.knobs
        if knobs.max_len is not None:
            return knobs.max_len
        return int(CTX_PRESETS[knobs.ctx]["max_len"])

    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens per step for the SPEC method in use (0 without speculative decoding)."""
        knobs = self.knobs
        return {
            "mtp": knobs.draft_tokens,
            "dflash2": knobs.dflash_tokens,
            "ngram": knobs.lookup_tokens,
            # The verify block: lookup fills up to LOOKUP_TOKENS, the MTP head drafts DRAFT_TOKENS of it.
            "mtp+lookup": max(knobs.draft_tokens, knobs.lookup_tokens),
        }.get(knobs.spec, 0)

    @property
    def draft_path(self) -> Path | None:
        """The DFlash2 drafter directory (DRAFT under MODELS_DIR), or None when unset."""
        draft = self.knobs.draft
        return self.under_models_dir(draft) if draft else None


def format_value(knob: Knob, value: Any) -> str:
    if value is None:
        return ""
    if knob.kind == "bool":
        return "true" if value else "false"
    if knob.kind == "args" and isinstance(value, tuple):  # the words, quoted as a shell would need them
        return shlex.join(value)
    return str(value)


# --- parsing one value ---------------------------------------------------------------------------


class _BadValue(ValueError):
    pass


def parse_value(knob: Knob, raw: str) -> Any:
    """Parse the text a user gave for `knob`. Raises _BadValue with a message saying what is allowed."""
    text = raw.strip()
    if _SURROGATE_RE.search(text):  # an undecodable byte (os.environ's surrogateescape) or a lone surrogate
        raise _BadValue("is not valid UTF-8 text")
    if knob.kind == "args":
        if "\x00" in text:
            raise _BadValue("contains a NUL character")
        try:
            return tuple(shlex.split(text))
        except ValueError as exc:  # unbalanced quotes
            raise _BadValue(f"is not valid shell quoting ({exc})") from None
    if _CONTROL_RE.search(text):
        raise _BadValue("contains a control character (a newline or tab?)")
    if knob.kind == "str":
        return text
    if knob.kind == "bool":
        lowered = text.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise _BadValue("is not a boolean")
    if knob.kind == "choice":
        lowered = text.lower()
        for choice in knob.choices:
            if choice.lower() == lowered:
                return choice
        hint = did_you_mean(text, knob.choices)
        raise _BadValue("is not one of the allowed values" + (f" (did you mean {hint}?)" if hint else ""))
    if knob.kind == "int":
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise _BadValue("is not a whole number (write 65536, not 64k or 6.5e4)")
        digits = text.lstrip("+-").lstrip("0") or "0"
        if len(digits) > 30:  # int() refuses over 4,300 digits; any knob's range is far below 30
            raise _BadValue("is far too large")
        value: float = -int(digits) if text.startswith("-") else int(digits)
    elif knob.kind == "float":
        try:
            value = float(text)
        except ValueError:
            raise _BadValue("is not a number") from None
        if not math.isfinite(value):
            raise _BadValue("is not a finite number")
    elif knob.kind == "bytes":
        try:
            value = parse_size(text)
        except SizeError as exc:
            raise _BadValue(str(exc)) from None
        except ValueError:  # int() refuses a number of over 4,300 digits
            raise _BadValue("is far too large") from None
    else:  # pragma: no cover - a knob kind without a parser is a bug in knobs.py
        raise AssertionError(f"unknown knob kind {knob.kind!r}")
    if knob.min is not None and value < knob.min:
        raise _BadValue("is below the minimum")
    if knob.max is not None and value > knob.max:
        raise _BadValue("is above the maximum")
    return value


# Knobs that name a file or directory (relative ones under MODELS_DIR).
PATH_KNOBS = tuple(
    k.name for k in KNOBS if k.kind == "str" and (k.name.endswith(("_DIR", "_FILE")) or "under MODELS_DIR" in k.doc)
)


# --- profiles -------------------------------------------------------------------------------------


def profile_path(mode: str) -> Path:
    """Where the mode's profile lives: the repo's single-user/ or batch/, or the copy inside the wheel."""
    folder = MODE_FOLDERS[mode]
    packaged = Path(__file__).parent / "_profiles" / f"{mode}.yaml"
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parents[3] / folder / "profile.yaml"


def load_profile(mode: str, path: Path | None = None) -> dict[str, Any]:
    path = path or profile_path(mode)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(
            [
                Problem(
                    "error",
                    f"{path}: the {mode} profile cannot be read ({exc.strerror or exc}); reinstall "
                    "HyperQwen or restore the file from the repository",
                    "MODE",
                )
            ]
        ) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise SettingsError(
            [
                Problem(
                    "error", f"{path}: the {mode} profile is not valid YAML{at}; restore it from the repository", "MODE"
                )
            ]
        ) from None
    if not isinstance(data, dict) or data.get("mode") != mode or not isinstance(data.get("defaults"), dict):
        raise SettingsError([Problem("error", f"{path}: a profile needs `mode: {mode}` and a `defaults:` mapping")])
    return data


def profile_defaults(mode: str, path: Path | None = None) -> dict[str, Any]:
    """The profile's defaults, validated like user input (a typo in a profile is our bug, caught by tests)."""
    defaults: dict[str, Any] = {}
    for name, value in load_profile(mode, path)["defaults"].items():
        knob = KNOBS_BY_NAME.get(name)
        if knob is None:
            raise SettingsError([Problem("error", f"profile {mode}: unknown knob {name!r}", name)])
        raw = format_value(knob, value) if isinstance(value, bool) else str(value)
        try:
            defaults[name] = parse_value(knob, raw)
        except _BadValue as exc:
            raise SettingsError([Problem("error", f"profile {mode}: {name}={value!r} {exc}", name)]) from None
    return defaults


# --- resolution -----------------------------------------------------------------------------------


def resolve_settings(
    environ: Mapping[str, str],
    *,
    mode: str | None = None,
    env_file: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
    env_file_path: Path | None = None,
) -> Settings:
    """Resolve every knob. Pure: reads only its arguments (and the profile files when `profiles` is None).

    environ: the process environment (or what compose passes); env_file: parsed .env values;
    overrides: command-line KNOB=VALUE pairs; mode: the command line's --mode (wins over MODE).
    Raises SettingsError listing every error; warnings are kept on the result.
    """
    env_file = dict(env_file or {})
    overrides = dict(overrides or {})
    problems: list[Problem] = []

    layers: list[tuple[str, Mapping[str, str]]] = [
        (ENV_FILE, env_file),
        (ENVIRONMENT, environ),
        (COMMAND_LINE, overrides),
    ]

    for name in overrides:
        if name not in KNOBS_BY_NAME:
            hint = did_you_mean(name, KNOBS_BY_NAME)
            problems.append(
                Problem(
                    "error",
                    f"--set {name}: not a knob"
                    + (f"; did you mean {hint}?" if hint else "; see docs/knobs.md for the list"),
                    name,
                )
            )

    # The mode decides which profile applies, so it is resolved first.
    if mode is not None:
        overrides["MODE"] = mode
    mode_setting = _resolve_one(KNOBS_BY_NAME["MODE"], None, None, layers, problems)
    chosen_mode = mode_setting.value if mode_setting.value in MODES else KNOBS_BY_NAME["MODE"].default

    if profiles is not None:
        profile_values = dict(profiles.get(chosen_mode, {}))
    else:
        profile_values = profile_defaults(chosen_mode)

    items: dict[str, Setting] = {"MODE": mode_setting}
    for knob in KNOBS:
        if knob.name == "MODE":
            continue
        items[knob.name] = _resolve_one(knob, profile_values.get(knob.name), chosen_mode, layers, problems)

    items["BIND"] = _unbracket(items["BIND"])
    passthrough = {name: value for name, value in env_file.items() if name not in KNOBS_BY_NAME}
    problems.extend(Problem("warning", unknown.message, unknown.guess) for unknown in unknown_names(env_file, environ))

    settings = Settings(chosen_mode, items, tuple(problems), passthrough)
    problems.extend(check_combination(settings))
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise SettingsError(errors + [p for p in problems if p.severity == "warning"])
    return Settings(chosen_mode, items, tuple(problems), passthrough)


def _resolve_one(
    knob: Knob,
    profile_value: Any,
    mode: str | None,
    layers: list[tuple[str, Mapping[str, str]]],
    problems: list[Problem],
) -> Setting:
    setting = Setting(knob, knob.default, DEFAULT)
    if profile_value is not None:
        setting = Setting(knob, profile_value, profile_source(mode or "single"))
    for source, layer in layers:
        raw = layer.get(knob.name)
        if raw is None or raw.strip() == "":
            continue  # empty means unset, as compose passes `${X:-}`
        try:
            setting = Setting(knob, parse_value(knob, raw), source, raw)
        except _BadValue as exc:
            shown = MASK if knob.secret else repr(raw if len(raw) <= 80 else raw[:77] + "...")
            where = {ENV_FILE: "in .env", ENVIRONMENT: "in the environment", COMMAND_LINE: "on the command line"}[
                source
            ]
            problems.append(
                Problem("error", f"{knob.name}={shown} ({where}) {exc}; allowed: {knob.allowed_text()}", knob.name)
            )
    return setting


def check_combination(settings: Settings) -> list[Problem]:
    """Cross-knob checks: contradictions, knobs the mode or method ignores."""
    problems: list[Problem] = []
    knobs = settings.knobs
    mode, spec = settings.mode, knobs.spec

    for name, setting in settings.by_name.items():
        if setting.explicit and mode not in setting.knob.modes:
            other = {"CTX": "in batch mode KV picks the KV dtype and MAX_LEN the context"}
            problems.append(
                Problem(
                    "warning",
                    f"{name} is ignored in {mode} mode: "
                    + other.get(name, f"it applies to {', '.join(setting.knob.modes)} mode"),
                    name,
                )
            )

    ignored_by_spec = {"DRAFT_TOKENS": "mtp", "DFLASH_TOKENS": "dflash2", "DRAFT": "dflash2", "LOOKUP_TOKENS": "ngram"}
    for name, needs in ignored_by_spec.items():
        if settings.explicit(name) and spec != needs and not (spec == "mtp+lookup" and needs in ("mtp", "ngram")):
            what = {
                "mtp": "DRAFT_TOKENS sets the MTP draft count",
                "dflash2": "DFLASH_TOKENS and DRAFT configure DFlash2",
                "ngram": "LOOKUP_TOKENS sets the prompt-lookup block",
            }
            problems.append(
                Problem(
                    "warning",
                    f"{name} has no effect because SPEC={spec}; {what[needs]}, used only with SPEC={needs}"
                    + (" or SPEC=mtp+lookup" if needs in ("mtp", "ngram") else ""),
                    name,
                )
            )
    if settings.explicit("KV_MEM") and settings.explicit("GPU_UTIL"):
        problems.append(
            Problem(
                "warning",
                "KV_MEM and GPU_UTIL are both set: KV_MEM pins the KV pool and "
                "vLLM then does not size the pool from GPU_UTIL",
                "KV_MEM",
            )
        )
    if settings.explicit("TOOL_PARSER") and not knobs.tools:
        problems.append(Problem("warning", "TOOL_PARSER has no effect because TOOLS=false", "TOOL_PARSER"))

    # One key rule everywhere (keyrule.py); the key file is checked when it is read. Paths too long for Linux
    # are refused here, before anything opens them (ENAMETOOLONG).
    if knobs.vllm_api_key:
        violation = key_policy_violation(knobs.vllm_api_key)
        if violation:
            problems.append(
                Problem(
                    "error", f"VLLM_API_KEY ({settings.setting('VLLM_API_KEY').source}): {violation}", "VLLM_API_KEY"
                )
            )
    base_ok = not path_problem(Path(knobs.models_dir))
    # PATH_KNOBS is a list of names, so each path is read by its name.
    for name in PATH_KNOBS:
        if not settings[name] or (name != "MODELS_DIR" and not base_ok):
            continue  # a bad MODELS_DIR is reported once, not again for every path under it
        own = path_problem(Path(settings[name]))
        joined = None if own or name == "MODELS_DIR" else path_problem(settings.under_models_dir(settings[name]))
        if own or joined:
            under = f" (under MODELS_DIR {knobs.models_dir[:60]!r})" if joined else ""
            problems.append(
                Problem(
                    "error",
                    f"{name} ({settings.setting(name).source}){under}: {own or joined}; use a shorter path",
                    name,
                )
            )

    bind = knobs.bind
    if not is_publish_address(bind):
        problems.append(
            Problem(
                "error",
                f"BIND={bind!r} is not an IP address, and docker compose publishes ports only on an IP address "
                "(it refuses host names, localhost included); use 127.0.0.1 (this machine only), ::1, or 0.0.0.0 "
                "(all interfaces)",
                "BIND",
            )
        )

    # EXTRA_ARGS read as vLLM's parser reads it (underscores, abbreviations, dotted JSON keys): see extra_args.py.
    # The flags the argv builder sets on its own are checked where they are declared (launch/command.py).
    extra_raw = settings.setting("EXTRA_ARGS").raw
    for message in check_extra_args(knobs.extra_args, extra_raw):
        problems.append(Problem("error", f"EXTRA_ARGS: {message}", "EXTRA_ARGS"))
    return problems


def is_publish_address(host: str) -> bool:
    """What compose accepts as the host address of a port publish: an IPv4 or IPv6 address (no zone index)."""
    if "%" in host:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _unbracket(setting: Setting) -> Setting:
    """BIND=[::1] as compose reads it in a port publish: the address without its brackets."""
    value = setting.value
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        return Setting(setting.knob, value[1:-1], setting.source, setting.raw)
    return setting


def listen_address(host: str) -> str:
    """BIND as a socket takes it: a bracketed IPv6 address as written in URLs (`[::1]`) without its brackets."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def resolved_addresses(host: str) -> tuple[str, ...]:
    """Every address the OS resolves `host` to (getaddrinfo: the same resolver the server's bind uses, so
    `127.1`, `0x7f.1`, `2130706433` and `localhost` are read exactly as the listening socket reads them).
    Empty when it does not resolve."""
    import socket

    try:
        infos = socket.getaddrinfo(listen_address(host), None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError, ValueError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


def _loopback_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is IPv4 loopback
    return (mapped or ip).is_loopback


# Inside the image every server (vLLM, the monitor, the router gate) listens on all interfaces of the
# container's own network namespace, while BIND stays the host-side publish address compose uses and the
# exposure check looks at. Set by the Dockerfile and compose, never by users.
LISTEN_HOST_ENV = "HYPERQWEN_LISTEN_HOST"


def listen_host(environ: Mapping[str, str], bind: str) -> str:
    """Where a server of ours listens: the image's listen address when set, else BIND."""
    return environ.get(LISTEN_HOST_ENV) or bind


def is_loopback(host: str) -> bool:
    """The one decision whether BIND keeps the API on this machine: every address the OS resolves it to is a
    loopback address. A name that does not resolve, or resolves to any other address, counts as exposed (and
    so needs an API key)."""
    addresses = resolved_addresses(host)
    return bool(addresses) and all(_loopback_address(a) for a in addresses)


def describe_bind(host: str) -> str:
    """BIND as messages name it: the spelling, plus what the OS resolves it to (and whether that is loopback)
    when the spelling is not already that address."""
    addresses = resolved_addresses(host)
    if not addresses:
        return f"{host} (does not resolve to an address here)"
    if list(addresses) == [host]:
        return host
    kind = "loopback" if is_loopback(host) else "not loopback"
    return f"{host} (resolves to {', '.join(addresses)}: {kind})"
