"""DRAFT_VOCAB: prepare writes mtp.draft_lm_head / mtp.d2t / mtp_draft_vocab_size (patch 0007's format)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from safetensors import safe_open

from hyperqwen.prepare import draft_vocab as dv
from hyperqwen.prepare.checkpoint import open_checkpoint
from hyperqwen.prepare.errors import PrepareCheckpointError, PrepareError
from hyperqwen.prepare.pipeline import MANIFEST_NAME, prepare
from hyperqwen.prepare.quantize import dequantize
from hyperqwen.prepare.safetensors_io import bf16_to_f32
from hyperqwen.prepare.verify import verify_checkpoint
from support.httpserver import LoopbackServer
from support.tools import require_modules

require_modules("torch", why="checks the drafter head with torch, as vLLM loads it")
import torch  # noqa: E402

VOCAB = 1024  # SyntheticShape().vocab


@pytest.fixture(scope="module")
def bpe_source(pristine_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic checkpoint with a real byte-level BPE tokenizer (vocab 1000 < the model's 1024), trained
    here on the shipped corpus: the synthetic word-level tokenizer maps all prose to <unk>."""
    import shutil

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory = tmp_path_factory.mktemp("bpe") / "source"
    shutil.copytree(pristine_source, directory)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        show_progress=False,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train([str(f) for f in dv.corpus_files(dv.default_corpus_dir())], trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    index = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for name, shard in index.items():
        with safe_open(str(directory / shard), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        # numpy has no bfloat16: keep bf16 tensors as their uint16 bit patterns.
        out[name] = tensor.view(torch.int16).numpy().view("<u2") if tensor.dtype == torch.bfloat16 else tensor.numpy()
    return out


def _source_lm_head(source: Path) -> np.ndarray:
    ckpt = open_checkpoint(source)
    info = ckpt.tensor("lm_head.weight")
    with open(source / ckpt.weight_map["lm_head.weight"], "rb") as handle:
        handle.seek(info.begin)
        raw = np.frombuffer(handle.read(info.nbytes), dtype="<u2").reshape(info.shape)
    return raw


def _ids(tensors: dict[str, np.ndarray]) -> np.ndarray:
    d2t = tensors[dv.D2T]
    return d2t + np.arange(d2t.shape[0])


def _counts_file(path: Path, counts: dict[int, int]) -> Path:
    path.write_text(
        json.dumps({"format": dv.COUNTS_FORMAT, "version": 1, "counts": {str(k): v for k, v in counts.items()}})
    )
    return path


def test_draft_rows_equal_requantized_lm_head_rows_and_d2t_round_trips(bpe_source, models_dir, make_options):
    result = prepare(make_options(bpe_source, models_dir, draft_vocab=64))
    out = result.output_dir
    tensors = _tensors(out)
    ids = _ids(tensors)
    assert ids.shape == (64,) and tensors[dv.D2T].dtype == np.int64
    assert np.all(np.diff(ids) > 0) and 0 <= ids[0] and ids[-1] < VOCAB
    assert 3 in ids  # eos_token_id / pad_token_id named by the synthetic config
    # The rest are the 63 most frequent corpus ids (ties by lower id), counted independently here.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bpe_source / "tokenizer.json"))
    freq: dict[int, int] = {}
    for path in sorted(dv.default_corpus_dir().rglob("*")):
        if path.is_file() and path.name != "README.md":
            for token in tokenizer.encode(path.read_text(encoding="utf-8"), add_special_tokens=False).ids:
                freq[token] = freq.get(token, 0) + 1
    top = sorted((t for t in range(VOCAB) if t != 3), key=lambda t: (-freq.get(t, 0), t))[:63]
    assert ids.tolist() == sorted([3, *top])
    # lm_head is requantized (int8 g128) and the draft head with it: the same bytes as lm_head's rows.
    for suffix in ("weight_packed", "weight_scale"):
        np.testing.assert_array_equal(tensors[f"mtp.draft_lm_head.{suffix}"], tensors[f"lm_head.{suffix}"][ids])
    assert tensors["mtp.draft_lm_head.weight_shape"].tolist() == [64, 256]
    # ... and they dequantize to the original bf16 rows within the int8 bound.
    original = bf16_to_f32(_source_lm_head(bpe_source)[ids])
    scale = bf16_to_f32(tensors["mtp.draft_lm_head.weight_scale"].view("<u2"))
    approx = dequantize(tensors["mtp.draft_lm_head.weight_packed"], scale, (64, 256))
    assert np.linalg.norm(approx - original) / np.linalg.norm(original) < 0.01
    config = json.loads((out / "config.json").read_text())
    assert config["text_config"][dv.CONFIG_KEY] == 64
    assert "mtp.draft_lm_head" in config["quantization_config"]["config_groups"]["hyperqwen_int8_g128"]["targets"]
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["draft_vocab"]["size"] == 64 and manifest["draft_vocab"]["source"] == "corpus"
    assert dv.DRAFT_FILE in manifest["files"]
    assert verify_checkpoint(out).tensors == len(tensors)


def test_unquantized_lm_head_gives_bf16_rows_exactly(pristine_source, models_dir, make_options, monkeypatch):
    # Prepare always requantizes a float lm_head; with the int8 step disabled for lm_head the draft head
    # must hold the source's bf16 rows bit for bit.
    from hyperqwen.prepare import pipeline
    from hyperqwen.prepare.checkpoint import Targets, find_targets

    def no_lm_head(ckpt, quantize_embed):
        t = find_targets(ckpt, quantize_embed)
        return Targets((), t.mtp, t.embed, t.already_quantized)

    monkeypatch.setattr(pipeline, "find_targets", no_lm_head)
    out = prepare(make_options(pristine_source, models_dir, draft_vocab=50)).output_dir
    tensors = _tensors(out)
    ids = _ids(tensors)
    head = tensors["mtp.draft_lm_head.weight"]
    assert head.shape == (50, 256)
    np.testing.assert_array_equal(head.view("<u2"), _source_lm_head(pristine_source)[ids])
    np.testing.assert_array_equal(head.view("<u2"), tensors["lm_head.weight"].view("<u2")[ids])
    verify_checkpoint(out)


def test_ids_file_counts_choose_the_ids_with_ties_by_corpus_then_id(bpe_source, models_dir, make_options, tmp_path):
    counts = {900: 50, 7: 50, 500: 40, 1000: 30, 20: 30, 21: 30}
    options = make_options(
        bpe_source, models_dir, draft_vocab=6, draft_vocab_ids=_counts_file(tmp_path / "ids.json", counts)
    )
    tensors = _tensors(prepare(options).output_dir)
    corpus = dv.count_corpus(bpe_source / "tokenizer.json", dv.default_corpus_dir(), VOCAB)
    # eos 3 is forced; then 7 and 900 (50), 500 (40), then two of {20, 21, 1000} (30): corpus count, then id.
    tied = sorted([20, 21, 1000], key=lambda i: (-corpus[i], i))[:2]
    assert _ids(tensors).tolist() == sorted([3, 7, 900, 500, *tied])


def test_choose_ids_is_deterministic_and_forces_special_ids():
    counts = np.array([5, 9, 9, 1, 0, 9, 2, 0], dtype=np.int64)
    assert dv.choose_ids(counts, 4, forced=[7]).tolist() == [1, 2, 5, 7]
    assert dv.choose_ids(counts, 5, forced=[]).tolist() == [0, 1, 2, 5, 6]
    tie = np.array([0, 0, 0, 0, 0, 1, 0, 0], dtype=np.int64)
    assert dv.choose_ids(counts, 1, forced=[], tie_break=tie).tolist() == [5]


def test_counting_is_deterministic(bpe_source):
    a = dv.count_corpus(bpe_source / "tokenizer.json", dv.default_corpus_dir(), VOCAB)
    b = dv.count_corpus(bpe_source / "tokenizer.json", dv.default_corpus_dir(), VOCAB)
    assert a.sum() > 1000 and np.count_nonzero(a) > 10
    np.testing.assert_array_equal(a, b)


def test_corpus_counts_match_a_plain_tokenizer_loop(bpe_source):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bpe_source / "tokenizer.json"))
    expected = np.zeros(VOCAB, np.int64)
    for path in dv.corpus_files(dv.default_corpus_dir()):
        for token in tokenizer.encode(path.read_text(encoding="utf-8"), add_special_tokens=False).ids:
            expected[token] += 1
    np.testing.assert_array_equal(
        dv.count_corpus(bpe_source / "tokenizer.json", dv.default_corpus_dir(), VOCAB), expected
    )


