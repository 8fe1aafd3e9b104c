"""Real vLLM CPU servers for the integration tests, started through `hyperqwen serve`.

Each server fixture is session-scoped: the first test that needs it starts it (about 50-250 s on 2 cores,
torch.compile skipped via EXTRA_ARGS=--enforce-eager), later tests reuse it, and it is terminated as soon
as no remaining test needs it (or at session end). Knobs reach the launcher as environment variables,
exactly as compose passes them. Every server writes its log to a file under one temp folder per session
(printed at the end of the session and attached to any failing test's report).

Servers (SERVER_PRESETS below; fewest distinct starts that cover every behaviour):
- smol_server: SmolLM2-135M-Instruct in float32, no speculation. Meaningful answers: SDK/API tests.
- tiny_qwen_prefix_server: tiny Qwen3.5 model in bfloat16, prefix caching on, SPEC=none, fp16 GDN state.
  Prefix-cache and thinking tests, and the greedy reference for the MTP exactness test.
- tiny_qwen_mtp_server: the same model with SPEC=mtp and prefix caching off.
- agents_server: the tiny model at MAX_LEN 65536 with a 1 s stream keep-alive: the real coding-agent CLIs (their
  prompts are tens of thousands of tokens) and the keep-alive/long-prefill tests (test_agents_*.py).
- recall_mtp_prefix_server: tiny-qwen-recall (a variant whose every prediction needs the previous step's GDN
  state) with SPEC=mtp and prefix caching on, the single-mode default; runs on CPU with patch 0030.
- recall_mtp_lookup_server: the same with SPEC=mtp+lookup (patch 0031); smol_lookup_server: SmolLM2 with
  SPEC=ngram. Drafting from the context (test_spec_context_lookup.py).

Environment overrides: HYPERQWEN_TEST_MODELS (model cache), HYPERQWEN_TEST_SERVER_TIMEOUT (seconds to wait
for /health, default 600), HYPERQWEN_TEST_LOG_DIR (keep server logs there instead of a temp folder).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SERVED_MODEL_NAME = "qwen3.8-27b"
REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = float(os.environ.get("HYPERQWEN_TEST_SERVER_TIMEOUT", "600"))

# Knobs shared by every test server: what a single-mode compose service would pass, shrunk for a 2-core CPU.
BASE_KNOBS = {
    "MODE": "single",
    "BIND": "127.0.0.1",
    "SERVED_MODEL_NAME": SERVED_MODEL_NAME,
    "STATE_DTYPE": "float16",
    "MAX_LEN": "2048",
    "MAX_SEQS": "16",
    # vLLM CPU build: KV cache pool in GiB (DESIGN.md 4).
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # Skip torch.compile: its warm-up dominates a CPU server's start (minutes on a busy 2-core machine)
    # and the GPU image compiles with a different backend anyway. Passed through the real EXTRA_ARGS knob.
    # HYPERQWEN_TEST_EXTRA_ARGS overrides it (set it empty to test the compiled CPU path).
    "EXTRA_ARGS": os.environ.get("HYPERQWEN_TEST_EXTRA_ARGS", "--enforce-eager"),
}

SMOL_KNOBS = {"DTYPE": "float32", "SPEC": "none", "PREFIX_CACHE": "1"}
TINY_QWEN_PREFIX_KNOBS = {"DTYPE": "bfloat16", "SPEC": "none", "PREFIX_CACHE": "1"}
TINY_QWEN_MTP_KNOBS = {"DTYPE": "bfloat16", "SPEC": "mtp", "DRAFT_TOKENS": "3", "PREFIX_CACHE": "0"}
# Coding agents (test_agents_*.py): their prompts are 20-80k tokens (Claude Code: 24 tools, ~76 KB), so the tiny
# model at a long context; small prefill chunks and a 1 s keep-alive so a CPU prefill is long enough to observe.
# The tiny model's config says 4096 positions; its random weights do not care, so vLLM is told to allow more.
# EMBED_ON_HOST rides along (test_embed_on_host.py): the UVA offloader and patch 0065 on the CPU build.
AGENTS_KNOBS = {"DTYPE": "bfloat16", "SPEC": "none", "PREFIX_CACHE": "1", "MAX_LEN": "65536",
                "MAX_BATCHED_TOKENS": "2048", "STREAM_KEEPALIVE": "1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
                "EMBED_ON_HOST": "1"}
# Long context (test_long_context.py): the tiny Qwen3.5 with prefill in 256-token chunks, to compare with the
# single-chunk prefill of tiny_qwen_prefix_server (MAX_BATCHED_TOKENS 2048 >= its MAX_LEN).
# Prefill progress (patch 0060, test_long_context_progress.py) is polled every 20 ms here instead of every 1 s:
# the 8 chunks of a 1,900-token prompt took 0.3-0.8 s on the CPU build (measured).
TINY_QWEN_CHUNKED_KNOBS = {**TINY_QWEN_PREFIX_KNOBS, "MAX_BATCHED_TOKENS": "256", "STREAM_PROGRESS": "0.02"}
# The single-mode default (MTP + prefix caching) on the state-sensitive recall model (support.testmodels).
RECALL_MTP_PREFIX_KNOBS = {"DTYPE": "bfloat16", "SPEC": "mtp", "DRAFT_TOKENS": "3", "PREFIX_CACHE": "1"}
# Drafting from the context (test_spec_context_lookup.py): MTP + prompt lookup (patch 0031) with prefix caching on
# the recall model (an 8-token verify block, 3 of it from the MTP head), and vLLM's plain prompt lookup on SmolLM2.
RECALL_MTP_LOOKUP_KNOBS = {**RECALL_MTP_PREFIX_KNOBS, "SPEC": "mtp+lookup", "LOOKUP_TOKENS": "8"}
SMOL_LOOKUP_KNOBS = {**SMOL_KNOBS, "SPEC": "ngram", "LOOKUP_TOKENS": "8"}


def pytest_collection_modifyitems(config, items):
    """Everything here needs the vLLM CPU build."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)


