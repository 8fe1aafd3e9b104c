"""Where the API key comes from. The key is returned to the caller and never printed or logged."""

from __future__ import annotations

from hyperqwen.config.settings import Problem, Settings, SettingsError


def read_api_key(settings: Settings) -> str | None:
    """VLLM_API_KEY if set, else the first line of API_KEY_FILE (relative: under MODELS_DIR) if it exists."""
    if settings["VLLM_API_KEY"]:
        return settings["VLLM_API_KEY"]
    path = settings.under_models_dir(settings["API_KEY_FILE"])
    if not path.exists():
        return None
    try:
        lines = path.read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError([Problem("error", f"API_KEY_FILE {path}: cannot read it ({type(exc).__name__}); "
                                     "fix its permissions or point API_KEY_FILE elsewhere", "API_KEY_FILE")]) from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise SettingsError([Problem("error", f"API_KEY_FILE {path} is empty; write a key into it with "
                                     "`openssl rand -hex 24 > models/api_key.txt` or delete the file", "API_KEY_FILE")])
    if any(ch.isspace() for ch in key) or len(key) < 16:
        raise SettingsError([Problem("error", f"API_KEY_FILE {path}: the key must be one word of at least 16 "
                                     "characters; `openssl rand -hex 24` makes a good one", "API_KEY_FILE")])
    return key
