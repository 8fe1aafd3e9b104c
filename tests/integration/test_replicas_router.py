"""Two real vLLM CPU servers (SmolLM2) behind the real vllm-router binary, started by `hyperqwen router`.

This is the replicas profile without Docker, and also the multi-host setup of docs/multi-gpu.md: the router
is pointed at the servers by URL (ROUTER_WORKERS), exactly as it would be at servers on other hosts.
Both servers share one API key, as replicas reading the same api_key.txt do. The test that kills a replica
runs last in this module.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

# SCALE_OUT: as the compose replica template sets it (the cache_aware policy renders requests on the replicas).
SMOL_KNOBS = {"DTYPE": "float32", "SPEC": "none", "PREFIX_CACHE": "1", "SCALE_OUT": "1"}
ROUTER_BIN = Path(sys.executable).with_name("vllm-router")

pytestmark = pytest.mark.skipif(not ROUTER_BIN.exists(), reason="vllm-router is not installed in this venv "
                                "(pip install vllm-router==0.1.17; scripts/test.py installs it)")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Front:
    url: str
    router_url: str  # vllm-router itself, on loopback: what the gate hides
    api_key: str
    process: subprocess.Popen
    log_path: Path

    def openai(self, key: str | None = None):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or self.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def replicas(server_factory):
    key = "hq-test-" + secrets.token_hex(16)
    with ExitStack() as stack:
        # One after the other: two servers starting at once on 2 cores take longer than two in a row.
        first = stack.enter_context(server_factory("replica-0", "smollm2", SMOL_KNOBS, api_key=key))
        second = stack.enter_context(server_factory("replica-1", "smollm2", SMOL_KNOBS, api_key=key))
        yield [first, second]


@pytest.fixture(scope="module")
def front(replicas, server_log_dir):
    port, internal = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEY_FILE", "ROUTER_POLICY", "BIND")}
    env.update({"ROUTER_WORKERS": ",".join(r.base_url for r in replicas), "PORT": str(port), "BIND": "127.0.0.1",
                "VLLM_API_KEY": replicas[0].api_key, "HYPERQWEN_ROUTER_INTERNAL_PORT": str(internal)})
    log_path = server_log_dir / "router.log"
    hyperqwen = Path(sys.executable).with_name("hyperqwen")
    with log_path.open("a") as log:
        process = subprocess.Popen([str(hyperqwen), "router"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=str(server_log_dir), start_new_session=True)
    front = Front(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{internal}", replicas[0].api_key, process, log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"hyperqwen router exited:\n{log_path.read_text()[-4000:]}"
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{front.url}/health", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"router not healthy in 60 s:\n{log_path.read_text()[-4000:]}"
            time.sleep(0.5)
        yield front
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _served(replicas) -> list[float]:
    return [r.metrics().get("vllm:request_success_total", 0.0) for r in replicas]


def _ask(front: Front, text: str, key: str | None = None, max_tokens: int = 4):
    return front.openai(key).chat.completions.create(
        model="qwen3.8-27b", messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0)


TOPICS = ["rivers", "bread", "violins", "glaciers", "bees", "lighthouses", "copper", "owls", "tides", "maps",
          "kites", "salt"]


def test_openai_requests_reach_both_replicas(front, replicas):
    # Distinct conversations: each prompt long enough that the chat template's shared opening (SmolLM2's adds a
    # default system prompt) is under the router's cache_threshold (0.3) of it, so no replica "holds" it and the
    # cache_aware policy spreads them. Short prompts sharing most of their tokens stay on one replica, by design.
    # Sent 4 at a time, as several users would: vllm-router 0.1.17's cache_aware picks the least-loaded replica
    # for a prefix no replica holds, and with one request at a time every replica is equally idle (measured:
    # 12 sequential distinct prompts all went to one replica).
    from concurrent.futures import ThreadPoolExecutor

    def one(n: int) -> str:
        topic = TOPICS[n]
        story = " ".join(f"{topic} {n}-{i} {TOPICS[(n + i) % len(TOPICS)]}" for i in range(40))
        return _ask(front, f"{topic.upper()} {story}. Write one sentence about {topic}.").choices[0].message.content

    before = _served(replicas)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(len(TOPICS))))
    assert all(answers)
    after = _served(replicas)
    per_replica = [a - b for a, b in zip(after, before)]
    assert sum(per_replica) == len(TOPICS)
    assert all(n > 0 for n in per_replica), f"requests per replica: {per_replica}"


def _hits(replicas) -> list[float]:
    return [r.metrics().get("vllm:prefix_cache_hits_total", 0.0) for r in replicas]


def test_conversation_turns_stick_to_their_replica_and_hit_its_prefix_cache(front, replicas):
    """Two conversations start at once (so they land on different replicas), then their turns alternate, one at
    a time. Without prefix affinity the router sends every idle-time request to the same replica (see the test
    above), so one conversation would move; with it, each turn goes where its prefix is cached."""
    from concurrent.futures import ThreadPoolExecutor

    client = front.openai()

    def opening(name: str) -> list[dict]:
        # Long and distinct, so the prefix (128-token blocks on CPU) spans several blocks.
        notes = " ".join(f"{name} note {i}: the {TOPICS[i % len(TOPICS)]} ledger lists item {i * 7} as checked."
                         for i in range(60))
        return [{"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": f"Here are my notes. {notes} Reply with OK."}]

    def turn(messages: list[dict], n: int) -> None:
        reply = client.chat.completions.create(model="qwen3.8-27b", messages=messages, max_tokens=8, temperature=0)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or "OK"},
                     {"role": "user", "content": f"Turn {n}: reply with OK again."}]

    conversations = {"alpha": opening("Alpha"), "bravo": opening("Bravo")}
    served0 = _served(replicas)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda m: turn(m, 2), conversations.values()))
    first = [a - b for a, b in zip(_served(replicas), served0)]
    assert first == [1, 1], f"the two openings went to replicas as {first}; they must start apart"
    placed: dict[str, list[int]] = {name: [] for name in conversations}
    for n in (3, 4):
        for name, messages in conversations.items():
            served, hits = _served(replicas), _hits(replicas)
            turn(messages, n)
            delta = [a - b for a, b in zip(_served(replicas), served)]
            gained = [a - b for a, b in zip(_hits(replicas), hits)]
            assert sorted(delta) == [0, 1], delta
            where = delta.index(1)
            placed[name].append(where)
            assert gained[where] >= 128, f"{name} turn {n - 1} on replica {where}: only {gained} prefix-cache hits"
    assert len(set(placed["alpha"])) == 1 and len(set(placed["bravo"])) == 1, placed
    assert placed["alpha"][0] != placed["bravo"][0], placed


def test_key_is_enforced_at_the_edge_and_again_by_each_replica(front, replicas):
    import openai

    for key in ("wrong-key-" + secrets.token_hex(8), ""):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = requests.post(f"{front.url}/v1/chat/completions", headers=headers, timeout=30,
                                 json={"model": "qwen3.8-27b", "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "gate"  # refused by the gate, before the router
    with pytest.raises(openai.AuthenticationError):
        _ask(front, "hi", key="wrong-key-" + secrets.token_hex(8))
    # The router's admin API is open on its own port (vllm-router 0.1.17 checks no key there); the gate hides it.
    assert requests.get(f"{front.router_url}/list_workers", timeout=10).status_code == 200
    for path in ("/list_workers", "/get_loads", "/flush_cache", "/metrics", "/tokenize", "/invocations"):
        assert requests.post(f"{front.url}{path}", headers={"Authorization": f"Bearer {front.api_key}"},
                             timeout=10).status_code == 404, path
    assert requests.post(f"{front.url}/add_worker", params={"url": "http://127.0.0.1:9"},
                         headers={"Authorization": f"Bearer {front.api_key}"}, timeout=10).status_code == 404
    # Pass-through: the router forwards the client's Authorization header, and each replica checks it again.
    wrong = requests.post(f"{front.router_url}/v1/chat/completions", timeout=30,
                          headers={"Authorization": "Bearer wrong-key-" + secrets.token_hex(8)},
                          json={"model": "qwen3.8-27b", "messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 2})
    assert wrong.status_code == 401


def test_anthropic_clients_work_through_the_gate(front):
    """Claude Code sends the key as x-api-key; the anthropic SDK as a bearer token. Both pass the gate and the
    replica (patch 0001 accepts x-api-key), through the router's pass-through of /v1/messages."""
    import anthropic

    client = anthropic.Anthropic(base_url=front.url, api_key=front.api_key, max_retries=0, timeout=120)
    message = client.messages.create(model="qwen3.8-27b", max_tokens=8,
                                     messages=[{"role": "user", "content": "Say hello."}])
    assert message.content and message.content[0].text
    body = {"model": "qwen3.8-27b", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}
    ok = requests.post(f"{front.url}/v1/messages", json=body, timeout=120,
                       headers={"x-api-key": front.api_key, "anthropic-version": "2023-06-01"})
    assert ok.status_code == 200, ok.text[:300]
    refused = requests.post(f"{front.url}/v1/messages", json=body, timeout=30,
                            headers={"x-api-key": "wrong-key-0123456789", "anthropic-version": "2023-06-01"})
    assert refused.status_code == 401