# ---------------------------------------------------------------------------------------------------------
# Server handles


@dataclass
class Server:
    name: str
    base_url: str
    api_key: str
    served_model_name: str
    model_dir: Path
    log_path: Path
    knobs: dict[str, str]
    process: subprocess.Popen | None = field(default=None, repr=False)
    launcher: str = "hyperqwen serve"
    env: dict[str, str] = field(default_factory=dict, repr=False)  # holds the key: never print it
    fixture_name: str | None = None  # set for session fixtures: stopped early once no test needs it

    @property
    def v1_url(self) -> str:
        return f"{self.base_url}/v1"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 150) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def planned_vllm_args(self) -> list[str]:
        """The vLLM arguments `hyperqwen serve` built for this server (same knobs, same code path)."""
        from hyperqwen.config.load import load_settings
        from hyperqwen.launch.command import build_command

        settings = load_settings(self.env, mode=self.knobs["MODE"], env_file=None)
        return list(build_command(settings, api_key=self.api_key).vllm_args)

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def greedy_token_ids(self, prompt: str | list[int], max_tokens: int, timeout: float = 600) -> list[int]:
        """Exactly max_tokens greedy token ids from /v1/completions (EOS ignored), for token-for-token checks."""
        import requests

        response = requests.post(
            f"{self.v1_url}/completions",
            headers={"Authorization": f"Bearer {self.api_key}"},
            json={"model": self.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                  "ignore_eos": True, "return_token_ids": True},
            timeout=timeout,
        )
        response.raise_for_status()
        token_ids = response.json()["choices"][0]["token_ids"]
        assert len(token_ids) == max_tokens, (len(token_ids), max_tokens, token_ids)
        return token_ids

    def openai(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.v1_url, api_key=self.api_key, max_retries=0, timeout=120, **kwargs)

    def async_openai(self, **kwargs):
        import openai

        return openai.AsyncOpenAI(base_url=self.v1_url, api_key=self.api_key, max_retries=0, timeout=300, **kwargs)

    def metric_samples(self) -> list:
        """Every sample of `/metrics` (prometheus_client's parser), read with the key, whatever its protection."""
        import requests
        from prometheus_client.parser import text_string_to_metric_families

        response = requests.get(
            f"{self.base_url}/metrics", headers={"Authorization": f"Bearer {self.api_key}"}, timeout=30
        )
        response.raise_for_status()
        return [sample for family in text_string_to_metric_families(response.text) for sample in family.samples]

    def metrics(self) -> dict[str, float]:
        """`/metrics` summed by sample name (labels folded)."""
        totals: dict[str, float] = {}
        for sample in self.metric_samples():
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
        return totals

    def spec_metrics(self) -> dict[str, float]:
        """The speculative-decoding and prefix-cache counters of metrics()."""
        return {k: v for k, v in self.metrics().items() if k.startswith(("vllm:spec_decode", "vllm:prefix_cache"))}

    def accepted_per_position(self) -> dict[int, float]:
        """Accepted draft tokens by draft position (the `position` label metrics() folds), summed over engines."""
        out: dict[int, float] = {}
        for sample in self.metric_samples():
            if sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                position = int(sample.labels["position"])
                out[position] = out.get(position, 0.0) + float(sample.value)
        return out


