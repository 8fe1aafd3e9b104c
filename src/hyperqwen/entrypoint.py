"""The container's entrypoint: `single | batch | prepare | verify [args] | <any command>`.

`single` and `batch` first run the same checks as `verify.sh` (no live server yet) and refuse to start
the server when one fails, unless SKIP_VERIFY is on.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

from hyperqwen.cli import main as hyperqwen_main
from hyperqwen.config.settings import KNOBS_BY_NAME, parse_value

USAGE = "usage: hyperqwen-entrypoint single|batch|prepare|verify [ARGS...] | COMMAND [ARGS...]"


def _skip_verify() -> bool:
    raw = os.environ.get("SKIP_VERIFY", "").strip()
    if not raw:
        return False
    try:
        return bool(parse_value(KNOBS_BY_NAME["SKIP_VERIFY"], raw))
    except ValueError:
        print(f"hyperqwen: SKIP_VERIFY={raw!r} is not a boolean; use true or false", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["single"]
    command, rest = args[0], args[1:]
    if command in ("single", "batch"):
        if not _skip_verify():
            os.environ["MODE"] = command
            code = hyperqwen_main(["verify"])
            if code != 0:
                print("hyperqwen: verify failed (see FAIL lines above); not starting the server. "
                      "Fix the cause, or set SKIP_VERIFY=true to start anyway.", file=sys.stderr)
                return code
        return hyperqwen_main(["serve", "--mode", command, *rest])
    if command in ("prepare", "verify"):
        return hyperqwen_main([command, *rest])
    if command in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    program = shutil.which(command)
    if program is None:
        print(f"hyperqwen: {command!r} is neither a mode (single, batch), prepare, verify, nor a command on PATH.\n"
              + USAGE, file=sys.stderr)
        return 127
    os.execv(program, [command, *rest])
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
