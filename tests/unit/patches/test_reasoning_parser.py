"""Patch 0003: streamed and non-streamed answers split reasoning/content the same way (qwen3 parser).

vLLM 0.32.0 serves chat completions through a composed parser (`ParserManager.get_parser`: the `qwen3`
reasoning parser + the `qwen3_coder` tool parser, our server flags). Streaming asks
`is_reasoning_end(prompt_token_ids)` first, so when the chat template already closed an empty think block
everything streams as `content`; the non-streamed `parse()` ignored the prompt and, unless the request said
`enable_thinking: false`, put the whole answer in `reasoning` with `content` null. The tests drive the real
composed parser class exactly as vllm/entrypoints/openai/chat_completion/serving.py does (one parser per
choice; `set_prompt_token_ids` then `parse` for non-streamed; `parse_delta` per generated token for streamed)
with a real byte-level BPE tokenizer carrying the Qwen chat markers as added tokens.
"""

from __future__ import annotations

import itertools

import pytest

pytestmark = pytest.mark.needs_patch("0003-reasoning-nonstream-honours-prompt.patch")

MARKERS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
CORPUS = [
    "The capital of France is Paris. Let me think about the question first.",
    "<function=get_weather> <parameter=city> Paris </parameter> </function>",
    "user assistant system Hi Hello weather city answer reasoning",
] * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer (Qwen's kind) with the ChatML/think/tool markers as single tokens,
    saved as a Hugging Face tokenizer directory and loaded through vLLM's own get_tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from vllm.tokenizers import get_tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    fast.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    out = tmp_path_factory.mktemp("qwen-like-tokenizer")
    fast.save_pretrained(out)
    tok = get_tokenizer(str(out))
    for marker in MARKERS:  # each marker must be one token, as in the real Qwen tokenizer
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
    return tok


@pytest.fixture(scope="module")
def parser_cls(tokenizer):
    from vllm.parser.parser_manager import ParserManager

    cls = ParserManager.get_parser(tool_parser_name="qwen3_coder", reasoning_parser_name="qwen3",
                                   enable_auto_tools=True, tokenizer=tokenizer)
    assert cls is not None
    return cls


def make_request(tools: bool):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    if tools:
        body["tools"] = [{"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    return ChatCompletionRequest(**body)


def non_streamed(parser_cls, tokenizer, kwargs, prompt_ids, text, request):
    parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=kwargs)
    parser.set_prompt_token_ids(prompt_ids)
    output_ids = tokenizer.encode(text, add_special_tokens=False)
    reasoning, content, tool_calls = parser.parse(text, request, enable_auto_tools=True,
                                                  model_output_token_ids=output_ids)
    calls = [(c.name, c.arguments) for c in tool_calls or []]
    return reasoning, (content or None), calls


def streamed(parser_cls, tokenizer, kwargs, prompt_ids, text, request):
    parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=kwargs)
    output_ids = tokenizer.encode(text, add_special_tokens=False)
    reasoning, content, calls = "", "", {}
    for i, token_id in enumerate(output_ids):
        # what the detokenizer hands the server: the text this token adds
        delta_text = tokenizer.decode(output_ids[: i + 1])[len(tokenizer.decode(output_ids[:i])):]
        delta = parser.parse_delta(delta_text, [token_id], request, prompt_token_ids=prompt_ids,
                                   finished=i == len(output_ids) - 1)
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            name, args = calls.get(call.index, ("", ""))
            if call.function is not None:
                name += call.function.name or ""
                args += call.function.arguments or ""
            calls[call.index] = (name, args)
    return (reasoning or None), (content or None), [calls[k] for k in sorted(calls)]


PROMPT_HEAD = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
GENERATION_PROMPT_ENDINGS = {
    "closed-empty-think": "<think>\n\n</think>\n\n",  # what a template writes when thinking is off
    "open-think": "<think>\n",  # thinking on
    "no-think": "",  # a template without think markup
}
THINK_KWARGS = {"absent": {}, "true": {"enable_thinking": True}, "false": {"enable_thinking": False}}
OUTPUTS = {
    "plain": "The capital of France is Paris.",
    "reasoning-then-answer": "Let me think about the question first.\n</think>\n\nThe capital of France is Paris.",
    "tool-call": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    ),
}


@pytest.mark.parametrize(
    ("ending", "thinking", "output"),
    list(itertools.product(GENERATION_PROMPT_ENDINGS, THINK_KWARGS, OUTPUTS)),
)
def test_streamed_and_non_streamed_agree(parser_cls, tokenizer, ending, thinking, output):
    prompt_ids = tokenizer.encode(PROMPT_HEAD + GENERATION_PROMPT_ENDINGS[ending], add_special_tokens=False)
    request = make_request(tools=output == "tool-call")
    args = (parser_cls, tokenizer, THINK_KWARGS[thinking], prompt_ids, OUTPUTS[output], request)
    whole = non_streamed(*args)
    pieces = streamed(*args)
    assert pieces == whole, f"streamed {pieces} != non-streamed {whole}"


@pytest.mark.parametrize("thinking", ["absent", "true"])
def test_closed_empty_think_block_answer_is_content(parser_cls, tokenizer, thinking):
    """The reported case: the template closed the think block, the request did not send enable_thinking:
    false; the answer is content, not reasoning, in both paths."""
    prompt_ids = tokenizer.encode(PROMPT_HEAD + GENERATION_PROMPT_ENDINGS["closed-empty-think"],
                                  add_special_tokens=False)
    request = make_request(tools=False)
    text = OUTPUTS["plain"]
    for run in (non_streamed, streamed):
        reasoning, content, calls = run(parser_cls, tokenizer, THINK_KWARGS[thinking], prompt_ids, text, request)
        assert (reasoning, content, calls) == (None, text, []), run.__name__


def test_open_think_block_still_splits_reasoning(parser_cls, tokenizer):
    """Thinking on: what comes before </think> is reasoning, after it content (the patch leaves this)."""
    prompt_ids = tokenizer.encode(PROMPT_HEAD + GENERATION_PROMPT_ENDINGS["open-think"], add_special_tokens=False)
    request = make_request(tools=False)
    reasoning, content, _ = non_streamed(parser_cls, tokenizer, {}, prompt_ids, OUTPUTS["reasoning-then-answer"],
                                         request)
    assert reasoning.strip() == "Let me think about the question first."
    assert content.strip() == "The capital of France is Paris."


def test_tool_call_after_closed_think_block(parser_cls, tokenizer):
    prompt_ids = tokenizer.encode(PROMPT_HEAD + GENERATION_PROMPT_ENDINGS["closed-empty-think"],
                                  add_special_tokens=False)
    reasoning, content, calls = non_streamed(parser_cls, tokenizer, {}, prompt_ids, OUTPUTS["tool-call"],
                                             make_request(tools=True))
    assert reasoning is None
    assert calls == [("get_weather", '{"city": "Paris"}')]
