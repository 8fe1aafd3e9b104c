"""Open WebUI, the release compose.yaml pins, installed from PyPI (`open-webui`), against the real vLLM CPU server
with its API key, driven by a real headless Chromium: log in through the page, see only our model, send a chat
message and watch the streamed answer arrive, with thinking off and on.

Open WebUI brings ~2 GB of dependencies (its own torch among them), so it lives in a virtualenv of its own,
.venv-webui (HYPERQWEN_WEBUI_VENV), where it cannot change vLLM's; CI installs it in a job of its own
(.github/workflows/ci.yml, job `webui`):

    python3 -m venv .venv-webui && .venv-webui/bin/pip install open-webui==<the version compose.yaml pins>

Without it the tests skip and print that command. The browser is driven over the DevTools protocol exactly as
the monitor test does (tests/integration/test_monitor_browser.py; Debian's `chromium`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.server]

REPO = Path(__file__).resolve().parents[2]
WEBUI_VENV = Path(os.environ.get("HYPERQWEN_WEBUI_VENV") or REPO / ".venv-webui")
ADMIN_EMAIL = "admin@example.com"
STARTUP_TIMEOUT_S = 600  # ~90 s on an idle 2-core machine; migrations and imports dominate


def pinned_release() -> str:
    match = re.search(r"image: ghcr\.io/open-webui/open-webui:v(\d+\.\d+\.\d+)", (REPO / "compose.yaml").read_text())
    assert match, "compose.yaml must pin Open WebUI to a release tag"
    return match.group(1)


def open_webui_binary() -> Path:
    binary = WEBUI_VENV / "bin" / "open-webui"
    if not binary.is_file():
        pytest.skip(f"Open WebUI is not installed in {WEBUI_VENV} (its own virtualenv, CI job `webui`): "
                    f"python3 -m venv .venv-webui && .venv-webui/bin/pip install open-webui=={pinned_release()}")
    return binary


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class WebUI:
    url: str
    log_path: Path
    token: str


def webui_env(server, data_dir: Path) -> dict[str, str]:
    """What compose.yaml's `webui` service sets, pointed at the test server instead of http://server:PORT."""
    return {
        "PATH": f"{WEBUI_VENV / 'bin'}:{os.environ.get('PATH', '')}",
        "HOME": str(data_dir),
        "DATA_DIR": str(data_dir),
        "WEBUI_SECRET_KEY": secrets.token_hex(16),
        "OPENAI_API_BASE_URL": server.v1_url,
        "OPENAI_API_KEY": server.api_key,
        "ENABLE_PERSISTENT_CONFIG": "False",
        "ENABLE_OLLAMA_API": "False",
        "ENABLE_EVALUATION_ARENA_MODELS": "False",
        "ENABLE_VERSION_UPDATE_CHECK": "False",
        "ANONYMIZED_TELEMETRY": "False",
        "DO_NOT_TRACK": "True",
        "WEBUI_AUTH": "True",
        # As compose.yaml sets them: the admin comes from the environment (password: the API key) and
        # sign-up is off, so whoever reaches the page first cannot make themselves admin.
        "WEBUI_ADMIN_EMAIL": ADMIN_EMAIL,
        "WEBUI_ADMIN_PASSWORD": server.api_key,
        "ENABLE_SIGNUP": "False",
        # No network for Open WebUI's own downloads (its RAG embedding model); chat does not need them.
        "OFFLINE_MODE": "True",
        "HF_HUB_OFFLINE": "1",
        # Test speed only (compose keeps them on): titles, tags, follow-ups and autocomplete are each one more
        # request to a 2-core CPU server.
        "ENABLE_TITLE_GENERATION": "False",
        "ENABLE_TAGS_GENERATION": "False",
        "ENABLE_FOLLOW_UP_GENERATION": "False",
        "ENABLE_AUTOCOMPLETE_GENERATION": "False",
    }


def model_settings(served_model_name: str, **params) -> dict:
    """Open WebUI's per-model settings for our model (Admin > Settings > Models > edit), as its API takes them."""
    return {"id": served_model_name, "name": served_model_name, "base_model_id": None, "meta": {},
            "is_active": True, "params": params}


# Greedy and short: the answers are checked, and a 2-core CPU server decodes a few tokens per second.
BASE_PARAMS = {"temperature": 0, "max_tokens": 48}


