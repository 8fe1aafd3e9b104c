"""EMBED_ON_HOST: the embedding table leaves the GPU weights for pinned host memory; the planner moves exactly its
bytes into the pool and refuses a host that cannot pin them."""

from __future__ import annotations

from hyperqwen.config.settings import resolve_settings
from hyperqwen.config.sizes import GiB
from hyperqwen.launch.command import build_command
from hyperqwen.memory import Outcome, parse_gpu, plan_memory
from hyperqwen.memory.bundled import load_bundled_checkpoint
from hyperqwen.memory.checkpoint import DTYPE_BYTES, tensor_resident_bytes
from hyperqwen.memory.host import SERVER_HOST_BYTES, HostFacts

HOST = HostFacts(64 * GiB, 48 * GiB, source="test host")


def plan(env, host=HOST, mode="single"):
    return plan_memory(resolve_settings(env, mode=mode), parse_gpu("rtx3090"), host=host)


def test_embedding_bytes_are_the_prepared_int8_table_and_its_scales():
    checkpoint = load_bundled_checkpoint()
    names = sorted(t.name for t in checkpoint.tensors if "embed_tokens" in t.name and not t.name.startswith("mtp."))
    assert names and all(".embed_tokens." in f".{n}" for n in names)
    expected = sum(tensor_resident_bytes(t, 2) for t in checkpoint.tensors if t.name in names)
    table = checkpoint.embedding_bytes(DTYPE_BYTES["bfloat16"])
    assert table == expected
    # int8 group-128 with bf16 scales: one byte per weight plus 2 bytes per 128 weights.
    vocab, hidden = checkpoint.shape.vocab_size, checkpoint.shape.hidden_size
    assert vocab * hidden <= table <= vocab * hidden * (1 + 2 / 128) + 64


def test_pool_grows_by_exactly_the_table():
    checkpoint = load_bundled_checkpoint()
    table = checkpoint.embedding_bytes(DTYPE_BYTES["bfloat16"])
    for mode in ("single", "batch"):
        off, on = plan({}, mode=mode), plan({"EMBED_ON_HOST": "true"}, mode=mode)
        assert on.terms["weights"].value == off.terms["weights"].value - table
        assert on.pool_bytes - off.pool_bytes == table
        assert on.resolved["embed_on_host"].endswith("pinned") and off.resolved["embed_on_host"].startswith("off")


def test_the_largest_context_that_fits_grows():
    """Single mode on a Linux 3090: the largest MAX_LEN one request can use, with the table on the GPU and off it
    (bf16 KV, MTP): 1.2 GiB of pool is ~18.6k more tokens."""
    off, on = plan({}), plan({"EMBED_ON_HOST": "1"})
    assert off.largest_fitting_max_len < on.largest_fitting_max_len
    assert on.largest_fitting_max_len - off.largest_fitting_max_len > 15_000


def test_a_host_that_cannot_pin_the_table_is_refused_with_the_fix():
    table = load_bundled_checkpoint().embedding_bytes(2)
    small = HostFacts(8 * GiB, SERVER_HOST_BYTES + table - 1, source="small host")
    b = plan({"EMBED_ON_HOST": "1"}, host=small)
    assert b.outcome is Outcome.REFUSES_BOOT
    assert any("EMBED_ON_HOST needs" in p for p in b.problems) and "EMBED_ON_HOST=false, or a smaller RAM_CACHE" in b.fix_hints
    assert plan({"EMBED_ON_HOST": "1"}, host=HostFacts(8 * GiB, SERVER_HOST_BYTES + table, source="just")).fits
    # The table and the conversation cache are pinned together.
    both = plan({"EMBED_ON_HOST": "1", "RAM_CACHE": "8GiB"}, host=HostFacts(16 * GiB, SERVER_HOST_BYTES + 8 * GiB))
    assert both.outcome is Outcome.REFUSES_BOOT and any("EMBED_ON_HOST needs" in p for p in both.problems)


def test_argv_names_only_the_embedding_for_the_uva_offloader():
    on = build_command(resolve_settings({"EMBED_ON_HOST": "1"}, mode="single"), api_key=None).argv
    assert "--cpu-offload-params=embed_tokens" in on and "--cpu-offload-gb=4" in on
    off = build_command(resolve_settings({}, mode="single"), api_key=None).argv
    assert not any(word.startswith(("--cpu-offload-gb", "--cpu-offload-params")) for word in off)
