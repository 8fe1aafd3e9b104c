"""GPUS and TP: which cards the replicas get, checked before anything starts. Pure except read_available_gpus."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from hyperqwen.config.settings import Problem

# nvidia-smi names a card by its index ("0") or its UUID ("GPU-1a2b..."); compose's device_ids takes either.
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")


@dataclass(frozen=True)
class Gpu:
    index: str
    uuid: str


def parse_gpu_list(raw: str) -> tuple[tuple[str, ...], list[Problem]]:
    """'0,1,2,3' -> ('0', '1', '2', '3'). Problems name GPUS, the bad entry and the fix; duplicates are refused."""
    problems: list[Problem] = []
    entries = [part.strip() for part in raw.split(",")]
    if not raw.strip() or any(not entry for entry in entries):
        return (), [
            Problem(
                "error",
                f"GPUS={raw!r} has an empty entry; write device indexes or UUIDs separated by commas, e.g. GPUS=0,1",
                "GPUS",
            )
        ]
    for entry in entries:
        if not (entry.isdigit() or _UUID_RE.match(entry)):
            problems.append(
                Problem(
                    "error",
                    f"GPUS={raw!r}: {entry!r} is neither a device index (0, 1, ...) nor a "
                    "UUID from `nvidia-smi -L` (GPU-...)",
                    "GPUS",
                )
            )
    seen: set[str] = set()
    for entry in entries:
        key = str(int(entry)) if entry.isdigit() else entry
        if key in seen:
            problems.append(
                Problem(
                    "error",
                    f"GPUS={raw!r} names device {entry} twice; two servers on one card "
                    "would each plan the whole card's memory and the second fails to load",
                    "GPUS",
                )
            )
        seen.add(key)
    return tuple(str(int(e)) if e.isdigit() else e for e in entries), problems


def check_gpus(gpus: Sequence[str], available: Sequence[Gpu] | None, tp: int) -> list[Problem]:
    """Every named card exists (when the list of cards is known), none twice (an index and its UUID count as
    the same card), and the cards split into groups of TP."""
    problems: list[Problem] = []
    if available is not None:
        by_index = {g.index: g for g in available}
        by_uuid = {g.uuid: g for g in available}
        shown = ", ".join(f"{g.index} ({g.uuid})" for g in available) or "none"
        cards: dict[str, str] = {}
        for entry in gpus:
            gpu = by_index.get(entry) or by_uuid.get(entry)
            if gpu is None:
                problems.append(
                    Problem(
                        "error",
                        f"GPUS names device {entry}, which this machine does not have; `nvidia-smi -L` lists: {shown}",
                        "GPUS",
                    )
                )
            elif gpu.index in cards and cards[gpu.index] != entry:
                problems.append(
                    Problem(
                        "error",
                        f"GPUS names one card twice: {cards[gpu.index]} and {entry} are both device {gpu.index}",
                        "GPUS",
                    )
                )
            elif gpu is not None:
                cards[gpu.index] = entry
    if tp < 1:
        problems.append(Problem("error", f"TP={tp}: tensor parallel size must be 1 or more", "TP"))
    elif len(gpus) % tp:
        problems.append(
            Problem(
                "error",
                f"GPUS lists {len(gpus)} device(s), which do not split into groups of "
                f"TP={tp}; list a multiple of {tp} devices or change TP",
                "TP",
            )
        )
    return problems


def replica_groups(gpus: Sequence[str], tp: int) -> list[tuple[str, ...]]:
    """One replica per consecutive group of TP devices: GPUS=0,1,2,3 TP=2 -> (0, 1), (2, 3)."""
    return [tuple(gpus[i : i + tp]) for i in range(0, len(gpus) - len(gpus) % tp, tp)]


def read_available_gpus() -> list[Gpu] | None:
    """The cards nvidia-smi lists (index, UUID); None when nvidia-smi is missing or fails (nothing to check against)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.strip().splitlines():
        index, _, uuid = (part.strip() for part in line.partition(","))
        if index:
            gpus.append(Gpu(index, uuid))
    return gpus
