"""Where the API key comes from, and the one rule every key must pass. The key is returned to the caller and
never printed or logged; messages say where a key came from and what is wrong with it, never what it is.

The rule (the same for the environment, `.env`, `--set` and the key file): at least MIN_KEY_LENGTH
characters, each one printable ASCII other than a space (0x21-0x7e). Why:
- every client must be able to send it: HTTP header values are Latin-1 on the wire, and the openai SDK
  raises UnicodeEncodeError on a full-width character, so a non-ASCII key locks out every client;
- the server compares `Authorization: Bearer KEY` after the first space, and the key file is read as one
  word, so spaces and control characters cannot round-trip;
- 16 characters is the floor Ollama-style "long random token" advice rounds to; `openssl rand -hex 16`
  gives 32 hex characters (128 bits), the documented way to make one.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from hyperqwen.config.keyrule import MAKE_KEY, key_policy_violation, path_problem
from hyperqwen.config.names import ENV_FAMILIES
from hyperqwen.config.settings import Problem, Settings, SettingsError, describe_bind, is_loopback


def _shown(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else text[:60] + "..." + text[-40:]


@dataclass(frozen=True)
class ApiKey:
    """A key and where it came from. `repr` never shows the key."""

    value: str
    source: str  # e.g. "VLLM_API_KEY (environment)" or "API_KEY_FILE /models/api_key.txt"

    def __repr__(self) -> str:
        return f"ApiKey(source={self.source!r})"


def key_file_path(settings: Settings) -> Path:
    return settings.under_models_dir(settings.knobs.api_key_file)


def load_api_key(settings: Settings) -> ApiKey | None:
    """VLLM_API_KEY if set, else the first line of API_KEY_FILE (relative: under MODELS_DIR) if it exists.

    Raises SettingsError (one line, naming the knob and the file, never the key) when the key breaks the rule
    or the file cannot be read."""
    key = settings.knobs.vllm_api_key
    if key:
        setting = settings.setting("VLLM_API_KEY")
        problem = key_policy_violation(key)
        if problem:
            raise SettingsError([Problem("error", f"VLLM_API_KEY ({setting.source}): {problem}", "VLLM_API_KEY")])
        return ApiKey(key, f"VLLM_API_KEY ({setting.source})")
    path = key_file_path(settings)
    too_long = path_problem(path)
    if too_long:
        raise SettingsError(
            [
                Problem(
                    "error",
                    f"API_KEY_FILE {_shown(path)}: {too_long}; point API_KEY_FILE (or MODELS_DIR) at a shorter path",
                    "API_KEY_FILE",
                )
            ]
        )
    try:
        if not path.exists():
            return None
        lines = path.read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = errno.errorcode.get(getattr(exc, "errno", None) or 0, type(exc).__name__)
        raise SettingsError(
            [
                Problem(
                    "error",
                    f"API_KEY_FILE {_shown(path)}: cannot read it ({reason}); fix its "
                    "permissions or point API_KEY_FILE elsewhere",
                    "API_KEY_FILE",
                )
            ]
        ) from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise SettingsError(
            [
                Problem(
                    "error",
                    f"API_KEY_FILE {_shown(path)} is empty; write a key into it with `{MAKE_KEY}` or delete the file",
                    "API_KEY_FILE",
                )
            ]
        )
    problem = key_policy_violation(key)
    if problem:
        raise SettingsError([Problem("error", f"API_KEY_FILE {_shown(path)}: {problem}", "API_KEY_FILE")])
    return ApiKey(key, f"API_KEY_FILE {_shown(path)}")


def read_api_key(settings: Settings) -> str | None:
    """The key clients must send, or None for no key (see load_api_key)."""
    key = load_api_key(settings)
    return key.value if key else None


def describe_api_key(settings: Settings) -> str:
    """Where the key comes from, for `--explain`: the source and the file path, never the key."""
    try:
        key = load_api_key(settings)
    except SettingsError as exc:
        return "refused: " + "; ".join(p.message for p in exc.problems)
    if key is None:
        return f"none (VLLM_API_KEY unset and no file at {_shown(key_file_path(settings))})"
    return f"set, from {key.source}"


def exposure_problem(settings: Settings, api_key: str | None, what: str, bind: str | None = None) -> Problem | None:
    """The one exposure rule of every server we start (vLLM, the monitor, the router gate): listening beyond
    this machine (BIND, or the command's own bind flag, not loopback) needs an API key. `what` names the server
    in the message."""
    knobs = settings.knobs
    bind = bind or knobs.bind
    if is_loopback(bind) or api_key:
        return None
    return Problem(
        "error",
        f"BIND={describe_bind(bind)} exposes {what} beyond this machine, but no API key is set. Create one with\n"
        f"    {MAKE_KEY}\n"
        f"(read from API_KEY_FILE, now {knobs.api_key_file!r} under MODELS_DIR) or set VLLM_API_KEY; "
        "or keep BIND=127.0.0.1.",
        "BIND",
    )


# --- what may be shown in clear ---------------------------------------------------------------------------

# A variable whose name contains one of these is a secret, whatever program it belongs to
# (HUGGING_FACE_HUB_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, PGPASSWORD, ...).
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
# The families whose values are shown in clear: one table with the passthrough families (names.py).
NON_SECRET_PREFIXES = tuple(prefix for prefix, clear in ENV_FAMILIES.items() if clear)


def is_secret_name(name: str) -> bool:
    """True for a name that holds, or probably was meant to hold, a secret: it contains a secret word, or it is
    a near miss of a secret knob (VLLM_API_KY, HF_TOKN)."""
    from hyperqwen.config.knobs import KNOBS
    from hyperqwen.config.spelling import did_you_mean

    upper = name.upper()
    if any(word in upper for word in SECRET_WORDS):
        return True
    return did_you_mean(upper, [k.name for k in KNOBS if k.secret]) is not None


def shown_in_clear(name: str) -> bool:
    """Whether a passed-through variable's value may be printed: a known settings family and not secret."""
    return not is_secret_name(name) and name.upper().startswith(NON_SECRET_PREFIXES)
