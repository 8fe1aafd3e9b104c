"""Which tool-call parser for Qwen3.x, from evidence: the real composed parser fed model text directly (no server).

vLLM 0.32.0 registers `qwen3_coder` and `qwen3_xml` as the same class (vllm/tool_parsers/__init__.py: both map to
`qwen3_engine_tool_parser.Qwen3EngineToolParser`, the parser-engine port of vllm/parser/qwen3.py), so the public
reports of streaming calls broken under `qwen3_coder` and fixed by `qwen3_xml` concern older vLLM releases, where
they were two implementations. Each failure class agents hit gets a case here, streamed token by token and
non-streamed, through the parser the server composes (`ParserManager.get_parser`, qwen3 reasoning + the tool
parser): calls after thinking, a call written inside thinking, several calls in one turn, nested JSON arguments,
long multi-line string arguments with markup in them, and (patch 0021) the whitespace the call grammar allows
around a value.
"""

from __future__ import annotations

import json

import pytest

from support.tools import require_modules

require_modules("vllm", "transformers", why="the parsers under test are the installed vLLM's")

MARKERS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
CORPUS = [
    "The capital of France is Paris. Let me think about the question first.",
    "<function=get_weather> <parameter=city> Paris </parameter> </function> <parameter=edits> [{\"old\": 1}]",
    "def main():\n    print('hello')\n    return 0\n if a < b and c > d: x = {'k': [1, 2]}",
] * 20
PROMPT_HEAD = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
THINKING_OFF = PROMPT_HEAD + "<think>\n\n</think>\n\n"  # what the template writes with enable_thinking false
THINKING_ON = PROMPT_HEAD + "<think>\n"

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {"name": "edit_file", "parameters": {
        "type": "object", "properties": {
            "path": {"type": "string"},
            "edits": {"type": "array", "items": {"type": "object", "properties": {
                "old": {"type": "string"}, "new": {"type": "string"}}}},
            "options": {"type": "object", "properties": {"dry_run": {"type": "boolean"}}}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}},
]


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


LONG_CODE = "\n".join(
    f"def f{i}(a, b):\n    if a < b and b > 0:  # <tag> </parameter-like> text\n        return {{'k': [{i}, \"s\"]}}"
    for i in range(40)
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer with the Qwen chat/think/tool markers as single tokens (Qwen's kind)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from vllm.tokenizers import get_tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=500,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    fast.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    out = tmp_path_factory.mktemp("qwen-like-tokenizer")
    fast.save_pretrained(out)
    return get_tokenizer(str(out))


def parser_class(tokenizer, tool_parser: str):
    from vllm.parser.parser_manager import ParserManager

    return ParserManager.get_parser(tool_parser_name=tool_parser, reasoning_parser_name="qwen3",
                                    enable_auto_tools=True, tokenizer=tokenizer)


def request():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}], tools=TOOLS)


def non_streamed(cls, tokenizer, prompt: str, text: str):
    req = request()
    parser = cls(tokenizer, req.tools, chat_template_kwargs={})
    parser.set_prompt_token_ids(tokenizer.encode(prompt, add_special_tokens=False))
    reasoning, content, calls = parser.parse(text, req, enable_auto_tools=True,
                                             model_output_token_ids=tokenizer.encode(text, add_special_tokens=False))
    return (reasoning or None), (content or None), [(c.name, json.loads(c.arguments)) for c in calls or []]


def streamed(cls, tokenizer, prompt: str, text: str):
    req = request()
    parser = cls(tokenizer, req.tools, chat_template_kwargs={})
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    reasoning, content, calls = "", "", {}
    for i, token_id in enumerate(ids):
        delta_text = tokenizer.decode(ids[: i + 1])[len(tokenizer.decode(ids[:i])):]
        delta = parser.parse_delta(delta_text, [token_id], req, prompt_token_ids=prompt_ids,
                                   finished=i == len(ids) - 1)
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            name, args = calls.get(piece.index, ("", ""))
            if piece.function is not None:
                name += piece.function.name or ""
                args += piece.function.arguments or ""
            calls[piece.index] = (name, args)
    return (reasoning or None), (content or None), [(n, json.loads(a)) for n, a in (calls[k] for k in sorted(calls))]


def test_qwen3_coder_and_qwen3_xml_are_one_parser_in_vllm_0_32():
    from vllm.tool_parsers import ToolParserManager

    coder = ToolParserManager.get_tool_parser("qwen3_coder")
    xml = ToolParserManager.get_tool_parser("qwen3_xml")
    assert coder is xml, (coder, xml)