@pytest.mark.parametrize("n", [VOCAB, VOCAB + 1, 10**6])
def test_n_not_below_the_vocab_is_an_error_naming_the_knob(pristine_source, models_dir, make_options, n):
    with pytest.raises(PrepareError) as info:
        prepare(make_options(pristine_source, models_dir, draft_vocab=n))
    assert info.value.knob == "DRAFT_VOCAB" and f"DRAFT_VOCAB={n}" in str(info.value) and "1023" in str(info.value)
    assert not (models_dir / "qwen3.8-27b").exists()


def test_bad_ids_file_is_an_error_naming_the_knob(pristine_source, models_dir, make_options, tmp_path):
    missing = make_options(pristine_source, models_dir, draft_vocab=8, draft_vocab_ids=tmp_path / "nope.json")
    with pytest.raises(PrepareError, match="DRAFT_VOCAB_IDS=.*does not exist"):
        prepare(missing)
    out_of_range = _counts_file(tmp_path / "ids.json", {VOCAB + 5: 3})
    with pytest.raises(PrepareError, match=f"id {VOCAB + 5}.*vocab_size {VOCAB}") as info:
        prepare(make_options(pristine_source, models_dir, draft_vocab=8, draft_vocab_ids=out_of_range))
    assert info.value.knob == "DRAFT_VOCAB_IDS"
    with pytest.raises(PrepareError, match="DRAFT_VOCAB is 0"):
        make_options(pristine_source, models_dir, draft_vocab_ids=out_of_range)


