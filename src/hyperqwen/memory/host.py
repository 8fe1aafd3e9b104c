"""Host facts for the conversation cache in host RAM (RAM_CACHE -> vLLM's native KV offloading).

vLLM's native offloading connector (config/vllm.py: `--kv-offloading-size` GiB becomes
`cpu_bytes_to_use = size x 2^30`) keeps evicted KV blocks in pinned host memory, which the kernel can
neither swap nor reclaim: asking for more than is available takes the machine, not just the server, down.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hyperqwen.config.sizes import GiB

# What the server process itself holds in host RAM besides the cache (Python, torch, vLLM, tokenizer, the
# checkpoint's page cache while loading): an estimate, not measured here; replace it when you have yours.
SERVER_HOST_BYTES = 4 * GiB


@dataclass(frozen=True)
class HostFacts:
    total_bytes: int
    available_bytes: int
    wsl2: bool = False
    source: str = "given"


def read_host_facts(meminfo: Path = Path("/proc/meminfo"), version: Path = Path("/proc/version")) -> HostFacts | None:
    """MemTotal and MemAvailable from /proc/meminfo (kB), WSL2 from the kernel's version string; None elsewhere."""
    try:
        fields = {}
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                fields[name] = int(parts[0]) * 1024
        wsl2 = "microsoft" in version.read_text().lower() if version.exists() else False
        return HostFacts(fields["MemTotal"], fields["MemAvailable"], wsl2, str(meminfo))
    except (OSError, KeyError, ValueError):
        return None


def pinned_host_problems(pinned_bytes: int, host: HostFacts) -> tuple[list[str], list[str]]:
    """(problems, hints) for EMBED_ON_HOST's pinned embedding table (plus any RAM_CACHE) on this host."""
    room = max(host.available_bytes - SERVER_HOST_BYTES, 0)
    if pinned_bytes <= room:
        return [], []
    return (
        [
            f"EMBED_ON_HOST needs {pinned_bytes / GiB:.1f} GiB of pinned host memory (the embedding table"
            f" plus any RAM_CACHE): {host.available_bytes / GiB:.1f} GiB available, "
            f"{SERVER_HOST_BYTES / GiB:.0f} GiB kept for the server process"
        ],
        ["EMBED_ON_HOST=false, or a smaller RAM_CACHE"],
    )


def ram_cache_problems(ram_cache: int, host: HostFacts, prefix_caching: bool) -> tuple[list[str], list[str]]:
    """(problems, hints) for RAM_CACHE bytes of pinned host memory on this host."""
    problems: list[str] = []
    hints: list[str] = []
    if not prefix_caching:
        problems.append(
            "RAM_CACHE needs PREFIX_CACHE=true: vLLM's offloading connector serves a hybrid (GDN) "
            "model's cache only through prefix-cache hits"
        )
        hints.append("PREFIX_CACHE=true, or leave RAM_CACHE empty")
    room = max(host.available_bytes - SERVER_HOST_BYTES, 0)
    if ram_cache > room:
        largest = room // GiB
        problems.append(
            f"RAM_CACHE={ram_cache / GiB:.1f} GiB of pinned host memory does not fit: {host.available_bytes / GiB:.1f}"
            f" GiB available, {SERVER_HOST_BYTES / GiB:.0f} GiB kept for the server process"
        )
        hints.append(
            f"RAM_CACHE={largest}GiB (the largest whole GiB that fits)" if largest else "leave RAM_CACHE empty"
        )
    if host.wsl2:
        hints.append(
            "under WSL2 the VM gets part of the host's RAM (.wslconfig memory=) and CUDA's pinned memory is "
            "limited there: check that the server starts with this RAM_CACHE"
        )
    return problems, hints
