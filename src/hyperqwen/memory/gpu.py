"""GPU facts: the one place that asks a card (torch.cuda, else nvidia-smi) or names one (`--gpu rtx3090`).

vLLM sizes everything from what CUDA reports (`torch.accelerator.get_memory_info`, i.e. cudaMemGetInfo, in
vllm/utils/mem_utils.py MemorySnapshot.measure), which is less than nvidia-smi's "memory.total": the driver
keeps a slice for itself. So a card's total here is always CUDA's. Every caller (the planner, `serve`,
`verify`, the bench environment block) reads the GPU through this module.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
from dataclasses import dataclass

from hyperqwen.config.sizes import GiB, MiB, SizeError, TiB, parse_size

# Planning limits for --gpu: below 4 GiB not even the CUDA context and a small model fit; above 1 TiB no
# single accelerator exists (an H200 is 141 GB). A typo ("1B", "100000000TiB") is refused, not planned.
MIN_CARD_BYTES = 4 * GiB
MAX_CARD_BYTES = 1 * TiB


class GpuError(ValueError):
    """A GPU description that cannot be planned for; the message is one line naming the input and the fix."""


@dataclass(frozen=True)
class Card:
    """A card model as CUDA reports it. linux_mib: cudaMemGetInfo total on bare-metal Linux.

    wsl2_mib: the same card under WSL2. smi_mib: nvidia-smi's memory.total, for matching a reading.
    source: where the numbers come from (a public log, or how they were derived).
    """

    name: str
    linux_mib: int
    wsl2_mib: int
    smi_mib: int
    source: str


# WSL2's paravirtualised driver keeps about 0.5 GiB more of the card than bare-metal Linux (the 3090
# reference deployment, github.com/syv-ai/qwen38-27b-rtx3090, measured WSL2 at ~0.5 GiB less).
WSL2_LOSS_MIB = 512
# nvidia-smi total minus CUDA total on a 24 GB Ampere card: 24,576 MiB (nvidia-smi) vs 23.56 GiB (vLLM's
# "Free memory on device (22.93/23.56 GiB)", RTX 3090, github.com/wtdcode/vllm-backport/issues/34).
RESERVED_24GB_MIB = 24576 - 24125
# The largest driver reservation measured: an H200, nvidia-smi 143,771 MiB vs torch.cuda.mem_get_info
# 143,156 MiB. Used for a card this table does not know, so an unknown card is never planned too large.
RESERVED_MAX_MIB = 143771 - 143156


def _card(name: str, smi_mib: int, linux_mib: int, source: str) -> Card:
    return Card(name, linux_mib, linux_mib - WSL2_LOSS_MIB, smi_mib, source)


_DERIVED = f"derived: nvidia-smi total minus the RTX 3090's measured {RESERVED_24GB_MIB} MiB driver reservation"

CARDS: dict[str, Card] = {
    "rtx3090": _card(
        "NVIDIA GeForce RTX 3090",
        24576,
        24125,
        "vLLM log 'Free memory on device (22.93/23.56 GiB)', github.com/wtdcode/vllm-backport/issues/34",
    ),
    "rtx3090ti": _card("NVIDIA GeForce RTX 3090 Ti", 24564, 24564 - RESERVED_24GB_MIB, _DERIVED),
    "rtx4090": _card(
        "NVIDIA GeForce RTX 4090",
        24564,
        24564 - RESERVED_24GB_MIB,
        _DERIVED + "; nvidia-smi 24564MiB in github.com/vllm-project/vllm/issues/7553",
    ),
    "a5000": _card("NVIDIA RTX A5000", 24564, 24564 - RESERVED_24GB_MIB, _DERIVED),
    "rtx4080": _card("NVIDIA GeForce RTX 4080", 16376, 16376 - RESERVED_24GB_MIB, _DERIVED),
    "rtx5090": _card(
        "NVIDIA GeForce RTX 5090",
        32607,
        32123,
        "vLLM log 'total_gpu_memory (31.37GiB)', github.com/vllm-project/vllm/issues/14452",
    ),
    "a6000": _card("NVIDIA RTX A6000", 49140, 49140 - RESERVED_24GB_MIB, _DERIVED),
    "h200": _card("NVIDIA H200", 143771, 143156, "measured on an H200: torch.cuda.mem_get_info vs nvidia-smi"),
}


def _card_key(text: str) -> str:
    return text.strip().lower().replace("-", "").replace("_", "").replace(" ", "").replace("geforce", "")


def find_card(text: str) -> Card | None:
    """A card by short name ('rtx3090', '3090', 'RTX-4090') or by nvidia-smi's name; None when unknown."""
    key = _card_key(text)
    for short, card in CARDS.items():
        names = (short, short.removeprefix("rtx"), _card_key(card.name), _card_key(card.name.removeprefix("NVIDIA ")))
        if key in names:
            return card
    return None


