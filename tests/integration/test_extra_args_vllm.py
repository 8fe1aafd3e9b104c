"""The EXTRA_ARGS check against vLLM 0.32.0's real parser (no server).

1. Regenerating src/hyperqwen/config/vllm_options.json from the installed parser gives the committed file.
2. Differential: for every option string in many spellings (underscores, abbreviations, `=value`, dotted JSON
   keys) the resolver in config/extra_args.py lands on the attribute the real parser sets; when the real parser
   accepts owned options or a stray word, the check refuses them.
"""

from __future__ import annotations

import json
import random

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM 0.32.0 CPU build (installed by scripts/test.py)")

from hyperqwen.config.extra_args import (  # noqa: E402
    OPTIONS_FILE,
    check_with_vllm_parser,
    dests_set_by_vllm,
    option_table,
    owned_dests,
    problems_in,
    resolve,
    table_from_parser,
    vllm_parser,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def parser():
    return vllm_parser()


def test_committed_option_table_is_what_the_installed_parser_gives(parser):
    fresh = json.dumps(table_from_parser(parser, vllm.__version__), indent=1) + "\n"
    assert fresh == OPTIONS_FILE.read_text(encoding="utf-8"), (
        "vllm_options.json is stale: run `python -m hyperqwen.config.extra_args --write` with the pinned vLLM")


def sample_value(action) -> str:
    """A value the real parser's type accepts for `action` (so the parse succeeds and dests can be compared)."""
    if action.choices:
        return str(next(iter(action.choices)))
    name = getattr(action.type, "__name__", "")
    if name in ("loads", "_json_loads") or "json" in name.lower() or "dict" in name.lower():
        return "{}"
    return "1"


def resolved_dests(words: list[str]) -> set[str]:
    table = option_table()
    dests = set()
    positional = False
    for word in resolve(words, table):
        if word.kind in ("option", "value") and word.dest:
            dests.add(word.dest)
        elif word.kind == "positional" and not positional:
            dests.add(table.positionals[0])
            positional = True
    return dests


def spellings(option: str, rng: random.Random) -> list[str]:
    if not option.startswith("--"):
        return [option]
    name = option[2:]
    out = [option, "--" + name.replace("-", "_")]
    for cut in (1, 3, len(name) // 2):
        if cut < len(name):
            out.append(option[: len(option) - cut])
    out.append("--" + "".join(c if rng.random() < 0.5 else c.replace("-", "_") for c in name))
    return out


def test_every_spelling_of_every_option_lands_where_vllm_puts_it(parser):
    rng = random.Random(0)
    actions = {s: a for a in parser._actions for s in a.option_strings}
    compared = mismatched = 0
    failures = []
    for option, action in sorted(actions.items()):
        if action.dest in ("help", "config"):  # --help exits; --config needs a file
            continue
        for spelling in spellings(option, rng):
            words = [spelling] if action.nargs == 0 else [spelling, sample_value(action)]
            try:
                real = dests_set_by_vllm(words, parser)
            except (SystemExit, ValueError, TypeError):
                # vLLM refuses it (ambiguous/unknown spelling, or a value its type rejects): so must we, unless the
                # refusal was only about our sample value.
                ours = resolve(words)
                if ours[0].kind in ("unknown", "ambiguous"):
                    assert problems_in(words), words
                continue
            compared += 1
            if resolved_dests(words) != real:
                mismatched += 1
                failures.append((words, sorted(real), sorted(resolved_dests(words))))
    assert compared > 1000, compared
    assert not failures, failures[:20]


@pytest.mark.parametrize("extra", [
    ["--api_key", "K"], ["--api-ke=K"], ["--api-k", "K"], ["--port=1"], ["--po", "1"], ["--served", "x"],
    ["--speculative_config.method", "mtp"], ["-sc", "{}"], ["--no-enable-prefix"], ["--enforce-eager", "Mtp"],
    ["--max-num-seq", "2"], ["--hf_tok=abc"], ["--host", "0.0.0.0"], ["--model=x"],
])
def test_what_vllm_accepts_but_we_refuse(parser, extra):
    """The real parser takes each of these (so a check on the literal `--api-key` spelling is not enough),
    and both the table-based check and the real-parser check refuse them."""
    try:
        real = dests_set_by_vllm(extra, parser)
    except SystemExit:
        real = set()
    owned = set(owned_dests())
    assert real & (owned | {"model_tag"}) or not real, (extra, real)
    assert problems_in(extra), extra
    if real:
        assert check_with_vllm_parser(extra, parser), extra


def test_accepted_extra_args_parse_cleanly(parser):
    extra = ["--enforce-eager", "--max-log-len", "100", "-O0", "--seed", "-1", "--disable-uvicorn-access-log"]
    assert not problems_in(extra)
    assert not check_with_vllm_parser(extra, parser)
    assert "model_tag" not in dests_set_by_vllm(extra, parser)


@pytest.mark.parametrize("extra, reason", [
    (["--structured-outputs-config.backend", "nonsense"], "Input should be 'auto', 'xgrammar'"),
    (["--max-num-seqs", "abc"], "invalid int value"),
])
def test_what_vllm_refuses_is_reported_with_its_reason_on_one_line(parser, extra, reason):
    """A config vLLM validates with pydantic fails over several lines ending in pydantic's documentation link;
    the message keeps vLLM's reason (argument, field, what is allowed), on one line, without the link."""
    (message,) = check_with_vllm_parser(extra, parser)
    assert reason in message, message
    assert "For further information" not in message and "\n" not in message, message
    assert "nonsense" not in message  # values are masked: a key passed by mistake is never echoed
