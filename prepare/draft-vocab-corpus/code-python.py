"""Inventory helpers for a small workshop: parts, bins and reorder levels."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path


@dataclasses.dataclass
class Part:
    sku: str
    name: str
    quantity: int
    reorder_at: int = 5

    def needs_reorder(self) -> bool:
        return self.quantity <= self.reorder_at


class Inventory:
    def __init__(self) -> None:
        self._parts: dict[str, Part] = {}
        self._bins: dict[str, list[str]] = defaultdict(list)

    def add(self, part: Part, bin_name: str) -> None:
        if part.sku in self._parts:
            raise ValueError(f"duplicate sku {part.sku!r}")
        self._parts[part.sku] = part
        self._bins[bin_name].append(part.sku)

    def take(self, sku: str, count: int = 1) -> int:
        part = self._parts[sku]
        if count > part.quantity:
            raise ValueError(f"only {part.quantity} of {sku} left, asked for {count}")
        part.quantity -= count
        return part.quantity

    def low_stock(self) -> list[Part]:
        return sorted((p for p in self._parts.values() if p.needs_reorder()), key=lambda p: p.sku)

    def save(self, path: Path) -> None:
        data = {"parts": [dataclasses.asdict(p) for p in self._parts.values()], "bins": self._bins}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "Inventory":
        data = json.loads(path.read_text())
        inventory = cls()
        where = {sku: name for name, skus in data["bins"].items() for sku in skus}
        for item in data["parts"]:
            inventory.add(Part(**item), where.get(item["sku"], "unsorted"))
        return inventory


def fibonacci(n: int) -> list[int]:
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]


async def fetch_all(client, urls: list[str]) -> dict[str, int]:
    results = {}
    for url in urls:
        response = await client.get(url, timeout=10)
        results[url] = response.status_code
    return results


if __name__ == "__main__":
    inv = Inventory()
    inv.add(Part("M3-10", "M3 x 10 mm screw", 120), "A1")
    inv.add(Part("BRG-608", "608 bearing", 4, reorder_at=8), "B2")
    for part in inv.low_stock():
        print(f"reorder {part.name} ({part.sku}): {part.quantity} left")
