"""Every command's exit statuses, in one table (docs/design.md shows it). Each status means one thing across
`hyperqwen` and the container entrypoint, so a script can branch on it without knowing which command ran.

Why these numbers: 1 is what Python exits with on an uncaught error, so it is only ever "failed", never a
verdict; 2 is argparse's usage error; 127 is the shell's "command not found"; 128 + N is "killed by signal N".
A unit test (tests/unit/test_exit_codes.py) reads every command module and fails on a bare number it exits with.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    # The command ran and found a problem: a failed check (verify, patches check, knobs --check), a failed
    # bench gate, a prepare step refused (a knob, the source, the hub or the token), a folder init cannot own.
    FAILED = 1
    # Refused before doing anything: usage, a bad knob value or combination, a missing extra, a mode conflict.
    BAD_INPUT = 2
    # `hyperqwen plan` verdicts (memory/budget.py Outcome): fits only with a shorter context, vLLM would refuse
    # to boot, the card would be full after boot.
    PLAN_SHORTER = 3
    PLAN_REFUSES_BOOT = 4
    PLAN_CARD_FULL = 5
    # The file system refused a write (read-only, full, no inodes, permission, name too long): prepare.
    FILESYSTEM = 6
    # The container entrypoint was given something that is neither a mode, a step nor a program on PATH.
    NOT_FOUND = 127
    INTERRUPTED = 130  # Ctrl-C (SIGINT)
    TERMINATED = 143  # SIGTERM (`docker compose down`, `docker stop`)
