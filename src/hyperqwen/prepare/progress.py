"""The progress bar of prepare's long byte loops (download, link/copy, rewrite): tqdm over bytes when wanted
and there is something to count, a no-op otherwise."""

from __future__ import annotations

from typing import Any


class ByteProgress:
    def __init__(self, total: int, enabled: bool, desc: str, *, leave: bool = True) -> None:
        self.bar: Any = None
        if enabled and total:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, leave=leave)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