CASES = {
    "one-call": (THINKING_OFF, call("get_weather", city="Paris", days="3"),
                 None, [("get_weather", {"city": "Paris", "days": 3})]),
    "call-after-thinking": (THINKING_ON, "I should look it up.\n</think>\n\n" + call("get_weather", city="Rome"),
                            "I should look it up.", [("get_weather", {"city": "Rome"})]),
    "several-calls": (THINKING_OFF, call("get_weather", city="Paris") + "\n" + call("get_weather", city="Oslo")
                      + "\n" + call("write_file", path="a.txt", content="x"),
                      None, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"}),
                             ("write_file", {"path": "a.txt", "content": "x"})]),
    "nested-json": (THINKING_OFF, call("edit_file", path="src/m.py",
                                       edits='[{"old": "a < b", "new": "a <= b"}, {"old": "{}", "new": "[]"}]',
                                       options='{"dry_run": true}'),
                    None, [("edit_file", {"path": "src/m.py",
                                          "edits": [{"old": "a < b", "new": "a <= b"}, {"old": "{}", "new": "[]"}],
                                          "options": {"dry_run": True}})]),
    "long-multiline-string": (THINKING_OFF, call("write_file", path="big.py", content=LONG_CODE),
                              None, [("write_file", {"path": "big.py", "content": LONG_CODE})]),
}


@pytest.mark.parametrize("tool_parser", ["qwen3_coder", "qwen3_xml"])
@pytest.mark.parametrize("case", list(CASES))
def test_calls_streamed_and_whole_agree_and_are_exact(tokenizer, tool_parser, case):
    prompt, text, reasoning, calls = CASES[case]
    cls = parser_class(tokenizer, tool_parser)
    whole = non_streamed(cls, tokenizer, prompt, text)
    pieces = streamed(cls, tokenizer, prompt, text)
    assert whole[2] == calls, f"non-streamed calls {whole[2]}"
    assert pieces[2] == calls, f"streamed calls {pieces[2]}"
    for got in (whole, pieces):
        assert (got[0] or "").strip() == (reasoning or ""), got
        assert not (got[1] or "").strip(), f"call markup leaked into content: {got[1]!r}"


def test_call_written_inside_thinking_is_recovered_in_both_paths(tokenizer):
    """Qwen3.x sometimes writes its call before closing </think> (the "tool call lost inside <think>" reports).
    The 0.32.0 parser recovers it as a call in both paths, and its markup leaves neither reasoning nor content."""
    cls = parser_class(tokenizer, "qwen3_coder")
    text = "Let me check. " + call("get_weather", city="Paris")
    results = {run.__name__: run(cls, tokenizer, THINKING_ON, text) for run in (non_streamed, streamed)}
    for name, (reasoning, content, calls) in results.items():
        assert calls == [("get_weather", {"city": "Paris"})], f"{name}: {calls}"
        assert "<function=" not in (reasoning or "") + (content or ""), f"{name}: {reasoning!r} {content!r}"


@pytest.mark.needs_patch("0021-tool-call-grammar-bounded-whitespace.patch")
@pytest.mark.parametrize("run", [non_streamed, streamed], ids=["whole", "stream"])
def test_value_keeps_only_what_the_grammar_held(tokenizer, run):
    """The call grammar (xgrammar qwen_xml style, whitespace bounded to one character by patch 0021) allows one
    whitespace character of any kind on each side of a value, outside the schema-held value: a tab after an enum
    value must not reach the client. Whitespace inside a string value is kept."""
    cls = parser_class(tokenizer, "qwen3_coder")
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\t Paris \n</parameter>\n"
            "<parameter=unit>fahrenheit\t</parameter>\n</function>\n</tool_call>")
    _, _, calls = run(cls, tokenizer, THINKING_OFF, text)
    assert calls == [("get_weather", {"city": " Paris ", "unit": "fahrenheit"})]


@pytest.mark.needs_patch("0021-tool-call-grammar-bounded-whitespace.patch")
def test_call_grammar_bounds_whitespace_runs():
    """Unbounded, the qwen_xml argument grammar let a (random-weight) model spend max_tokens on blank lines."""
    import xgrammar
    from vllm.tool_parsers.structural_tag_registry import TOOL_CALL_MAX_WHITESPACE, get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    tools = request().tools
    tag = get_model_structural_tag("qwen_3_coder", tools, "required", reasoning=False,
                                   strict_level=ToolStrictLevel.PARAMETER)
    grammar = str(xgrammar.Grammar.from_structural_tag(json.dumps(tag.model_dump())))
    assert TOOL_CALL_MAX_WHITESPACE == 1
    # xgrammar writes an unbounded whitespace run as the starred class (as 0.32.0 stock did).
    assert "[ \\n\\r\\t]*" not in grammar, grammar
    assert "<parameter=" in grammar


@pytest.mark.needs_patch("0021-tool-call-grammar-bounded-whitespace.patch")
@pytest.mark.parametrize("run", [non_streamed, streamed], ids=["whole", "stream"])
def test_nested_json_with_a_raw_control_character_still_parses(tokenizer, run):
    """xgrammar's length-bounded JSON string rule let a grammar-held call write a raw control character (\\x0b)
    inside a nested string (seen with the random-weight model); strict JSON parsing then left the whole array a
    string, off its schema. Coerced with json.loads(strict=False), the array arrives as an array."""
    cls = parser_class(tokenizer, "qwen3_coder")
    text = call("edit_file", path="a.py", edits='[\r{"old": "x\x0b","new"\r:"y"}]')
    _, _, calls = run(cls, tokenizer, THINKING_OFF, text)
    assert calls == [("edit_file", {"path": "a.py", "edits": [{"old": "x\x0b", "new": "y"}]})]