def test_rerun_is_idempotent_and_toggling_rewrites_only_what_changes(
    pristine_source, models_dir, make_options, tree_bytes
):
    options = make_options(pristine_source, models_dir, draft_vocab=40)
    first = prepare(options)
    before = tree_bytes(first.output_dir)
    again = prepare(options)
    assert not again.changed and tree_bytes(again.output_dir) == before
    bigger = prepare(make_options(pristine_source, models_dir, draft_vocab=41))
    assert sorted(bigger.files_written) == sorted([dv.DRAFT_FILE, "config.json", "model.safetensors.index.json"])
    off = prepare(make_options(pristine_source, models_dir))
    assert dv.DRAFT_FILE not in tree_bytes(off.output_dir)
    assert dv.CONFIG_KEY not in json.loads((off.output_dir / "config.json").read_text())["text_config"]
    verify_checkpoint(off.output_dir)
    back = prepare(options)
    assert tree_bytes(back.output_dir) == before  # byte-identical to the first build


def test_verify_rejects_inconsistent_draft_vocab(pristine_source, models_dir, make_options):
    from safetensors.torch import load_file, save_file

    out = prepare(make_options(pristine_source, models_dir, draft_vocab=16)).output_dir
    broken = load_file(str(out / dv.DRAFT_FILE))
    # Break the strictly-increasing ids: make the map name one id twice.
    ids = broken[dv.D2T] + torch.arange(16)
    ids[5] = ids[4]
    broken[dv.D2T] = ids - torch.arange(16)
    (out / dv.DRAFT_FILE).unlink()  # a hard link may share the inode with nothing, but never write through one
    save_file(broken, str(out / dv.DRAFT_FILE), metadata={"format": "pt"})
    with pytest.raises(PrepareCheckpointError, match="strictly increasing"):
        verify_checkpoint(out)
    config = json.loads((out / "config.json").read_text())
    config["text_config"][dv.CONFIG_KEY] = 17
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(PrepareCheckpointError, match=r"mtp.d2t is I64\[16\], expected I64\[17\]"):
        verify_checkpoint(out)
    del config["text_config"][dv.CONFIG_KEY]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(PrepareCheckpointError, match="has no mtp_draft_vocab_size"):
        verify_checkpoint(out)


def test_single_file_checkpoint_gains_an_index(tmp_path, make_options):
    from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint

    # Like the tiny test model: one model.safetensors and no index. vLLM would load the extra shard anyway
    # (it globs *.safetensors without an index), but verify reads the index, so prepare writes one.
    source = tmp_path / "single"
    write_synthetic_checkpoint(source, SyntheticShape(shards=1))
    (source / "model-00001-of-00001.safetensors").rename(source / "model.safetensors")
    (source / "model.safetensors.index.json").unlink()
    out = prepare(make_options(source, tmp_path / "models", draft_vocab=8)).output_dir
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["lm_head.weight_packed"] == "model.safetensors" and index[dv.D2T] == dv.DRAFT_FILE
    verify_checkpoint(out)
    assert _ids(_tensors(out)).shape == (8,)


# --- recount ----------------------------------------------------------------------------------------------------