def test_monitor_page_shows_every_replica(front, replicas, server_log_dir):
    """`hyperqwen monitor --upstream A,B` (what the replicas-monitor service runs): one page, every replica."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEY_FILE", "BIND")}
    env.update({"VLLM_API_KEY": front.api_key, "BIND": "127.0.0.1", "MONITOR_INTERVAL": "0.5"})
    log_path = server_log_dir / "replicas-monitor.log"
    with log_path.open("a") as log:
        process = subprocess.Popen([str(Path(sys.executable).with_name("hyperqwen")), "monitor", "--port", str(port),
                                    "--upstream", ",".join(r.base_url for r in replicas)], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(server_log_dir))
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(requests.RequestException, ValueError, KeyError):
                state = requests.get(f"http://127.0.0.1:{port}/api/state", timeout=5).json()
                if all(r["up"] for r in state["replicas"]):
                    break
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
        assert [r["url"] for r in state["replicas"]] == [r.base_url for r in replicas]
        second = requests.get(f"http://127.0.0.1:{port}/api/state", params={"replica": "1"}, timeout=5).json()
        assert second["replica"] == 1 and second["upstream"]["url"] == replicas[1].base_url
        assert second["upstream"]["up"] is True
        page = requests.get(f"http://127.0.0.1:{port}/", timeout=5).text
        assert 'id="replicas"' in page
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_killing_a_replica_mid_load_loses_no_request_after_the_router_notices(front, replicas, record_property):
    victim = replicas[1]
    results: list[tuple[float, float, bool, str]] = []  # (start, end, ok, error)
    stop = threading.Event()

    def load(worker: int) -> None:
        i = 0
        while not stop.is_set():
            start = time.monotonic()
            try:
                _ask(front, f"{TOPICS[(i + worker) % len(TOPICS)]} {worker}-{i}: say a word.", max_tokens=2)
                results.append((start, time.monotonic(), True, ""))
            except Exception as exc:  # noqa: BLE001 - every failure is what this test counts
                results.append((start, time.monotonic(), False, f"{type(exc).__name__}: {exc}"[:200]))
            i += 1

    threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(4)]
    served_before = _served(replicas)
    for thread in threads:
        thread.start()
    time.sleep(10)
    # The victim must have been taking part of the load, or killing it proves nothing.
    assert _served(replicas)[1] > served_before[1], "the load never reached the replica about to be killed"
    killed_at, killed_wall = time.monotonic(), time.strftime("%H:%M:%S", time.gmtime())
    with contextlib.suppress(ProcessLookupError):
        os.killpg(victim.process.pid, signal.SIGKILL)  # the card falls off the bus: no graceful shutdown
    victim.process.wait(timeout=30)
    time.sleep(45)
    stop.set()
    for thread in threads:
        thread.join(timeout=150)
    after = [r for r in results if r[0] >= killed_at]
    failures = [r for r in after if not r[2]]
    last_failure_start = max((r[0] - killed_at for r in failures), default=0.0)
    record_property("failures_after_kill", len(failures))
    record_property("last_failed_request_started_s_after_kill", round(last_failure_start, 1))
    around = [r for r in results if -1.0 <= r[0] - killed_at <= 15.0]
    slowest = max((r[1] - r[0] for r in around), default=0.0)
    before_kill = sorted(r[1] - r[0] for r in results if r[0] < killed_at)
    typical = before_kill[len(before_kill) // 2] if before_kill else 0.0
    print(f"\nkilled replica-1 at {killed_wall} UTC (router.log shows when it gave up on it); after the kill: "
          f"{len(after)} requests, {len(failures)} failed; the last failed one started {last_failure_start:.1f} s "
          f"after the kill; slowest request around the kill {slowest:.2f} s (median before: {typical:.2f} s); "
          f"errors: {sorted({f[3] for f in failures})[:3]}")
    record_property("slowest_request_around_kill_s", round(slowest, 2))
    assert len(after) >= 10, "too few requests after the kill to say anything"
    assert sum(r[2] for r in results if r[0] < killed_at) > 0, "no request succeeded before the kill"
    # The router notices within health interval x failure threshold (5 s x 2) plus one probe timeout (5 s).
    assert last_failure_start <= 20.0, f"requests still failed {last_failure_start:.1f} s after the kill"
    late = [r for r in after if r[0] - killed_at > 20.0]
    assert late and all(r[2] for r in late), "requests started after the router noticed must all succeed"