@dataclass(frozen=True)
class GpuFacts:
    """What the planner knows about the card before vLLM starts.

    total_bytes: CUDA's total (what vLLM multiplies GPU_UTIL by). free_bytes: free before vLLM creates its
    CUDA context (other programs, a desktop, WSL2 already taken out); the planner subtracts the context.
    """

    total_bytes: int
    free_bytes: int
    name: str = "unknown GPU"
    source: str = "given"

    @classmethod
    def nominal(cls, total_bytes: int, *, reserved_bytes: int = 0, wsl2: bool = False) -> GpuFacts:
        """A card planned without measuring it: free = total - reserved (desktop, other apps) - WSL2's loss."""
        src = f"a {total_bytes / GiB:.2f} GiB card (CUDA total)"
        if wsl2:  # as the card table does: WSL2's driver leaves CUDA a smaller total
            total_bytes = max(total_bytes - WSL2_LOSS_MIB * MiB, 0)
            src += f", WSL2 (-{WSL2_LOSS_MIB} MiB)"
        if reserved_bytes:
            src += f", {reserved_bytes / GiB:.2f} GiB held by other programs"
        return cls(total_bytes, max(total_bytes - reserved_bytes, 0), "planned card", src)

    @classmethod
    def of_card(cls, card: Card, *, reserved_bytes: int = 0, wsl2: bool = False) -> GpuFacts:
        total = (card.wsl2_mib if wsl2 else card.linux_mib) * MiB
        src = f"CUDA total on {'WSL2' if wsl2 else 'Linux'}: {card.source}"
        if reserved_bytes:
            src += f"; {reserved_bytes / GiB:.2f} GiB held by other programs"
        return cls(total, max(total - reserved_bytes, 0), card.name, src)


def parse_gpu(text: str, *, reserved: str | None = None, wsl2: bool = False) -> GpuFacts:
    """`--gpu` text -> GpuFacts: a card name (rtx3090, rtx4090, ...) or a CUDA total size (23.5GiB).

    Raises GpuError (one line) for an unknown name, a non-size, or a size outside [4 GiB, 1 TiB].
    """
    reserved_bytes = 0
    if reserved:
        try:
            reserved_bytes = parse_size(reserved)
        except SizeError as exc:
            raise GpuError(f"--reserved={reserved!r} {exc}") from None
    card = find_card(text)
    if card is not None:
        gpu = GpuFacts.of_card(card, reserved_bytes=reserved_bytes, wsl2=wsl2)
    else:
        try:
            total = parse_size(text)
        except SizeError as exc:
            names = ", ".join(CARDS)
            raise GpuError(f"--gpu={text!r} is neither a card name ({names}) nor a size: it {exc}") from None
        if not MIN_CARD_BYTES <= total <= MAX_CARD_BYTES:
            raise GpuError(
                f"--gpu={text!r} is {total:,} B; a card between 4GiB and 1TiB is expected "
                "(write e.g. 24GiB or a card name such as rtx3090)"
            )
        gpu = GpuFacts.nominal(total, reserved_bytes=reserved_bytes, wsl2=wsl2)
    if reserved_bytes >= gpu.total_bytes:
        raise GpuError(f"--reserved={reserved!r} is not less than the card's {gpu.total_bytes / GiB:.2f} GiB")
    return gpu


# --- reading the real card ----------------------------------------------------------------------------


class GpuQueryError(RuntimeError):
    """nvidia-smi exists but failed or printed something unexpected."""


def nvidia_smi_path() -> str | None:
    return shutil.which("nvidia-smi")


