"""Workload data (bench/data in the repository): loading, salting and sizing prompts."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hyperqwen.bench.errors import BenchError

DATA_ENV = "HYPERQWEN_BENCH_DATA"


CHECKOUT_DATA = Path(__file__).resolve().parents[3] / "bench" / "data"
WHEEL_DATA = Path(__file__).resolve().parent / "_data"  # where a wheel build may carry bench/data


def data_dir(override: str | Path | None = None) -> Path:
    """--data-dir, else $HYPERQWEN_BENCH_DATA, else bench/data of this checkout, else the wheel's copy."""
    explicit = override or os.environ.get(DATA_ENV)
    candidates = [Path(explicit)] if explicit else [CHECKOUT_DATA, WHEEL_DATA]
    for path in candidates:
        if (path / "chat_prompts.jsonl").is_file():
            return path
    raise BenchError(
        f"bench data directory {candidates[0]} has no chat_prompts.jsonl; pass --data-dir pointing "
        f"at the repository's bench/data (or set {DATA_ENV})"
    )


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise BenchError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    return rows


def chat_prompts(root: Path) -> list[dict]:
    return read_jsonl(root / "chat_prompts.jsonl")


@dataclass
class Paragraph:
    doc: str
    text: str


def corpus_paragraphs(root: Path) -> list[Paragraph]:
    """Paragraphs of the corpus documents in file-name order (headings kept as their own paragraphs)."""
    paragraphs = []
    files = sorted((root / "corpus").glob("*.md"))
    if not files:
        raise BenchError(f"{root / 'corpus'} holds no *.md documents")
    for path in files:
        for block in path.read_text(encoding="utf-8").split("\n\n"):
            block = block.strip()
            if block:
                paragraphs.append(Paragraph(path.name, block))
    return paragraphs


def salt_line(run_id: str, index: int | str) -> str:
    return f"[bench {run_id} {index}]"


def salted(text: str, run_id: str, index: int | str) -> str:
    return f"{salt_line(run_id, index)}\n{text}"


class TokenCounter:
    """Counts tokens with the server's /tokenize when it has one, else estimates 4 characters per token."""

    def __init__(self, client):
        self.client = client
        self.exact: bool | None = None

    async def count(self, text: str) -> int:
        if self.exact is not False:
            counted = await self.client.count_tokens(text)
            if counted is not None:
                self.exact = True
                return counted
            self.exact = False
        return max(1, len(text) // 4)

    async def chat_overhead(self, content_without_document: str) -> int:
        """Tokens a one-message chat adds around a document: template, salt and instruction."""
        if self.exact is not False:
            counted = await self.client.count_chat_tokens([{"role": "user", "content": content_without_document}])
            if counted is not None:
                return counted
        return await self.count(content_without_document) + 16  # a typical template's share


async def document_of_tokens(
    counter: TokenCounter,
    paragraphs: list[Paragraph],
    target_tokens: int,
    rotate: int = 0,
    seed: int = 0,
    cycle_label: bool = True,
) -> str:
    """Paragraphs of the corpus from paragraph `rotate` on, cycling when the corpus is shorter, cut at a word
    boundary so the text is at most target_tokens long and within a few tokens of it."""
    if target_tokens <= 0:
        raise BenchError(f"target token count must be positive, got {target_tokens}")
    full = "\n\n".join(p.text for p in paragraphs)
    # Tokens per character from a sample, not the whole corpus: the server's /tokenize is bounded by its
    # context like a prompt, and the corpus can be longer than a small server's context.
    sample = full[:6000]
    per_char = await counter.count(sample) / max(1, len(sample))
    chosen: list[str] = []
    used_chars = 0
    index = rotate % len(paragraphs)
    cycle = 0
    while used_chars * per_char < target_tokens:
        if index == 0 and chosen and cycle_label:
            cycle += 1
            chosen.append(f"(Collection, part {cycle + 1})")
        chosen.append(paragraphs[index].text)
        used_chars += len(paragraphs[index].text) + 2
        index = (index + 1) % len(paragraphs)
    text = "\n\n".join(chosen)
    actual = await counter.count(text)
    if actual <= target_tokens:
        return text
    # Over target: cut at a word boundary, binary search on the length with the real count.
    low, high = int(len(text) * target_tokens / actual * 0.9), len(text)
    for _ in range(14):
        if high - low <= 8:
            break
        middle = (low + high) // 2
        if await counter.count(text[:middle].rsplit(" ", 1)[0]) <= target_tokens:
            low = middle
        else:
            high = middle
    return text[:low].rsplit(" ", 1)[0]
