"""A deterministic OpenAI-compatible streaming server with known ground truth.

Why a fake: the harness's numbers must be checked against a truth we know exactly, which no real engine
gives. The fake behaves like vLLM where the harness looks: SSE chunks in the chat-completions format, a final
usage chunk when `stream_options.include_usage` is set, several tokens per chunk when drafts are accepted
(speculative decoding), and /metrics counters with vLLM's names and labels, exposed by prometheus_client.

Timing model per request: the first chunk (one token, from "prefill") is written TTFT x (1 + jitter) after
the request arrives; then each verify step takes STEP x (1 + jitter) and emits 1 + a tokens, a = accepted
drafts (0..k), drawn from a seeded generator. Every write time is recorded with time.perf_counter
(CLOCK_MONOTONIC on Linux, shared by all processes, so comparable with the harness's clock) and served at
GET /_truth, so the truth is what the server actually did, not what it meant to.

It runs in its own process (python fake_openai.py CONFIG_JSON): a server thread inside the test process
would fight the harness for the GIL and add its own delays to every measurement.

What it answers (`mode`), so the gates can be shown failing and passing:
- "count": the words w0 w1 w2 ... up to max_tokens (the timing tests);
- "junk": random words, different on every request (a broken drafter or batch path);
- "echo": the prompt back (must not pass the needle or any answer check);
- "error": HTTP 500 for every generation request;
- "oracle": the first of `rules` ([regex, template]) that matches the last user message, expanded with the
  match's groups (a correct server, for the answers the tests set up); "count" when none matches.
`send_usage` false drops the usage chunk (a server ignoring stream_options); `tokenize` false removes
/tokenize (a non-vLLM server). Every reply is streamed in the same timing model, one word per token.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest

# Tokens the fake's "chat template" adds to a one-message prompt (usage and /tokenize agree on it).
TEMPLATE_TOKENS = 10


@dataclass
class FakeConfig:
    ttft_s: float = 1.20
    step_s: float = 0.060
    jitter: float = 0.10  # uniform in [-jitter, +jitter] as a fraction, seeded per request
    num_spec_tokens: int = 3
    accept_probs: tuple = (0.8, 0.6, 0.4)  # P(position i accepted | positions before accepted)
    seed: int = 7
    api_key: str = "fake-key-0123456789"
    model: str = "fake-model"
    # Counters as a long-running server would have them before the bench starts.
    baseline_drafts: int = 1000
    baseline_accepted: tuple = (700, 450, 200)
    mode: str = "count"
    rules: list = field(default_factory=list)
    send_usage: bool = True
    tokenize: bool = True
    max_model_len: int = 1 << 20
    environment: dict | None = None  # served at /hyperqwen/environment (with the key) when set


@dataclass
class RequestTruth:
    tag: str
    t_received: float
    t_writes: list = field(default_factory=list)  # time of each output-bearing chunk write
    tokens: int = 0
    steps: int = 0
    accepted_per_pos: list = field(default_factory=list)
    prompt_tokens: int = 0
    t_done: float | None = None

    @property
    def ttft_s(self) -> float:
        return self.t_writes[0] - self.t_received

    @property
    def decode_tok_s(self) -> float:
        return (self.tokens - 1) / (self.t_writes[-1] - self.t_writes[0])


class FakeOpenAIServer:
    def __init__(self, config: FakeConfig):
        self.config = config
        self.truth: dict[str, RequestTruth] = {}
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels,
                              registry=self.registry).labels(config.model, "0")
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels,
                                    registry=self.registry).labels(config.model, "0")
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels,
                                registry=self.registry).labels(config.model, "0")
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                          labels + ["position"], registry=self.registry)
        self.accepted_per_pos = [per_pos.labels(config.model, "0", str(i)) for i in range(config.num_spec_tokens)]
        self.drafts.inc(config.baseline_drafts)
        self.draft_tokens.inc(config.baseline_drafts * config.num_spec_tokens)
        self.accepted.inc(sum(config.baseline_accepted))
        for counter, value in zip(self.accepted_per_pos, config.baseline_accepted):
            counter.inc(value)

    # ---- HTTP --------------------------------------------------------------------------------------
    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.config.api_key}"

    async def models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": self.config.model, "object": "model",
                                                               "max_model_len": self.config.max_model_len}]})

    async def environment(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        if self.config.environment is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response(self.config.environment)

    def reply_words(self, content: str) -> list[str] | None:
        """The reply as word tokens (whitespace kept, so joined they are the reply); None: count mode."""
        mode = self.config.mode
        if mode == "junk":
            rng = random.Random()  # unseeded: a different answer every time, like garbage under load
            return [f"{rng.choice(['lorem', 'ipsum', 'dolor', 'sit', 'amet', '42', 'the'])} "
                    for _ in range(rng.randint(3, 40))]
        if mode == "echo":
            return re.findall(r"\S+\s*", content)
        if mode == "oracle":
            for pattern, template in self.config.rules:
                match = re.search(pattern, content, flags=re.DOTALL)
                if match:
                    return re.findall(r"\S+\s*", match.expand(template)) or [""]
        return None

    async def truth_view(self, request: web.Request) -> web.Response:
        return web.json_response({tag: asdict(t) for tag, t in self.truth.items()})

    async def clock(self, request: web.Request) -> web.Response:
        return web.json_response({"perf_counter": time.perf_counter()})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0-fake"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    async def tokenize(self, request: web.Request) -> web.Response:
        if not self.config.tokenize:
            return web.json_response({"detail": "Not Found"}, status=404)
        body = await request.json()
        if "messages" in body:  # vLLM's chat form: the template adds TEMPLATE_TOKENS
            count = sum(len(m["content"]) for m in body["messages"]) // 4 + TEMPLATE_TOKENS
        else:
            count = max(1, len(body.get("prompt", "")) // 4)
        return web.json_response({"count": count, "tokens": list(range(count)), "max_model_len": 1 << 20})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        t_received = time.perf_counter()
        if not self._authorized(request):
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        body = await request.json()
        if self.config.mode == "error":
            return web.json_response({"error": {"message": "internal error (fake)"}}, status=500)
        content = body["messages"][0]["content"]
        words = self.reply_words(body["messages"][-1]["content"])
        tag = content.splitlines()[0]  # the harness's salt line identifies the request
        rng = random.Random(f"{self.config.seed}:{tag}")
        max_tokens = int(body.get("max_tokens") or 16)
        if words is not None:
            max_tokens = min(max_tokens, len(words))

        def token(i: int) -> str:
            return f"w{i} " if words is None else words[i]

        truth = RequestTruth(tag=tag, t_received=t_received, prompt_tokens=len(content) // 4 + TEMPLATE_TOKENS,
                             accepted_per_pos=[0] * self.config.num_spec_tokens)
        self.truth[tag] = truth
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        def chunk(text: str) -> bytes:
            payload = {"id": "fake", "object": "chat.completion.chunk", "model": self.config.model,
                       "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            return f"data: {json.dumps(payload)}\n\n".encode()

        cfg = self.config
        deadline = t_received + cfg.ttft_s * (1 + rng.uniform(-cfg.jitter, cfg.jitter))
        await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
        truth.t_writes.append(time.perf_counter())
        await response.write(chunk(token(0)))
        truth.tokens = 1
        while truth.tokens < max_tokens:
            accepted = 0
            for prob in cfg.accept_probs[: cfg.num_spec_tokens]:
                if rng.random() < prob:
                    accepted += 1
                else:
                    break
            emitted = min(1 + accepted, max_tokens - truth.tokens)
            deadline += cfg.step_s * (1 + rng.uniform(-cfg.jitter, cfg.jitter))
            await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            # Counters advance like vLLM's: one draft per verify step, accepted tokens by position.
            self.drafts.inc(1)
            self.draft_tokens.inc(cfg.num_spec_tokens)
            self.accepted.inc(accepted)
            for pos in range(accepted):
                self.accepted_per_pos[pos].inc(1)
                truth.accepted_per_pos[pos] += 1
            truth.steps += 1
            truth.t_writes.append(time.perf_counter())
            await response.write(chunk("".join(token(truth.tokens + i) for i in range(emitted))))
            truth.tokens += emitted
        final = {"id": "fake", "object": "chat.completion.chunk", "model": cfg.model,
                 "choices": [{"index": 0, "delta": {},
                              "finish_reason": "length" if words is None or truth.tokens < len(words) else "stop"}]}
        await response.write(f"data: {json.dumps(final)}\n\n".encode())
        if cfg.send_usage and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"id": "fake", "object": "chat.completion.chunk", "model": cfg.model, "choices": [],
                     "usage": {"prompt_tokens": truth.prompt_tokens, "completion_tokens": truth.tokens,
                               "total_tokens": truth.prompt_tokens + truth.tokens}}
            await response.write(f"data: {json.dumps(usage)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        truth.t_done = time.perf_counter()
        await response.write_eof()
        return response

    # ---- lifecycle ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.get("/v1/models", self.models), web.get("/version", self.version),
                        web.get("/metrics", self.metrics), web.post("/tokenize", self.tokenize),
                        web.post("/v1/chat/completions", self.chat), web.get("/_truth", self.truth_view),
                        web.get("/_clock", self.clock), web.get("/hyperqwen/environment", self.environment)])
        return app


async def serve(config: FakeConfig) -> None:
    server = FakeOpenAIServer(config)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    # Serve until the parent closes our stdin (the test ended or died).
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve(FakeConfig(**json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})))