def query_nvidia_smi(
    fields: str, *, exe: str | None = None, units: bool = False, timeout: float = 60
) -> list[list[str]]:
    """Rows of `nvidia-smi --query-gpu=FIELDS --format=csv,noheader[,nounits]`, one list of strings per GPU.

    Raises GpuQueryError when nvidia-smi is missing, fails, or prints a row with the wrong field count.
    """
    exe = exe or nvidia_smi_path()
    if exe is None:
        raise GpuQueryError("nvidia-smi is not on PATH")
    fmt = "csv,noheader" if units else "csv,noheader,nounits"
    try:
        proc = subprocess.run(
            [exe, f"--query-gpu={fields}", f"--format={fmt}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise GpuQueryError(str(exc)) from exc
    if proc.returncode != 0:
        raise GpuQueryError((proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}")
    want = len(fields.split(","))
    rows = []
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",", want - 1)]
        if len(parts) != want:
            raise GpuQueryError(f"unexpected nvidia-smi line {line!r}")
        rows.append(parts)
    return rows


def cuda_total_from_smi(smi_total_mib: int, name: str) -> tuple[int, str]:
    """CUDA's total (bytes) for a card nvidia-smi describes, and how it was obtained."""
    card = find_card(name)
    if card is not None and abs(card.smi_mib - smi_total_mib) <= 64:
        return card.linux_mib * MiB, f"nvidia-smi {smi_total_mib} MiB, CUDA total from the card table ({card.source})"
    total = max(smi_total_mib - RESERVED_MAX_MIB, 0)
    return total * MiB, (
        f"nvidia-smi {smi_total_mib} MiB minus {RESERVED_MAX_MIB} MiB (the largest driver "
        "reservation measured; CUDA reports less than nvidia-smi)"
    )


def read_gpu_facts(device_index: int = 0) -> GpuFacts | None:
    """The card vLLM will see, or None when there is no GPU here.

    nvidia-smi first: it reads free memory without creating a CUDA context in this process (a context
    would count as "used" and be subtracted twice, since the planner adds vLLM's own); its total is turned
    into CUDA's (the card table, else minus the largest reservation measured). Without nvidia-smi,
    torch.cuda.mem_get_info (vLLM's own reading; free then includes this process's context: conservative).
    """
    try:
        rows = query_nvidia_smi("memory.total,memory.free,name", timeout=20)
        smi_total, smi_free, name = rows[device_index]
        total, how = cuda_total_from_smi(int(smi_total), name)
        return GpuFacts(total, min(int(smi_free) * MiB, total), name, how)
    except (GpuQueryError, ValueError, IndexError):
        pass
    try:
        import torch  # deferred: importing torch costs seconds, and the CLI must work without it

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info(device_index)
            return GpuFacts(
                int(total),
                int(free),
                torch.cuda.get_device_name(device_index),
                "torch.cuda.mem_get_info (free includes this process's CUDA context)",
            )
    except Exception:  # noqa: BLE001 - no torch or a broken driver means "no facts", not a crash
        pass
    return None


def compute_capability(device_index: int = 0) -> tuple[int, int] | None:
    """The card's CUDA compute capability (9.0 on Hopper) from nvidia-smi, or None without one."""
    try:
        major, _, minor = query_nvidia_smi("compute_cap", timeout=20)[device_index][0].partition(".")
        return int(major), int(minor or 0)
    except (GpuQueryError, ValueError, IndexError):
        return None


def fraction_that_fits(free_bytes: int, total_bytes: int) -> float:
    """The largest GPU_UTIL (3 decimals) whose request vLLM's startup check accepts with `free_bytes` free."""
    return math.floor(free_bytes / total_bytes * 1000) / 1000 if total_bytes else 0.0


def add_card_argument(
    parser: argparse.ArgumentParser, purpose: str, default_text: str, default: str | None = None
) -> None:
    """The one `--gpu CARD` option every command that plans for a card takes (read with parse_gpu); `purpose`
    and `default_text` say what the card is for and what is planned for without the option."""
    parser.add_argument(
        "--gpu",
        metavar="CARD",
        default=default,
        help=f"{purpose}: a card by name ({', '.join(CARDS)}) or CUDA's total memory as a size, e.g. 23.5GiB "
        f"(GB = 10^9, GiB = 2^30); default: {default_text}",
    )
