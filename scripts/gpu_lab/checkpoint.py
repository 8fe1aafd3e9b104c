"""The lab's model: the full-size synthetic W4A16 checkpoint (tests/support/synthetic_checkpoint.py's FULL
shape, random values) with a tokenizer that covers the whole vocabulary and turns any text into tokens, so
`hyperqwen bench` text workloads run on it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from support.synthetic_checkpoint import FULL, write_synthetic_checkpoint  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# `hyperqwen bench` speaks chat completions; without a template vLLM answers 400 (seen in the first session).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The served context of CTX=huge; the synthetic config's own limit is smaller.
MAX_POSITIONS = 262144


def write_full_vocab_tokenizer(directory: Path, vocab_size: int) -> None:
    """Byte-level BPE without merges: every text is its UTF-8 bytes (ids 0-255), the other ids are filler
    symbols, and Qwen's special tokens take the last ids. Token count = byte count, which the bench's
    prompt-length arithmetic can rely on."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    for i in range(len(vocab), vocab_size - len(SPECIALS)):
        vocab[f"<w{i}>"] = i
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": MAX_POSITIONS, "chat_template": CHATML}, indent=1) + "\n")


def write_lab_checkpoint(directory: Path, shape=FULL) -> None:
    write_synthetic_checkpoint(directory, shape, with_tokenizer=False)
    write_full_vocab_tokenizer(directory, shape.vocab)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["text_config"]["max_position_embeddings"] = MAX_POSITIONS
    config_path.write_text(json.dumps(config, indent=2) + "\n")