@pytest.fixture(scope="module")
def single_process_group():
    """vLLM layers ask for their tensor-parallel rank: a real 1-process gloo group answers (no server)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        with set_current_vllm_config(VllmConfig()):
            yield
        return
    with set_current_vllm_config(VllmConfig()):
        parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                                    distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                                                    backend="gloo")
        parallel_state.initialize_model_parallel(1, 1)
        yield
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _hyperqwen_serve_available() -> bool:
    try:
        import hyperqwen.launch.serve  # noqa: F401
    except ImportError:
        return False
    return True


def launcher_command() -> tuple[list[str], str]:
    """The command that starts a server from knobs in the environment: `hyperqwen serve --mode single`."""
    if not _hyperqwen_serve_available():
        pytest.fail(
            "hyperqwen.launch.serve is not importable; the integration servers start only through "
            "`hyperqwen serve` (install the package: pip install -e .[test])"
        )
    script = Path(sys.executable).with_name("hyperqwen")
    if script.exists():
        return [str(script), "serve", "--mode", "single"], "hyperqwen serve"
    return [sys.executable, "-m", "hyperqwen.cli", "serve", "--mode", "single"], "python -m hyperqwen.cli serve"


def server_env(knobs: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # Knobs the developer's shell might carry must not leak into the test servers.
    for name in ("VLLM_API_KEY", "API_KEY_FILE", "EXTRA_ARGS", "THINKING", "TOOLS", "KV", "CTX", "KV_MEM"):
        env.pop(name, None)
    env.update(knobs)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _wait_healthy(server: Server, timeout_s: float) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.is_alive():
            raise RuntimeError(
                f"server {server.name} exited with code {server.process.returncode} before /health answered"
            )
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{server.base_url}/health", timeout=5).status_code == 200:
                return
        time.sleep(1.0)
    raise RuntimeError(f"server {server.name} did not answer /health within {timeout_s:.0f} s")


def stop_server(server: Server) -> None:
    proc = server.process
    if proc is None or proc.poll() is not None:
        return
    # The launcher execs vLLM, which forks an engine core: stop the whole process group we created.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# A machine-wide limit on test sessions that run vLLM servers at once: each CPU server holds ~4-5 GiB of RAM,
# and several developers' (or CI's) sessions on one 24 GiB machine would otherwise run it out of memory.
# A session takes one slot (a flock'd file) with its first server and gives it back with its last, so one
# session may run several servers but never waits on itself.
SERVER_SLOTS = int(os.environ.get("HYPERQWEN_SERVER_SLOTS", "3"))
SLOT_WAIT_S = 3600
_slot_fd: int | None = None


def _acquire_machine_slot() -> None:
    global _slot_fd
    if _slot_fd is not None:
        return
    import fcntl
    import tempfile

    deadline = time.monotonic() + SLOT_WAIT_S
    announced = False
    while True:
        for index in range(max(SERVER_SLOTS, 1)):
            fd = os.open(Path(tempfile.gettempdir()) / f"hyperqwen-server-slot-{index}.lock", os.O_CREAT | os.O_RDWR,
                         0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _slot_fd = fd
            return
        if time.monotonic() > deadline:
            pytest.fail(f"no vLLM server slot freed within {SLOT_WAIT_S} s (HYPERQWEN_SERVER_SLOTS={SERVER_SLOTS})")
        if not announced:
            print(f"\n[conftest] {SERVER_SLOTS} other test sessions run vLLM servers; waiting for a slot", flush=True)
            announced = True
        time.sleep(5)


def _release_machine_slot() -> None:
    global _slot_fd
    if _slot_fd is not None and not _RUNNING:
        os.close(_slot_fd)
        _slot_fd = None


def start_server(name: str, model_dir: Path, knobs: dict[str, str], log_dir: Path,
                 api_key: str | None = None) -> Server:
    _acquire_machine_slot()
    port = free_port()
    # api_key: replicas behind one router share one key (as they share api_key.txt); default: a fresh one.
    api_key = api_key or "hq-test-" + secrets.token_hex(16)
    all_knobs = {**BASE_KNOBS, **knobs, "MODEL": str(model_dir), "PORT": str(port), "VLLM_API_KEY": api_key}
    command, launcher = launcher_command()
    log_path = log_dir / f"{name}.log"
    server = Server(
        name=name,
        base_url=f"http://127.0.0.1:{port}",
        api_key=api_key,
        served_model_name=SERVED_MODEL_NAME,
        model_dir=model_dir,
        log_path=log_path,
        knobs={k: v for k, v in all_knobs.items() if k != "VLLM_API_KEY"},
        launcher=launcher,
        env=server_env(all_knobs),
    )
    log_path.write_text(f"# {launcher}: {' '.join(command)}\n# knobs: {server.knobs}\n")
    # Append mode for the server too, so our own notes (healthy after N s) are never overwritten.
    with log_path.open("a") as log:
        server.process = subprocess.Popen(
            command,
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(log_dir),
            start_new_session=True,
        )
    _RUNNING.append(server)
    _LOG_DIRS.add(log_dir)
    started = time.monotonic()
    try:
        _wait_healthy(server, STARTUP_TIMEOUT_S)
    except RuntimeError as exc:
        _discard(server)
        pytest.fail(f"{exc}\n--- {log_path} (last lines) ---\n{server.log_tail()}", pytrace=False)
    except BaseException:  # Ctrl-C while waiting: never leave a server behind
        _discard(server)
        raise
    with log_path.open("a") as log:
        log.write(f"# healthy after {time.monotonic() - started:.1f} s\n")
    return server


def _discard(server: Server) -> None:
    stop_server(server)
    if server in _RUNNING:
        _RUNNING.remove(server)
    _release_machine_slot()


_RUNNING: list[Server] = []
_LOG_DIRS: set[Path] = set()


# ---------------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def server_log_dir(tmp_path_factory) -> Path:
    configured = os.environ.get("HYPERQWEN_TEST_LOG_DIR")
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def test_models() -> dict[str, Path]:
    """Both test models, built on first use and cached (`PYTHONPATH=tests python -m support.testmodels`)."""
    from support import testmodels

    try:
        return testmodels.ensure_test_models()
    except testmodels.TestModelError as exc:
        pytest.fail(str(exc), pytrace=False)


@contextlib.contextmanager
def running_server(name: str, model_dir: Path, knobs: dict[str, str], log_dir: Path,
                   fixture_name: str | None = None, api_key: str | None = None) -> Iterator[Server]:
    server = start_server(name, model_dir, knobs, log_dir, api_key)
    server.fixture_name = fixture_name
    try:
        yield server
    finally:
        _discard(server)


@pytest.fixture(scope="session")
def server_factory(test_models, server_log_dir):
    """For a test that needs its own short-lived server: `with server_factory(name, model, knobs) as server:`.

    model is a key of `test_models` ("smollm2" or "tiny-qwen"); knobs are added to BASE_KNOBS.
    """

    def factory(name: str, model: str, knobs: dict[str, str], api_key: str | None = None):
        return running_server(name, test_models[model], knobs, server_log_dir, api_key=api_key)

    return factory


@dataclass(frozen=True)
class ServerPreset:
    """One session server: the log name, the test model it serves (a key of `test_models`) and the knobs
    added to BASE_KNOBS. The fixture named by its key in SERVER_PRESETS starts it (as llama.cpp's server tests
    keep their ServerPreset table)."""

    name: str
    model: str
    knobs: dict[str, str]
    doc: str = ""


# Fixture name -> preset: the one table of session servers (the module docstring says why each exists).
SERVER_PRESETS: dict[str, ServerPreset] = {
    "smol_server": ServerPreset("smollm2", "smollm2", SMOL_KNOBS),
    "tiny_qwen_prefix_server": ServerPreset("tiny-qwen-prefix", "tiny-qwen", TINY_QWEN_PREFIX_KNOBS),
    "tiny_qwen_chunked_server": ServerPreset("tiny-qwen-chunked", "tiny-qwen", TINY_QWEN_CHUNKED_KNOBS),
    "tiny_qwen_mtp_server": ServerPreset("tiny-qwen-mtp", "tiny-qwen", TINY_QWEN_MTP_KNOBS),
    "recall_mtp_prefix_server": ServerPreset(
        "recall-mtp-prefix", "tiny-qwen-recall", RECALL_MTP_PREFIX_KNOBS,
        "tiny-qwen-recall with SPEC=mtp and prefix caching on (needs patch 0030 on the CPU build).",
    ),
    "recall_mtp_lookup_server": ServerPreset(
        "recall-mtp-lookup", "tiny-qwen-recall", RECALL_MTP_LOOKUP_KNOBS,
        "tiny-qwen-recall with SPEC=mtp+lookup and prefix caching on (needs patches 0030 and 0031).",
    ),
    "smol_lookup_server": ServerPreset(
        "smollm2-lookup", "smollm2", SMOL_LOOKUP_KNOBS,
        "SmolLM2 with SPEC=ngram (vLLM's prompt lookup); smol_server is its no-speculation reference.",
    ),
    "agents_server": ServerPreset("agents", "tiny-qwen", AGENTS_KNOBS),
}


def _preset_fixture(fixture_name: str, preset: ServerPreset):
    """The one session fixture body every preset shares."""

    def preset_server(test_models, server_log_dir) -> Iterator[Server]:
        with running_server(preset.name, test_models[preset.model], preset.knobs, server_log_dir,
                            fixture_name) as server:
            yield server

    preset_server.__doc__ = preset.doc or f"{preset.model} with {preset.knobs} (on top of BASE_KNOBS)"
    return pytest.fixture(scope="session", name=fixture_name)(preset_server)


for _fixture_name, _preset in SERVER_PRESETS.items():
    globals()[_fixture_name] = _preset_fixture(_fixture_name, _preset)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop a session server as soon as no remaining test needs it.

    Session fixtures normally live until the session ends; on a 2-core machine an idle vLLM server still
    costs RAM and some CPU while the next model's server starts, so it goes early. (Its fixture finalizer
    later finds it stopped; nothing is restarted because no later test asks for it.)
    """
    if nextitem is None or not _RUNNING:
        return
    items = item.session.items
    try:
        remaining = items[items.index(item) + 1:]
    except ValueError:
        return
    for server in list(_RUNNING):
        if server.fixture_name and not any(server.fixture_name in it.fixturenames for it in remaining):
            _discard(server)


# ---------------------------------------------------------------------------------------------------------
# Logs on failure


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    for value in funcargs.values():
        if isinstance(value, Server):
            report.sections.append((f"server log: {value.name} ({value.log_path})", value.log_tail()))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if exitstatus == 0:
        return
    for log_dir in sorted(_LOG_DIRS):
        terminalreporter.write_line(f"integration server logs kept in {log_dir}")


def pytest_sessionfinish(session, exitstatus):
    # Safety net: a server whose fixture never tore down (e.g. interrupted session) is still stopped.
    for server in list(_RUNNING):
        stop_server(server)