class _FakeVllmChat(BaseHTTPRequestHandler):
    """A fake of vLLM's /v1/models and /v1/chat/completions with `return_token_ids` (choices[].token_ids),
    checking the bearer key; answers are deterministic functions of the prompt."""

    api_key = "sk-test-key"
    seen: ClassVar[list[dict]] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {self.api_key}":
            self._send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self):
        if self._authorized() and self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    def do_POST(self):
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        prompt = body["messages"][-1]["content"]
        ids = [len(prompt) % 7, 100 + len(prompt) % 3, 100, 2] if body.get("return_token_ids") else None
        self._send(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "..."},
                        "finish_reason": "stop",
                        "token_ids": ids,
                    }
                ],
            },
        )


@pytest.fixture
def fake_server():
    _FakeVllmChat.seen = []
    with LoopbackServer(_FakeVllmChat) as server:
        yield server.url


def test_recount_fake_server_counts_generated_ids_and_prepare_uses_them(
    fake_server, tmp_path, pristine_source, models_dir, make_options
):
    import argparse

    key_file = tmp_path / "key.txt"
    key_file.write_text(_FakeVllmChat.api_key + "\n")
    out = tmp_path / "ids.json"
    parser = argparse.ArgumentParser()
    dv.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "draft-vocab-recount",
            "--url",
            fake_server,
            "--api-key-file",
            str(key_file),
            "--out",
            str(out),
            "--prompts",
            "5",
            "--max-tokens",
            "16",
        ]
    )
    assert args.func(args) == 0
    data = json.loads(out.read_text())
    assert data["format"] == dv.COUNTS_FORMAT and data["generated_tokens"] == 20 and data["model"] == "tiny"
    expected: dict[int, int] = {}
    for prompt in dv.RECOUNT_PROMPTS[:5]:
        for token in [len(prompt) % 7, 100 + len(prompt) % 3, 100, 2]:
            expected[token] = expected.get(token, 0) + 1
    assert {int(k): v for k, v in data["counts"].items()} == expected
    assert all(b["return_token_ids"] and b["max_tokens"] == 16 and b["temperature"] == 0 for b in _FakeVllmChat.seen)
    n = len(expected) + 1
    tensors = _tensors(
        prepare(make_options(pristine_source, models_dir, draft_vocab=n, draft_vocab_ids=out)).output_dir
    )
    assert _ids(tensors).tolist() == sorted({3, *expected})


def test_recount_fake_server_wrong_key_is_a_clear_error(fake_server, tmp_path, capsys):
    with pytest.raises(PrepareError, match="HTTP 401"):
        dv.recount(fake_server, "wrong", prompts=1, model="tiny")
    with pytest.raises(PrepareError, match="cannot reach"):
        dv.recount("http://127.0.0.1:9", "k", prompts=1, model="tiny", timeout=5)


def test_draft_vocab_knob_reaches_the_options(tmp_path):
    from hyperqwen.prepare.options import PrepareOptions

    assert PrepareOptions.from_env({"MODELS_DIR": str(tmp_path)}).draft_vocab == 0
    assert PrepareOptions.from_env({"MODELS_DIR": str(tmp_path), "DRAFT_VOCAB": "40960"}).draft_vocab == 40960
    with pytest.raises(PrepareError) as info:
        PrepareOptions.from_env({"MODELS_DIR": str(tmp_path), "DRAFT_VOCAB": "-1"})
    assert info.value.knob == "DRAFT_VOCAB"


def test_large_head_fused_kernel_rows_equal_requantized_lm_head_rows(tmp_path, make_options):
    # lm_head >= FUSED_MIN_ELEMENTS goes through the numba kernels (as the real 248,320 x 5,120 head does):
    # the draft rows, quantized block by block, must still be the requantized lm_head's rows byte for byte.
    from hyperqwen.prepare.quantize import FUSED_MIN_ELEMENTS
    from support.synthetic_checkpoint import SyntheticShape, write_synthetic_checkpoint

    shape = SyntheticShape(vocab=FUSED_MIN_ELEMENTS // 256, shards=2)
    write_synthetic_checkpoint(tmp_path / "source", shape)
    out = prepare(make_options(tmp_path / "source", tmp_path / "models", draft_vocab=3000)).output_dir
    tensors = _tensors(out)
    ids = _ids(tensors)
    assert ids.shape == (3000,)
    for suffix in ("weight_packed", "weight_scale"):
        np.testing.assert_array_equal(tensors[f"mtp.draft_lm_head.{suffix}"], tensors[f"lm_head.{suffix}"][ids])
