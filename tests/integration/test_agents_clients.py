"""Real coding-agent CLIs against the CPU server: Claude Code (/v1/messages), Codex CLI (/v1/responses),
opencode, Continue's cn and aider (/v1/chat/completions), each run non-interactively through a recording proxy.

Per client: one plain turn, and one turn where the proxy forces a tool call on the client's first model request
(the random-weight test model never calls a tool by itself; the grammar makes the forced call valid), the CLI
runs the tool and sends its result back: tool_use/tool_result on Messages, function_call/function_call_output on
Responses, tool_calls/tool on chat. The forced tools are harmless: Claude Code's Read (of a path that does not
exist), Codex's get_goal, opencode's glob. Asserted: the CLI's exit code, the endpoints and status codes the
server answered, and that the tool result came back to the server.

The CLIs come from npm, pinned (CLI_PACKAGES); scripts/test.py installs them into .npm-agents/ with
`npm install --prefix .npm-agents --no-audit --no-fund <pins>`; HYPERQWEN_AGENT_CLIS names another prefix.
A test skips only when its CLI is not installed (the npm registry was unreachable).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from agents_proxy import RecordingProxy

pytestmark = [pytest.mark.integration, pytest.mark.server]

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI_PREFIX = Path(os.environ.get("HYPERQWEN_AGENT_CLIS", REPO_ROOT / ".npm-agents"))
# The pins live once, in requirements/agent-clis.txt (scripts/test.py installs from the same file).
_PINS = [line.strip() for line in (REPO_ROOT / "requirements" / "agent-clis.txt").read_text().splitlines()
         if line.strip() and not line.startswith("#")]
CLI_PACKAGES = {"claude": next(p for p in _PINS if p.startswith("@anthropic-ai/claude-code@")),
                "codex": next(p for p in _PINS if p.startswith("@openai/codex@")),
                "opencode": next(p for p in _PINS if p.startswith("opencode-ai@")),
                "cn": next(p for p in _PINS if p.startswith("@continuedev/cli@")),
                "cline": next(p for p in _PINS if p.startswith("cline@"))}
CLI_TIMEOUT_S = 420


def cli(name: str) -> Path:
    path = CLI_PREFIX / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.skip(f"{CLI_PACKAGES[name]} is not installed under {CLI_PREFIX} (npm registry unreachable?): "
                    f"npm install --prefix {CLI_PREFIX} {' '.join(CLI_PACKAGES.values())}")
    return path


def run_cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TMPDIR", "SSL_CERT_FILE")}
    result = subprocess.run(argv, env={**base, **env}, cwd=cwd, capture_output=True, text=True,
                            timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    return result


def explain(result: subprocess.CompletedProcess, proxy: RecordingProxy) -> str:
    return (f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n"
            f"{result.stderr[-3000:]}\n--- server saw ---\n{proxy.summary()}")


REPLY = "Hello from HyperQwen."
# The random-weight model never ends a turn by itself (it runs to max_tokens, which Claude Code reports as an
# error), so every request that is not the forced call gets its reply pinned by structured output: this exact
# string, then the end of the turn. Per API: Messages output_config.format, chat response_format, Responses
# text.format; tool_choice none so the reply is text.
REPLY_SCHEMA = {"type": "string", "enum": [REPLY]}
PINNED_REPLY = {
    "/v1/messages": {"tool_choice": {"type": "none"},
                     "output_config": {"format": {"type": "json_schema", "schema": REPLY_SCHEMA}}},
    "/v1/chat/completions": {"tool_choice": "none", "response_format": {
        "type": "json_schema", "json_schema": {"name": "reply", "schema": REPLY_SCHEMA}}},
    "/v1/responses": {"tool_choice": "none", "text": {"format": {"type": "json_schema", "name": "reply",
                                                                 "schema": REPLY_SCHEMA}}},
}


def bounded(schema):
    """The schema with every string capped at 16 characters and every array at 2 items: the random-weight model
    fills an unbounded string until max_tokens (32,000 for Claude Code), a real model ends it."""
    if isinstance(schema, list):
        return [bounded(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: bounded(value) for key, value in schema.items()}
    if out.get("type") == "string" and "enum" not in out and "const" not in out:
        out["maxLength"] = min(int(out.get("maxLength", 16)), 16)
        out.pop("pattern", None)
        out.pop("format", None)
    if out.get("type") == "array":
        out["maxItems"] = min(int(out.get("maxItems", 2)), 2)
    return out


def bound_tool(tool: dict, name: str) -> dict:
    """One tool definition (Messages, chat or Responses shape) with its schema bounded if it is `name`."""
    if tool.get("name") == name and "input_schema" in tool:
        return {**tool, "input_schema": bounded(tool["input_schema"])}
    if tool.get("name") == name and "parameters" in tool:
        return {**tool, "parameters": bounded(tool["parameters"])}
    function = tool.get("function")
    if isinstance(function, dict) and function.get("name") == name:
        return {**tool, "function": {**function, "parameters": bounded(function.get("parameters") or {})}}
    return tool


def forced_name(tool_choice: dict) -> str:
    return tool_choice.get("name") or tool_choice["function"]["name"]


def steer(route: str, has_result=None, tool_choice=None, has_tool=None):
    """The proxy's rewrite for one client: force tool_choice on the first model request that offers the tool
    (none carries a tool result yet), with that tool's strings bounded; pin every other model request's reply
    to REPLY."""
    forced: list[bool] = []

    def rewrite(path: str, body: dict) -> dict | None:
        if not path.startswith(route) or "/count_tokens" in path:
            return None
        if tool_choice is not None and not forced and body.get("tools") and has_tool(body) and not has_result(body):
            forced.append(True)
            tools = [bound_tool(tool, forced_name(tool_choice)) for tool in body["tools"]]
            return {**body, "tools": tools, "tool_choice": tool_choice}
        changed = {**body, **PINNED_REPLY[route]}
        if route == "/v1/chat/completions" and not body.get("tools"):
            changed.pop("tool_choice")
        if route == "/v1/messages" and not body.get("tools"):
            changed.pop("tool_choice")
        return changed

    return rewrite


def model_posts_ok(proxy: RecordingProxy, path: str) -> list:
    posts = proxy.posts(path)
    assert posts, f"no POST {path}: {proxy.summary()}"
    bad = [(e.path, e.status) for e in posts if e.status != 200]
    assert not bad, f"refused model requests: {bad}; all: {proxy.summary()}"
    return posts


# ---------------------------------------------------------------------------------------------------------
# Claude Code -> /v1/messages


def claude_env(proxy: RecordingProxy, server, home: Path) -> dict[str, str]:
    """The configuration docs/agents.md gives, pointed at the proxy."""
    return {
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": proxy.url,
        "ANTHROPIC_API_KEY": server.api_key,
        "ANTHROPIC_MODEL": server.served_model_name,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": server.served_model_name,
        "ANTHROPIC_SMALL_FAST_MODEL": server.served_model_name,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "65536",
    }


def _messages_have_tool_result(body: dict) -> bool:
    return any(isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"])
               for m in body.get("messages", []))


def _offers(name: str):
    def has_tool(body: dict) -> bool:
        return any((t.get("name") or t.get("function", {}).get("name")) == name for t in body.get("tools", []))

    return has_tool


def test_claude_code_plain_turn(agents_server, tmp_path):
    binary = cli("claude")
    with RecordingProxy(agents_server.base_url, steer("/v1/messages")) as proxy:
        result = run_cli([str(binary), "-p", "Say hello.", "--model", agents_server.served_model_name,
                          "--max-turns", "2"], claude_env(proxy, agents_server, tmp_path), tmp_path)
    assert result.returncode == 0, explain(result, proxy)
    posts = model_posts_ok(proxy, "/v1/messages")
    assert any(e.path.startswith("/v1/messages") and e.body and e.body.get("stream") for e in posts)


def test_claude_code_tool_use_round_trip(agents_server, tmp_path):
    binary = cli("claude")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "hello.txt").write_text("hi\n")
    rewrite = steer("/v1/messages", _messages_have_tool_result, {"type": "tool", "name": "Read"}, _offers("Read"))
    with RecordingProxy(agents_server.base_url, rewrite) as proxy:
        result = run_cli([str(binary), "-p", "List the files here.", "--model", agents_server.served_model_name,
                          "--allowedTools", "Read", "--max-turns", "3"],
                         claude_env(proxy, agents_server, tmp_path), tmp_path / "work")
    assert result.returncode == 0, explain(result, proxy)
    posts = model_posts_ok(proxy, "/v1/messages")
    forced = [e for e in posts if e.body and e.body.get("tool_choice", {}).get("name") == "Read"]
    assert forced, f"no request was forced: {proxy.summary()}"
    assert b'"type":"tool_use"' in forced[0].response_bytes, forced[0].response_bytes[:2000]
    results = [e for e in posts if e.body and _messages_have_tool_result(e.body)]
    assert results, f"the tool_result never came back: {proxy.summary()}\n{explain(result, proxy)}"


# ---------------------------------------------------------------------------------------------------------
# Codex CLI -> /v1/responses (wire_api = "responses"; 0.171 refuses "chat")


CODEX_CATALOG = REPO_ROOT / "docs" / "agents" / "codex-models.json"
# What Codex 0.171 prints when its model catalog has no entry for the configured model.
CODEX_NO_METADATA = "Model metadata for"


def codex_home(tmp_path: Path, proxy: RecordingProxy, server) -> Path:
    """The config.toml docs/agents.md gives (provider + the model catalog docs/agents/codex-models.json),
    pointed at the proxy."""
    home = tmp_path / "codex-home"
    home.mkdir()
    catalog = json.loads(CODEX_CATALOG.read_text())
    assert [m["slug"] for m in catalog["models"]] == [server.served_model_name]
    (home / "models.json").write_text(json.dumps(catalog))
    (home / "config.toml").write_text(
        f'model = "{server.served_model_name}"\n'
        'model_provider = "hyperqwen"\n'
        "model_context_window = 65536\n"
        'model_reasoning_effort = "none"\n'
        f'model_catalog_json = "{home / "models.json"}"\n'
        "[model_providers.hyperqwen]\n"
        'name = "HyperQwen"\n'
        f'base_url = "{proxy.url}/v1"\n'
        'env_key = "HYPERQWEN_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    return home


def _responses_have_output(body: dict) -> bool:
    items = body.get("input")
    return isinstance(items, list) and any(isinstance(i, dict) and i.get("type") == "function_call_output"
                                           for i in items)


def _codex(binary: Path, tmp_path: Path, proxy: RecordingProxy, server, prompt: str) -> subprocess.CompletedProcess:
    home = codex_home(tmp_path, proxy, server)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {"HOME": str(tmp_path), "CODEX_HOME": str(home), "HYPERQWEN_API_KEY": server.api_key}
    return run_cli([str(binary), "exec", "--skip-git-repo-check", "--sandbox", "read-only", prompt], env, work)


def test_codex_plain_turn(agents_server, tmp_path):
    binary = cli("codex")
    with RecordingProxy(agents_server.base_url, steer("/v1/responses")) as proxy:
        result = _codex(binary, tmp_path, proxy, agents_server, "Say hello.")
    assert result.returncode == 0, explain(result, proxy)
    assert CODEX_NO_METADATA not in result.stdout + result.stderr, explain(result, proxy)
    posts = model_posts_ok(proxy, "/v1/responses")
    # The catalog entry keeps the tools Codex 0.171 offers with its fallback metadata (the same set was recorded
    # without the catalog): exec_command/write_stdin for the shell, the goal tools, view_image, ...
    offered = {tool.get("name") for e in posts if e.body for tool in e.body.get("tools") or []}
    assert {"exec_command", "write_stdin", "get_goal"} <= offered, sorted(map(str, offered))


def test_codex_function_call_round_trip(agents_server, tmp_path):
    binary = cli("codex")
    rewrite = steer("/v1/responses", _responses_have_output, {"type": "function", "name": "get_goal"},
                    _offers("get_goal"))
    with RecordingProxy(agents_server.base_url, rewrite) as proxy:
        result = _codex(binary, tmp_path, proxy, agents_server, "Make a plan.")
    assert result.returncode == 0, explain(result, proxy)
    posts = model_posts_ok(proxy, "/v1/responses")
    assert any(e.body and isinstance(e.body.get("tool_choice"), dict) for e in posts), proxy.summary()
    assert any(e.body and _responses_have_output(e.body) for e in posts), (
        f"no function_call_output came back: {explain(result, proxy)}")


# ---------------------------------------------------------------------------------------------------------
# opencode -> /v1/chat/completions (@ai-sdk/openai-compatible provider)


def opencode_env(tmp_path: Path, proxy: RecordingProxy, server) -> dict[str, str]:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "hyperqwen": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "HyperQwen",
                "options": {"baseURL": f"{proxy.url}/v1", "apiKey": "{env:HYPERQWEN_API_KEY}"},
                "models": {server.served_model_name: {"name": "Qwen3.8 27B (HyperQwen)",
                                                      "limit": {"context": 65536, "output": 512},
                                                      "tool_call": True}},
            }
        },
        "model": f"hyperqwen/{server.served_model_name}",
        "small_model": f"hyperqwen/{server.served_model_name}",
        "autoupdate": False,
        "share": "disabled",
    }
    config_path = tmp_path / "opencode.json"
    config_path.write_text(json.dumps(config))
    return {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / ".config"),
            "XDG_DATA_HOME": str(tmp_path / ".data"), "XDG_CACHE_HOME": str(tmp_path / ".cache"),
            "OPENCODE_CONFIG": str(config_path), "HYPERQWEN_API_KEY": server.api_key,
            "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}


def _chat_has_tool_message(body: dict) -> bool:
    return any(m.get("role") == "tool" for m in body.get("messages", []))


def _opencode(binary, tmp_path, proxy, server, prompt):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return run_cli([str(binary), "run", "--model", f"hyperqwen/{server.served_model_name}", prompt],
                   opencode_env(tmp_path, proxy, server), work)


def test_opencode_plain_turn(agents_server, tmp_path):
    binary = cli("opencode")
    with RecordingProxy(agents_server.base_url, steer("/v1/chat/completions")) as proxy:
        result = _opencode(binary, tmp_path, proxy, agents_server, "Say hello.")
    assert result.returncode == 0, explain(result, proxy)
    model_posts_ok(proxy, "/v1/chat/completions")


def test_opencode_tool_calls_round_trip(agents_server, tmp_path):
    binary = cli("opencode")
    rewrite = steer("/v1/chat/completions", _chat_has_tool_message,
                    {"type": "function", "function": {"name": "glob"}}, _offers("glob"))
    with RecordingProxy(agents_server.base_url, rewrite) as proxy:
        result = _opencode(binary, tmp_path, proxy, agents_server, "Find the Python files.")
    assert result.returncode == 0, explain(result, proxy)
    posts = model_posts_ok(proxy, "/v1/chat/completions")
    assert any(e.body and isinstance(e.body.get("tool_choice"), dict) for e in posts), (
        f"no request offered glob: {proxy.summary()}")
    assert any(e.body and _chat_has_tool_message(e.body) for e in posts), (
        f"no tool message came back: {explain(result, proxy)}")


# ---------------------------------------------------------------------------------------------------------
# Off-host traffic: each client runs under netwatch.run_watched, which records every non-loopback peer its
# process tree opens a socket to.


def off_host(peers: set[str], allowed_hosts: tuple[str, ...] = ()) -> set[str]:
    """The peers not explained: DNS (port 53) is allowed only together with an allowed host, whose addresses
    (resolved here, when this machine can) are allowed too."""
    import socket

    allowed = set()
    for host in allowed_hosts:
        try:
            allowed |= {info[4][0] for info in socket.getaddrinfo(host, 443)}
        except OSError:
            pass
    return {p for p in peers
            if not (allowed_hosts and p.endswith(":53")) and p.split()[1].rsplit(":", 1)[0] not in allowed}


# ---------------------------------------------------------------------------------------------------------
# Continue's cn CLI -> /v1/chat/completions (provider "openai")

# cn 1.5.47 asks https://api.continue.dev/cn/info for its latest version (with a machine id) when it starts,
# whatever the configuration; nothing turns that off (docs/agents.md says so). Everything else stays local.
CONTINUE_VERSION_HOST = "api.continue.dev"
CONTINUE_MAX_TOKENS = 512


def continue_config(tmp_path: Path, proxy: RecordingProxy, server) -> Path:
    """The config.yaml docs/agents.md gives, pointed at the proxy."""
    path = tmp_path / "continue.yaml"
    path.write_text(
        "name: HyperQwen\nversion: 1.0.0\nschema: v1\nmodels:\n"
        f"  - name: HyperQwen\n    provider: openai\n    model: {server.served_model_name}\n"
        f"    apiBase: {proxy.url}/v1\n    apiKey: {server.api_key}\n    roles: [chat, edit, apply]\n"
        f"    defaultCompletionOptions:\n      contextLength: 65536\n      maxTokens: {CONTINUE_MAX_TOKENS}\n")
    return path


def test_continue_cn_plain_turn_stays_on_the_machine(agents_server, tmp_path):
    from netwatch import run_watched

    binary = cli("cn")
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CONTINUE_GLOBAL_DIR": str(tmp_path / ".continue"),
           "CONTINUE_CLI_ENABLE_TELEMETRY": "0"}
    with RecordingProxy(agents_server.base_url, steer("/v1/chat/completions")) as proxy:
        result, peers = run_watched([str(binary), "-p", "--config", str(continue_config(tmp_path, proxy, agents_server)),
                                     "Say hello."], env, work, CLI_TIMEOUT_S)
    assert result.returncode == 0, explain(result, proxy)
    assert REPLY in result.stdout, explain(result, proxy)
    posts = model_posts_ok(proxy, "/v1/chat/completions")
    # Without defaultCompletionOptions.maxTokens cn sends no max_tokens and a reply runs to its own limit.
    assert all(e.body.get("max_tokens") == CONTINUE_MAX_TOKENS for e in posts), [e.body.get("max_tokens")
                                                                                 for e in posts]
    assert not off_host(peers, (CONTINUE_VERSION_HOST,)), peers


# ---------------------------------------------------------------------------------------------------------
# Cline CLI -> /v1/chat/completions (provider "openai-compatible")


def cline_home(tmp_path: Path) -> Path:
    """docs/agents.md's global settings: telemetry and auto-update off (without them the CLI looks up its
    telemetry hosts on every start)."""
    settings = tmp_path / ".cline" / "data" / "settings" / "global-settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"telemetryOptOut": True, "autoUpdateEnabled": False}))
    return tmp_path


def cline_daemons(home: Path) -> list[int]:
    """The background "hub" daemons a Cline run under this HOME left (the CLI starts one and leaves it running)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--cline-hub-daemon" in cmdline and f"HOME={home}".encode() in environ:
            found.append(int(proc.name))
    return found