@pytest.fixture(scope="module")
def open_webui(smol_server, tmp_path_factory) -> Iterator[WebUI]:
    binary = open_webui_binary()
    data_dir = tmp_path_factory.mktemp("open-webui")
    port = free_port()
    log_path = data_dir / "open-webui.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(binary), "serve", "--host", "127.0.0.1", "--port", str(port)],
                                env=webui_env(smol_server, data_dir), stdout=log, stderr=subprocess.STDOUT,
                                cwd=data_dir, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Open WebUI did not start:\n{log_path.read_text()[-4000:]}", pytrace=False)
            time.sleep(1)
        # Nobody can sign up, not even first: the admin exists already, with the API key as its password.
        signup = requests.post(f"{url}/api/v1/auths/signup", timeout=60,
                               json={"name": "Intruder", "email": "intruder@example.com", "password": "x" * 16})
        assert signup.status_code in (401, 403), signup.text
        signin = requests.post(f"{url}/api/v1/auths/signin", timeout=60,
                               json={"email": ADMIN_EMAIL, "password": smol_server.api_key})
        signin.raise_for_status()
        assert signin.json()["role"] == "admin"
        token = signin.json()["token"]
        settings = requests.post(f"{url}/api/v1/models/create", json=model_settings(smol_server.served_model_name,
                                                                                    **BASE_PARAMS),
                                 headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert settings.status_code == 200, settings.text
        yield WebUI(url, log_path, token)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert smol_server.api_key not in log_path.read_text(), "Open WebUI logged the server's API key"


@pytest.fixture(scope="module")
def page(open_webui, smol_server, tmp_path_factory):
    """A headless Chromium page logged in through Open WebUI's own sign-in form."""
    from integration.test_monitor_browser import headless_chromium

    with headless_chromium(tmp_path_factory.mktemp("chromium-profile")) as page:
        page.call("Page.enable")
        page.call("Page.navigate", url=open_webui.url + "/auth")
        wait_for(lambda: page.evaluate("!!document.querySelector('#email')"), 60, "the sign-in form")
        fill = """((selector, value) => { const el = document.querySelector(selector);
            Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(el, value);
            el.dispatchEvent(new Event('input', {bubbles: true})); })"""
        page.evaluate(f"{fill}('#email', {json.dumps(ADMIN_EMAIL)})")
        page.evaluate(f"{fill}('#password', {json.dumps(smol_server.api_key)})")
        page.evaluate("document.querySelector('button[type=submit]').click()")
        wait_for(lambda: page.evaluate("!!localStorage.token && !location.pathname.startsWith('/auth')"), 60,
                 "the sign-in to land on the chat page")
        wait_for(lambda: page.evaluate("!!document.querySelector('#chat-input')"), 60, "the chat input")
        yield page


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}", pytrace=False)


def dismiss_dialogs(page) -> None:
    """Open WebUI greets a new admin with its changelog: close it like a user would."""
    page.evaluate("""[...document.querySelectorAll('button')].filter(b => /Okay, Let's Go!/.test(b.innerText))
                     .forEach(b => b.click())""")


# --- tests -------------------------------------------------------------------------------------------------------


def test_installed_open_webui_is_the_release_compose_pins() -> None:
    binary = open_webui_binary()
    python = binary.parent / "python"
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('open-webui'))"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    assert version == pinned_release()


def test_model_list_shows_only_our_model(open_webui, smol_server, page) -> None:
    models = requests.get(f"{open_webui.url}/api/models", timeout=60,
                          headers={"Authorization": f"Bearer {open_webui.token}"}).json()["data"]
    assert [m["id"] for m in models] == [smol_server.served_model_name]
    dismiss_dialogs(page)
    page.evaluate("document.querySelector('#model-selector-model-button').click()")
    names = wait_for(lambda: page.evaluate(
        """[...document.querySelectorAll('[role=option]')].map(e => e.innerText.trim()).filter(t => t)"""), 30,
        "the model menu")
    assert any(smol_server.served_model_name in name for name in names), names
    assert all(smol_server.served_model_name in name for name in names), names


