"""Async client for any OpenAI-compatible server, timing streamed chunks as they arrive."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Self

import aiohttp

from hyperqwen.bench.definitions import RequestRecord
from hyperqwen.bench.errors import BenchError, mask_key

__all__ = ["BenchClient", "BenchError", "mask_key", "normalize_base_url"]


def normalize_base_url(url: str) -> str:
    """Accept http://host:port, http://host:port/ or http://host:port/v1; return the server root."""
    if not url or not url.startswith(("http://", "https://")):
        raise BenchError(f"--url must start with http:// or https:// (got {url!r}); e.g. http://127.0.0.1:18020")
    url = url.rstrip("/")
    url = url.removesuffix("/v1")
    return url


def _delta_text(choice: dict) -> tuple[str, str, list]:
    """(content, reasoning, tool_call deltas) of one streamed choice (chat or completions)."""
    if "delta" in choice:
        delta = choice.get("delta") or {}
        content = delta.get("content") or ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        tools = delta.get("tool_calls") or []
        return content, reasoning, tools
    return choice.get("text") or "", "", []


async def _mark_sent(session, context, params) -> None:
    record = (context.trace_request_ctx or {}).get("record") if context.trace_request_ctx else None
    if record is not None:
        record.t_sent = time.perf_counter()


class BenchClient:
    """One aiohttp session (aiohttp: its per-request overhead is small enough not to show in TTFT)."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        model: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 256,
    ):
        self.base_url = normalize_base_url(url)
        self.api_key = api_key
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=30.0)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        # Problems that do not stop a run but change how to read it (e.g. no usage in the stream).
        self.warnings: dict[str, str] = {}
        self.model_card: dict[str, Any] = {}  # the served model's /v1/models entry
        # Every generation request of the run and those that failed: a run whose requests mostly failed
        # must not exit 0 with an all-dash table (the cli turns these into the `requests` gate).
        self.requests_total = 0
        self.requests_failed = 0
        self.first_error: str | None = None
        self.on_request_done: list = []  # callbacks (progress bars), called once per finished request
        self.chat_extra: dict[str, Any] = {}  # sent with every chat request (e.g. chat_template_kwargs)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # created inside the running loop
            # The clock of a request starts when its bytes are handed to the socket (trace events below),
            # not when the coroutine asked to send: with many concurrent streams the harness's own
            # queueing before the write would otherwise be counted as the server's TTFT.
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_mark_sent)
            trace.on_request_chunk_sent.append(_mark_sent)
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                trace_configs=[trace],
                connector=aiohttp.TCPConnector(limit=self._max_connections, force_close=False),
            )
        return self._session

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, path: str) -> str:
        return self.base_url + path

    # ---- plain endpoints -------------------------------------------------------------------------
    async def resolve_model(self) -> str:
        try:
            async with self.session.get(self._url("/v1/models")) as response:
                status, text = response.status, await response.text()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise BenchError(
                f"cannot reach {self.base_url}/v1/models ({type(exc).__name__}: {exc}); is the server up "
                "and --url right?"
            ) from None
        if status == 401:
            raise BenchError(
                f"{self.base_url} answered 401: --api-key (given: {mask_key(self.api_key)}) is wrong or missing"
            )
        if status != 200:
            raise BenchError(f"GET {self.base_url}/v1/models answered {status}: {text[:200]}")
        try:
            data = json.loads(text).get("data") or []
        except (ValueError, AttributeError):
            data = []
        if self.model:
            self.model_card = next((card for card in data if card.get("id") == self.model), {})
            return self.model
        if not data:
            raise BenchError(f"{self.base_url}/v1/models lists no model; pass --model NAME")
        self.model = data[0]["id"]
        self.model_card = data[0]
        return self.model

    @property
    def max_model_len(self) -> int | None:
        """The served context length (vLLM lists max_model_len in /v1/models); None when not said."""
        value = self.model_card.get("max_model_len")
        return int(value) if isinstance(value, int | float) else None

    async def get_text(self, path: str) -> str | None:
        """Body of GET path, or None when the server does not serve it (other engines)."""
        try:
            async with self.session.get(self._url(path)) as response:
                return await response.text() if response.status == 200 else None
        except (TimeoutError, aiohttp.ClientError):
            return None

    async def version(self) -> str | None:
        text = await self.get_text("/version")
        if text is None:
            return None
        try:
            return json.loads(text).get("version")
        except (ValueError, AttributeError):
            return None

    async def metrics_text(self) -> str | None:
        return await self.get_text("/metrics")

    async def count_tokens(self, text: str) -> int | None:
        """Prompt length by the server's /tokenize (vLLM); None when the server has no such route."""
        return await self._tokenize({"prompt": text, "add_special_tokens": False})

    async def count_chat_tokens(self, messages: list[dict]) -> int | None:
        """Length of a chat prompt after the server's chat template (vLLM's /tokenize with messages)."""
        return await self._tokenize({"messages": messages, "add_generation_prompt": True})

    async def _tokenize(self, body: dict) -> int | None:
        try:
            async with self.session.post(self._url("/tokenize"), json={"model": self.model, **body}) as response:
                if response.status != 200:
                    return None
                body = await response.json()
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        return body.get("count", len(body.get("tokens") or []))

    async def warm_up(self, connections: int) -> None:
        """Open `connections` keep-alive connections first, so no request pays a TCP handshake in its TTFT."""

        async def touch() -> None:
            await self.get_text("/v1/models")

        await asyncio.gather(*(touch() for _ in range(max(1, connections))))

    def _count(self, error: str | None) -> None:
        self.requests_total += 1
        if error is not None:
            self.requests_failed += 1
            self.first_error = self.first_error or error
        for callback in self.on_request_done:
            callback()

    async def post_json(self, path: str, payload: dict) -> dict:
        extra = self.chat_extra if path == "/v1/chat/completions" else {}
        payload = {"model": self.model, **extra, **payload}
        try:
            async with self.session.post(self._url(path), json=payload) as response:
                text = await response.text()
                status = response.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._count(f"{type(exc).__name__}: {exc}")
            raise BenchError(f"POST {path} failed: {exc!r}") from None
        if status != 200:
            self._count(f"HTTP {status}: {text[:300]}")
            raise BenchError(f"POST {path} answered {status}: {text[:300]}")
        self._count(None)
        return json.loads(text)

    async def get_json(self, path: str) -> tuple[int, dict | None]:
        """(status, JSON body) of an authenticated GET; (0, None) when the server does not answer."""
        try:
            async with self.session.get(self._url(path)) as response:
                status, text = response.status, await response.text()
        except (TimeoutError, aiohttp.ClientError):
            return 0, None
        try:
            body = json.loads(text)
        except ValueError:
            return status, None
        return status, body if isinstance(body, dict) else None

    # ---- streaming -------------------------------------------------------------------------------
    async def stream(self, path: str, payload: dict[str, Any]) -> RequestRecord:
        """POST a streaming request and time every output-bearing chunk at arrival."""
        payload = {"model": self.model, **payload, "stream": True, "stream_options": {"include_usage": True}}
        # Encode the body before the clock starts: TTFT is the server's and the network's time, not ours.
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        state: dict = {"usage": None, "tools": {}}
        record = RequestRecord(t_sent=time.perf_counter())
        try:
            async with self.session.post(
                self._url(path), data=body, headers=headers, trace_request_ctx={"record": record}
            ) as response:
                if response.status != 200:
                    text = await response.text()
                    record.error = f"HTTP {response.status}: {text[:300]}"
                else:
                    await self._consume(response, record, state)
        except (TimeoutError, aiohttp.ClientError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.t_end = time.perf_counter()
        record.tool_calls = [state["tools"][i] for i in sorted(state["tools"])]
        usage = state["usage"]
        if usage and usage.get("completion_tokens") is not None:
            record.output_tokens = int(usage["completion_tokens"])
            record.prompt_tokens = usage.get("prompt_tokens")
        elif record.error is None:
            await self._count_without_usage(record)
        if record.error is None and record.t_first is None and record.finish_reason is None:
            # A 200 stream that neither carried output nor finished is a failed request.
            record.error = "the stream ended without output or a finish reason"
        self._count(record.error)
        return record

    async def _count_without_usage(self, record: RequestRecord) -> None:
        """No `usage` in the stream (the server ignored stream_options): count the text with the server's
        tokenizer; chunks only as the last resort, since one chunk can carry several tokens."""
        counted = await self.count_tokens(record.reasoning + record.text) if record.text or record.reasoning else 0
        if counted is not None:
            record.output_tokens = counted
            record.output_tokens_source = "tokenize"
            self.warnings.setdefault(
                "no_usage",
                "the server sent no `usage` in the stream (stream_options."
                "include_usage ignored); output tokens were counted with its /tokenize route",
            )
        else:
            record.output_tokens = record.output_chunks
            record.output_tokens_source = "chunks"
            self.warnings["no_usage_no_tokenize"] = (
                "the server sent no `usage` in the stream and has no /tokenize route: output tokens are counted "
                "as chunks, so every token-based number (decode, TPOT, aggregate) is unreliable"
            )

    @staticmethod
    async def _consume(response: aiohttp.ClientResponse, record: RequestRecord, state: dict) -> None:
        # Server-sent events: one "data: {...}" line per chunk, blank lines between.
        async for raw in response.content:
            now = time.perf_counter()
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk and not chunk.get("choices"):
                record.error = json.dumps(chunk["error"])[:300]
                return
            if chunk.get("usage"):
                state["usage"] = chunk["usage"]
            carried = False
            for choice in chunk.get("choices") or []:
                content, reasoning, tools = _delta_text(choice)
                carried = carried or bool(content or reasoning or tools)
                record.text += content
                record.reasoning += reasoning
                for part in tools:
                    slot = state["tools"].setdefault(part.get("index", 0), {"name": "", "arguments": ""})
                    function = part.get("function") or {}
                    slot["name"] += function.get("name") or ""
                    slot["arguments"] += function.get("arguments") or ""
                    if part.get("id"):
                        slot["id"] = part["id"]
                if choice.get("finish_reason"):
                    record.finish_reason = choice["finish_reason"]
            if carried:
                record.output_chunks += 1
                record.chunk_times.append(now)
                if record.t_first is None:
                    record.t_first = now
                record.t_last = now

    async def stream_chat(self, messages: list[dict], max_tokens: int, **params) -> RequestRecord:
        return await self.stream(
            "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, **self.chat_extra, **params}
        )

    async def stream_completion(self, prompt: str, max_tokens: int, **params) -> RequestRecord:
        return await self.stream("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, **params})
