"""The monitor page in a real headless Chromium, against the real vLLM CPU server.

Starts `python -m hyperqwen.monitor` against the smol_server fixture (with --require-key, so the browser goes
through the key check like a LAN visitor), sends requests with the OpenAI SDK, loads the page in Debian's
`chromium` driven over the DevTools protocol (the `websockets` package; no Selenium, no Node), and checks that
the numbers on the page are the numbers in /metrics and the table rows are the requests sent.

The screenshot goes to the test's temp folder; with HYPERQWEN_UPDATE_SCREENSHOT=1 also to
docs/monitor-screenshot.png. Needs: apt-get install chromium.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytestmark = [pytest.mark.server]

REPO_ROOT = Path(__file__).resolve().parents[2]

INTERVAL_S = 0.5
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1400,1900"]
PROMPTS = [("Name three colours.", 16), ("What is the capital of France?", 24), ("Count to twenty.", 6)]
# One long system prompt shared by every request: more than two KV blocks (128 tokens on this server), so the
# later requests hit the prefix cache and the page has a hit rate other than zero to show.
SYSTEM = " ".join(["You are a terse assistant. Answer in one short sentence, without any preamble."] * 30)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no Chromium: the browser test needs Debian's `chromium` (apt-get install -y chromium)",
                pytrace=False)


class DevTools:
    """A minimal Chrome DevTools Protocol client for one page target."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, **params):
        message_id = next(self.ids)
        self.ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")


@contextlib.contextmanager
def headless_chromium(profile_dir: Path):
    proc = subprocess.Popen([chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}",
                             "--remote-debugging-port=0", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"chromium did not start: {proc.stderr.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.2)
        port = int(port_file.read_text().splitlines()[0])
        [page] = [t for t in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                  if t["type"] == "page"]
        from websockets.sync.client import connect

        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            yield DevTools(ws)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@contextlib.contextmanager
def running_monitor(server, tmp_path: Path):
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "MODELS_DIR": str(tmp_path),
           "VLLM_API_KEY": server.api_key, "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "monitor.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hyperqwen.monitor", "--upstream", server.base_url,
                                 "--port", str(port), "--interval", str(INTERVAL_S), "--require-key"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"monitor did not start:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield url, log_path
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    assert server.api_key not in log_path.read_text(), "the monitor logged the API key"


def monitor_state(url: str, key: str) -> dict:
    response = requests.get(f"{url}/api/state", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    response.raise_for_status()
    return response.json()


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


def pct(value: float) -> str:
    return f"{100 * value:,.1f} %"


def test_monitor_page_shows_what_metrics_says(smol_server, tmp_path: Path) -> None:
    server = smol_server
    client = server.openai()
    with running_monitor(server, tmp_path) as (url, _log):
        assert requests.get(url, timeout=10).status_code == 401  # --require-key: no key, no page
        before = wait_for(lambda: (s := monitor_state(url, server.api_key))["lifetime"] and s, 30, "a first scrape")
        finished_before = before["lifetime"]["finished_total"]

        sent = []
        for prompt, max_tokens in PROMPTS:
            reply = client.chat.completions.create(
                model=server.served_model_name, max_tokens=max_tokens, temperature=0,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}])
            sent.append({"prompt_tokens": reply.usage.prompt_tokens,
                         "completion_tokens": reply.usage.completion_tokens,
                         "finish_reason": reply.choices[0].finish_reason})
            # Let at least two scrapes pass, so each request lands in its own row.
            time.sleep(3 * INTERVAL_S)
        assert any(s["finish_reason"] == "length" for s in sent)

        wait_for(lambda: monitor_state(url, server.api_key)["lifetime"]["finished_total"]
                 == finished_before + len(sent), 30, "the monitor to see every request")
        # The server is idle now: /metrics stays put while the page catches up.
        metrics = server.metrics()
        metrics_time = time.time()

        credentials = base64.b64encode(f"monitor:{server.api_key}".encode()).decode()
        with headless_chromium(tmp_path / "chromium-profile") as page:
            page.call("Network.enable")
            page.call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Basic {credentials}"})
            page.call("Page.enable")
            page.call("Page.navigate", url=url + "/")
            wait_for(lambda: float(page.evaluate("(document.body && document.body.dataset.rendered) || 0")) > metrics_time + INTERVAL_S,
                     60, "the page to render a state newer than the /metrics read")
            shown = page.evaluate("""(() => {
                const text = (id) => document.getElementById(id).textContent.trim();
                const ids = ["status", "model-name", "running", "waiting", "kv-usage", "life-finished",
                             "life-generation-tokens", "life-prompt-tokens", "life-prefix-hit-rate",
                             "w5m-spec-tokens-per-step", "w5m-ram-cache-hit-rate", "life-ram-cache-hits"];
                const out = Object.fromEntries(ids.map((id) => [id, text(id)]));
                out.rows = [...document.querySelectorAll("#requests tbody tr")].map((tr) =>
                    Object.fromEntries([...tr.querySelectorAll("td")].map((td) => [td.dataset.col, td.textContent])));
                out.canvases = [...document.querySelectorAll("canvas")].map((c) => c.width > 0 && c.height > 0);
                return out;
            })()""")
            shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        png = base64.b64decode(shot["data"])

    assert shown["status"] == "server up"
    assert shown["model-name"] == server.served_model_name
    number = lambda text: float(text.replace(",", ""))  # noqa: E731
    assert number(shown["running"]) == metrics["vllm:num_requests_running"] == 0
    assert number(shown["waiting"]) == metrics["vllm:num_requests_waiting"] == 0
    assert shown["kv-usage"] == pct(metrics["vllm:kv_cache_usage_perc"])
    assert number(shown["life-finished"]) == metrics["vllm:request_success_total"]
    assert number(shown["life-generation-tokens"]) == metrics["vllm:generation_tokens_total"]
    assert number(shown["life-prompt-tokens"]) == metrics["vllm:prompt_tokens_total"]
    assert metrics["vllm:prefix_cache_hits_total"] > 0  # the shared system prompt was reused
    assert shown["life-prefix-hit-rate"] == pct(
        metrics["vllm:prefix_cache_hits_total"] / metrics["vllm:prefix_cache_queries_total"])
    assert shown["w5m-spec-tokens-per-step"] == "off"  # SPEC=none on this server
    # No RAM_CACHE on this server: vLLM exports the connector counters at 0, and the card says off.
    assert metrics["vllm:external_prefix_cache_queries_total"] == 0
    assert shown["w5m-ram-cache-hit-rate"] == "off" and number(shown["life-ram-cache-hits"]) == 0
    assert all(shown["canvases"])

    # Newest first: the last request sent is the first row; one request per row.
    rows = shown["rows"][: len(sent)]
    for row, request in zip(rows, reversed(sent), strict=True):
        assert row["count"] == "1"
        assert number(row["prompt"]) == request["prompt_tokens"]
        assert number(row["output"]) == request["completion_tokens"]
        assert row["reason"] == request["finish_reason"]
        assert row["ttft"].endswith(("ms", " s")) and row["duration"].endswith(("ms", " s"))

    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    (tmp_path / "monitor-screenshot.png").write_bytes(png)
    if os.environ.get("HYPERQWEN_UPDATE_SCREENSHOT") == "1":
        (REPO_ROOT / "docs" / "monitor-screenshot.png").write_bytes(png)