def _cline(tmp_path: Path, proxy: RecordingProxy, server, prompt: str):
    from netwatch import run_watched

    binary = cli("cline")
    home = cline_home(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    try:
        auth, auth_peers = run_watched([str(binary), "auth", "-p", "openai-compatible", "-b", f"{proxy.url}/v1", "-k",
                                        server.api_key, "-m", server.served_model_name], env, work, CLI_TIMEOUT_S)
        assert auth.returncode == 0, explain(auth, proxy)
        result, peers = run_watched([str(binary), "-t", str(CLI_TIMEOUT_S - 60), prompt], env, work, CLI_TIMEOUT_S)
    finally:
        stop_cline_daemons(home)
    return result, auth_peers | peers


def stop_cline_daemons(home: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in cline_daemons(home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while cline_daemons(home) and time.monotonic() < deadline:
            time.sleep(0.2)


def test_cline_plain_turn_stays_on_the_machine(agents_server, tmp_path):
    with RecordingProxy(agents_server.base_url, steer("/v1/chat/completions")) as proxy:
        result, peers = _cline(tmp_path, proxy, agents_server, "Say hello.")
    assert result.returncode == 0, explain(result, proxy)
    assert REPLY in result.stdout, explain(result, proxy)
    model_posts_ok(proxy, "/v1/chat/completions")
    assert not off_host(peers), peers
    assert not cline_daemons(tmp_path)


def test_cline_tool_call_round_trip(agents_server, tmp_path):
    rewrite = steer("/v1/chat/completions", _chat_has_tool_message,
                    {"type": "function", "function": {"name": "read_files"}}, _offers("read_files"))
    with RecordingProxy(agents_server.base_url, rewrite) as proxy:
        result, peers = _cline(tmp_path, proxy, agents_server, "Read the README.")
    assert result.returncode == 0, explain(result, proxy)
    posts = model_posts_ok(proxy, "/v1/chat/completions")
    assert any(e.body and isinstance(e.body.get("tool_choice"), dict) for e in posts), proxy.summary()
    assert any(e.body and _chat_has_tool_message(e.body) for e in posts), f"no tool result came back: {proxy.summary()}"
    assert not off_host(peers), peers


# ---------------------------------------------------------------------------------------------------------
# Python CLIs (requirements/python-clis.txt), one virtualenv each under .venv-clients/ (scripts/test.py)

PYTHON_CLIS = Path(os.environ.get("HYPERQWEN_PYTHON_CLIS", REPO_ROOT / ".venv-clients"))


def python_cli(dist: str, name: str) -> Path:
    path = PYTHON_CLIS / dist / "bin" / name
    if not path.exists():
        pytest.skip(f"{dist} is not installed under {PYTHON_CLIS / dist} (PyPI unreachable?): python3 scripts/test.py "
                    "installs requirements/python-clis.txt")
    return path


def aider_metadata(tmp_path: Path, server) -> Path:
    """The model metadata file docs/agents.md gives: without it aider warns 'Unknown context window size'."""
    path = tmp_path / "aider-model-metadata.json"
    path.write_text(json.dumps({f"openai/{server.served_model_name}": {
        "max_input_tokens": 65536, "max_output_tokens": 8192, "max_tokens": 8192, "input_cost_per_token": 0,
        "output_cost_per_token": 0, "litellm_provider": "openai", "mode": "chat"}}))
    return path


def test_aider_plain_turn_stays_on_the_machine(agents_server, tmp_path):
    from netwatch import run_watched

    binary = python_cli("aider-chat", "aider")
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with RecordingProxy(agents_server.base_url, steer("/v1/chat/completions")) as proxy:
        result, peers = run_watched(
            [str(binary), "--openai-api-base", f"{proxy.url}/v1", "--openai-api-key", agents_server.api_key,
             "--model", f"openai/{agents_server.served_model_name}",
             "--model-metadata-file", str(aider_metadata(tmp_path, agents_server)),
             "--no-check-update", "--analytics-disable", "--no-git", "--yes-always", "--message", "Say hello."],
            env, work, CLI_TIMEOUT_S)
    assert result.returncode == 0, explain(result, proxy)
    assert REPLY in result.stdout, explain(result, proxy)
    assert "Unknown context window" not in result.stdout + result.stderr, explain(result, proxy)
    model_posts_ok(proxy, "/v1/chat/completions")
    assert not off_host(peers), peers
