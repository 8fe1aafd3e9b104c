"""compose.replicas.yaml: one `replica-N` service per group of TP cards, and the router's list of them.

Compose cannot loop over a list, so `hyperqwen replicas` writes this override next to compose.yaml; every
replica `extends` compose.yaml's `replica` template (its settings stay in one place) and only its cards, its
name and its tensor parallel size differ. Put `COMPOSE_FILE=compose.yaml:compose.replicas.yaml` in .env and
`docker compose --profile replicas up -d` starts prepare (once), the replicas and the router.
"""

from __future__ import annotations

from collections.abc import Sequence

OVERRIDE_FILE = "compose.replicas.yaml"
HEADER = "# Written by `hyperqwen replicas` (docs/multi-gpu.md); edit GPUS/TP and run it again rather than this file.\n"


def replica_name(index: int) -> str:
    return f"replica-{index}"


def render_override(groups: Sequence[Sequence[str]], *, tp: int, port: int) -> str:
    """The override's YAML text (written by hand: stable, reviewable output with no YAML library quirks)."""
    lines = [HEADER.rstrip("\n"), f"# GPUS={','.join(g for group in groups for g in group)} TP={tp}", "services:"]
    for index, group in enumerate(groups):
        ids = ", ".join(f'"{gpu}"' for gpu in group)
        lines += [
            f"  {replica_name(index)}:",
            "    extends: {file: compose.yaml, service: replica}",
            "    profiles: !override [replicas]",
            "    environment:",
            f'      TP: "{tp}"',
            f"      HYPERQWEN_GPU_LOCK: /cache/locks/gpu-{group[0]}",
            "    deploy:",
            "      resources:",
            "        reservations:",
            "          devices: !override",
            f"            - {{driver: nvidia, device_ids: [{ids}], capabilities: [gpu]}}",
        ]
    urls = " ".join(f"http://{replica_name(i)}:{port}" for i in range(len(groups)))
    # The monitor page of the replicas profile: every replica on one page (`?replica=N` picks the charts).
    lines += [
        "  replicas-monitor:",
        "    extends: {file: compose.yaml, service: monitor}",
        "    profiles: !override [replicas]",
        f'    command: !override ["hyperqwen", "monitor", "--upstream", "{urls.replace(" ", ",")}"]',
    ]
    lines += ["  router:", "    environment:", f'      HYPERQWEN_REPLICA_URLS: "{urls}"', "    depends_on:"]
    for index in range(len(groups)):
        # Healthy, not started: the router waits for its workers anyway, and a replica's first boot compiles.
        lines += [f"      {replica_name(index)}:", "        condition: service_healthy"]
    return "\n".join(lines) + "\n"