def chat(page, served_model_name: str, prompt: str, timeout_s: float = 180) -> dict:
    """Type `prompt` into a new chat with our model and record the answer's text as it grows."""
    dismiss_dialogs(page)
    page.evaluate("document.querySelector('#new-chat-button, #sidebar-new-chat-button')?.click()")
    wait_for(lambda: page.evaluate("!!document.querySelector('#chat-input')"), 30, "a new chat")
    # Pick our model if the page has not already.
    if served_model_name not in page.evaluate("document.querySelector('#model-selector-model-button').innerText"):
        page.evaluate("document.querySelector('#model-selector-model-button').click()")
        time.sleep(0.5)
        page.evaluate(f"""[...document.querySelectorAll('button')].filter(b => b.innerText.trim()
                          .startsWith({json.dumps(served_model_name)})).slice(-1).forEach(b => b.click())""")
        wait_for(lambda: served_model_name in page.evaluate(
            "document.querySelector('#model-selector-model-button').innerText"), 30, "our model to be selected")
    # Mark the answers already on the page (a chat still rendering after "new chat" or a reload), then sample the
    # new answer's text from inside the page every 30 ms while it streams.
    page.evaluate("""(() => { document.querySelectorAll('#response-content-container')
                                .forEach(e => e.dataset.hqSeen = '1');
        window.__hq = {lengths: []};
        window.__hq.timer = setInterval(() => {
            const fresh = document.querySelectorAll('#response-content-container:not([data-hq-seen])');
            if (!fresh.length) return;
            const n = fresh[fresh.length - 1].innerText.trim().length, l = window.__hq.lengths;
            if (n && l[l.length - 1] !== n) l.push(n); }, 30); })()""")
    page.evaluate("document.querySelector('#chat-input').focus()")
    page.call("Input.insertText", text=prompt)
    wait_for(lambda: page.evaluate("!!document.querySelector('#send-message-button:not([disabled])')"), 30,
             "the send button")
    page.evaluate("document.querySelector('#send-message-button').click()")

    def finished():
        state = page.evaluate("""(() => {
            const fresh = document.querySelectorAll('#response-content-container:not([data-hq-seen])');
            const last = fresh.length ? fresh[fresh.length - 1] : null;
            const busy = !!document.querySelector('button[aria-label="Stop"]');
            return {text: last ? last.innerText.trim() : '', busy}; })()""")
        return state if state["text"] and not state["busy"] else None

    state = wait_for(finished, timeout_s, "the streamed answer")
    time.sleep(1.0)
    lengths = page.evaluate("clearInterval(window.__hq.timer), window.__hq.lengths")
    html = page.evaluate("""(() => {
        const fresh = document.querySelectorAll('#response-content-container:not([data-hq-seen])');
        return fresh[fresh.length - 1].innerHTML; })()""")
    return {"text": state["text"], "lengths": lengths, "html": html}


def test_browser_chat_shows_the_streamed_answer(page, smol_server) -> None:
    result = chat(page, smol_server.served_model_name, "What is the capital of France?")
    assert "Paris" in result["text"], result["text"]
    # Streamed: the page showed the answer at several lengths on its way to the final one.
    assert len(result["lengths"]) >= 3 and result["lengths"] == sorted(result["lengths"]), result["lengths"]


def test_thinking_off_and_on(open_webui, page, smol_server) -> None:
    """The server's THINKING default is off: the answer is plain content. A model preset in Open WebUI with the
    custom parameter chat_template_kwargs={"enable_thinking": true} (Workspace > Models > Advanced Params, what
    docs/webui.md tells users) switches it on: the qwen3 reasoning parser then returns the text as reasoning,
    which the page shows in its collapsible thinking block instead of as the answer."""
    off = chat(page, smol_server.served_model_name, "What is the capital of France?")
    assert "Paris" in off["text"] and not off["text"].startswith("Thought"), off["text"]

    name = smol_server.served_model_name
    thinking = model_settings(name, **BASE_PARAMS,
                              custom_params={"chat_template_kwargs": json.dumps({"enable_thinking": True})})
    response = requests.post(f"{open_webui.url}/api/v1/models/model/update?id={name}", json=thinking, timeout=60,
                             headers={"Authorization": f"Bearer {open_webui.token}"})
    assert response.status_code == 200, response.text
    try:
        # No reload: Open WebUI applies the model's settings on its server side, per request.
        on = chat(page, name, "What is the capital of France?")
        # The answer is now reasoning: a collapsed "Thought for N seconds" block, with the text inside it.
        assert on["text"].startswith("Thought for") and "Paris" not in on["text"], on["text"]
        page.evaluate("""(() => {
            const a = document.querySelectorAll('#response-content-container:not([data-hq-seen])');
            a[a.length - 1].querySelector('button[aria-expanded]').click(); })()""")
        expanded = wait_for(lambda: page.evaluate("""(() => { const a = document.querySelectorAll(
            '#response-content-container:not([data-hq-seen])'); const t = a[a.length - 1].innerText;
            return /Paris/.test(t) && t; })()"""), 30, "the thinking block to open")
        assert "Paris" in expanded
    finally:
        requests.post(f"{open_webui.url}/api/v1/models/model/update?id={name}", timeout=60,
                      json=model_settings(name, **BASE_PARAMS), headers={"Authorization": f"Bearer {open_webui.token}"})
