"""Engine failures on the real CPU build: a stalled engine turns /health red and the server exits, so compose's
restart policy restarts it (patch 0040); an engine that dies during start makes `hyperqwen serve` exit non-zero
promptly (stock vLLM 0.32.0 already does: its start-up wait polls the engine processes' sentinels).

The stall is made on purpose: SIGSTOP on the engine core process of a server started for this test (a
stopped process is alive, holds its sockets and answers nothing: what a hung kernel looks like from outside).
The start-up failure is a SIGKILL of the engine core while the server is still starting, with the engine's
worker stopped first so it cannot finish or clean up anything in between.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.server]

STALL_TIMEOUT_S = 6
# Detection bound: one probe interval (<= timeout/3, min 1 s) + the probe timeout + the launcher's 5 s watchdog,
# plus slack for a loaded 2-core machine.
RED_WITHIN_S = STALL_TIMEOUT_S + 2 + 5 + 20
# Exit bound: red + vLLM's shutdown, which waits for the stopped engine before killing it.
EXIT_WITHIN_S = RED_WITHIN_S + 60


def engine_core(server_pid: int, timeout_s: float = 300) -> psutil.Process:
    """The engine core: the launcher's descendant whose process title names it (VLLM::EngineCore)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in psutil.Process(server_pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "EngineCore" in " ".join(proc.cmdline()) or "EngineCore" in proc.name():
                        return proc
        time.sleep(0.5)
    pytest.fail(f"no EngineCore process under pid {server_pid} within {timeout_s:.0f} s")


def health(base_url: str) -> int | None:
    try:
        return requests.get(f"{base_url}/health", timeout=5).status_code
    except requests.RequestException:
        return None  # not listening any more: as red as a 503


@pytest.mark.needs_patch("0040-engine-stall-sentinel.patch")
def test_stalled_engine_turns_health_red_and_the_server_exits(server_factory):
    with server_factory("stall", "smollm2", {"DTYPE": "float32", "SPEC": "none",
                                             "ENGINE_STALL_TIMEOUT": str(STALL_TIMEOUT_S)}) as server:
        assert health(server.base_url) == 200
        core = engine_core(server.process.pid)
        # Still green after several probe intervals while the engine answers (the sentinel is not trigger-happy).
        time.sleep(STALL_TIMEOUT_S + 4)
        assert health(server.base_url) == 200
        core.send_signal(signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            while health(server.base_url) == 200:
                waited = time.monotonic() - stopped
                assert waited < RED_WITHIN_S, f"/health still green {RED_WITHIN_S} s after the stall"
                time.sleep(1)
            red_after = time.monotonic() - stopped
            try:
                code = server.process.wait(timeout=max(1.0, EXIT_WITHIN_S - red_after))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the server did not exit within {EXIT_WITHIN_S} s of the stall\n{server.log_tail(40)}")
            log = server.log_text()
            assert "did not answer a health probe" in log and "HYPERQWEN_ENGINE_STALL_TIMEOUT" in log
            print(f"/health red {red_after:.1f} s after SIGSTOP; server exited with {code} after "
                  f"{time.monotonic() - stopped:.1f} s")
        finally:
            with contextlib.suppress(psutil.Error):
                core.send_signal(signal.SIGCONT)
                core.kill()


def integration_conftest(config: pytest.Config):
    """tests/integration/conftest.py as pytest loaded it (its server helpers)."""
    wanted = Path(__file__).resolve().parents[1] / "conftest.py"
    for plugin in config.pluginmanager.get_plugins():
        if Path(getattr(plugin, "__file__", "") or "/").resolve() == wanted:
            return plugin
    pytest.fail(f"{wanted} is not loaded")


def test_engine_killed_during_start_makes_serve_exit_nonzero_promptly(request, test_models, server_log_dir):
    fixtures = integration_conftest(request.config)
    free_port, launcher_command, server_env = fixtures.free_port, fixtures.launcher_command, fixtures.server_env
    knobs = {**fixtures.BASE_KNOBS, "DTYPE": "float32", "SPEC": "none", "MODEL": str(test_models["smollm2"]),
             "PORT": str(free_port()), "VLLM_API_KEY": "hq-test-start-kill"}
    command, _ = launcher_command()
    log_path = server_log_dir / "engine-killed-during-start.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, env=server_env(knobs), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(server_log_dir), start_new_session=True)
    stopped: list[psutil.Process] = []
    try:
        core = engine_core(proc.pid)
        time.sleep(2)  # inside its start-up (loading, warm-up), long before it reports ready
        # Stop its worker(s) first: they stay alive, as a hung worker would, while the engine dies.
        with contextlib.suppress(psutil.Error):
            stopped = core.children(recursive=True)
        for child in stopped:
            with contextlib.suppress(psutil.Error):
                child.send_signal(signal.SIGSTOP)
        core.kill()
        killed = time.monotonic()
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("`hyperqwen serve` still running 60 s after its engine core died during start:\n"
                        + log_path.read_text()[-3000:])
        print(f"engine children stopped: {len(stopped)}; serve exited with {code} "
              f"{time.monotonic() - killed:.1f} s after the kill")
        assert code != 0
        assert "Engine core initialization failed" in log_path.read_text()
    finally:
        for child in stopped:
            with contextlib.suppress(psutil.Error):
                child.kill()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
