"""windows/Start-HyperQwen.{cmd,ps1}: PowerShell cannot run here, so check what can be checked.

The script is parsed with the tree-sitter PowerShell grammar (a syntax check, not PowerShell's own parser),
and its contract with compose.yaml and the docs is checked by reading it. PowerShell itself is on neither PyPI,
npm nor Debian here (its .NET global tool needs a .NET SDK this machine lacks), so the behaviour under Windows
PowerShell 5.1 and PowerShell 7 is covered by the manual checklist in docs/troubleshooting.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PS1 = REPO / "windows" / "Start-HyperQwen.ps1"
CMD = REPO / "windows" / "Start-HyperQwen.cmd"


def syntax_errors(source: bytes) -> list[str]:
    tree_sitter = pytest.importorskip("tree_sitter", reason="pip install tree-sitter tree-sitter-powershell")
    grammar = pytest.importorskip("tree_sitter_powershell", reason="pip install tree-sitter-powershell")
    tree = tree_sitter.Parser(tree_sitter.Language(grammar.language())).parse(source)
    found: list[str] = []

    def walk(node) -> None:
        if node.type == "ERROR" or node.is_missing:
            line = node.start_point[0] + 1
            found.append(f"line {line}: {source[node.start_byte:node.end_byte][:60]!r}")
        for child in node.children:
            walk(child)

    walk(tree.root_node)
    return found


def test_the_script_parses() -> None:
    assert syntax_errors(PS1.read_bytes()) == []


def test_the_syntax_check_catches_errors() -> None:
    assert syntax_errors(b"function Broken( { $x = ; }\n")


def test_cmd_calls_the_script_with_crlf_and_passes_arguments() -> None:
    raw = CMD.read_bytes()
    assert b"\r\n" in raw and raw.count(b"\n") == raw.count(b"\r\n"), "cmd.exe needs CRLF line ends"
    text = raw.decode()
    assert re.search(r'powershell\.exe .*-ExecutionPolicy Bypass -File "%~dp0Start-HyperQwen\.ps1" %\*', text)


def test_script_uses_the_compose_profiles_and_ports_of_the_stack() -> None:
    text = PS1.read_text()
    assert "[ValidateSet('single', 'batch')]" in text
    assert "'--profile', 'webui'" in text
    # Defaults match compose.yaml / the knobs.
    for name, default in (("BIND", "127.0.0.1"), ("PORT", "18020"), ("MONITOR_PORT", "18021"),
                          ("WEBUI_PORT", "18030")):
        assert f"Get-Setting $dotEnv '{name}' '{default}'" in text
    assert "/health" in text and "Invoke-Docker compose @profiles down" in text
    # LAN addresses only behind the exposure check.
    lan = text.index("Get-NetIPAddress")
    assert text.rfind("if (-not (Test-Loopback $bind))", 0, lan) != -1
    # Closing the window stops the stack too (a console control handler), not only Ctrl+C.
    assert "SetConsoleCtrlHandler" in text and "ctrlType == 2" in text


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside comments, comment-based help and the C# here-string."""
    out, in_block, in_here = [], False, False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("<#"):
            in_block = True
        if stripped.startswith("Add-Type -TypeDefinition @'"):
            in_here = True
        if not in_block and not in_here and not stripped.startswith("#"):
            out.append((number, line))
        if stripped.endswith("#>"):
            in_block = False
        if stripped == "'@":
            in_here = False
    return out


def test_docker_never_runs_under_error_action_stop() -> None:
    """Windows PowerShell 5.1 + $ErrorActionPreference='Stop' + a redirected native stderr line = a terminating
    error (so "Docker is not answering" never showed). Every docker call goes through the two helpers, which
    switch to 'Continue' and judge by the exit code, or runs in a log job that does the same."""
    text = PS1.read_text()
    assert "$ErrorActionPreference = 'Stop'" in text
    for name in ("Invoke-Docker", "Get-DockerOutput"):
        body = text[text.index(f"function {name}"):]
        body = body[:body.index("\n}\n")]
        assert "$ErrorActionPreference = 'Continue'" in body and "finally" in body and "$LASTEXITCODE" in body
    direct = [(n, line) for n, line in code_lines(text) if re.search(r"&\s*docker\b", line)]
    # Inside the helpers (2) and the log job, which sets 'Continue' itself.
    assert len(direct) == 3, direct
    job = text[text.index("function Start-LogJob"):]
    assert job.index("$ErrorActionPreference = 'Continue'") < job.index("& docker")
    assert 'ForEach-Object { "$_" }' in job, "job output must be strings, not error records"
    assert "Get-DockerOutput version" in text  # the engine probe


def test_a_failed_start_keeps_prepares_log() -> None:
    text = PS1.read_text()
    final = text[text.rindex("} finally {"):]
    failed, ok = final.split("} else {", 1)
    assert "logs --no-color --timestamps init prepare $Mode" in failed
    assert "Set-Content -LiteralPath $startLog" in failed
    assert "compose @profiles stop" in failed and " down" not in failed.replace("`docker compose down` would", "")
    assert "compose @profiles down" in ok
    # prepare runs first, with its log streamed, before the rest of the stack.
    order = [text.index(part) for part in ("up -d prepare", "Start-LogJob 'prepare'",
                                           "Invoke-Docker compose @profiles up -d\n")]
    assert order == sorted(order)


def test_the_script_runs_on_windows_powershell_5_1() -> None:
    """No PowerShell 7-only syntax, and ASCII only (5.1 reads a BOM-less script in the ANSI code page)."""
    raw = PS1.read_bytes()
    assert raw.isascii(), "non-ASCII characters break Windows PowerShell 5.1 on a BOM-less file"
    for number, line in code_lines(raw.decode()):
        code = re.sub(r"'[^']*'|\"[^\"]*\"", "''", line)  # ignore string contents
        for pattern, what in ((r"\?\?", "null-coalescing ??"), (r"\s&&\s|\s\|\|\s", "pipeline chain && / ||"),
                              (r"\s\?\s.*\s:\s", "ternary ?:"), (r"-Parallel\b", "ForEach-Object -Parallel")):
            assert not re.search(pattern, code), f"line {number}: {what} needs PowerShell 7: {line.strip()}"


def test_gitattributes_keeps_linux_files_lf() -> None:
    """Git for Windows' core.autocrlf would check out CRLF: verify.sh then fails in `docker build`."""
    import subprocess

    files = ["verify.sh", "Dockerfile", "compose.yaml", "patches/series", ".env.example", "src/hyperqwen/cli.py",
             "patches/0001-auth-accept-x-api-key.patch", "requirements/image-gpu.txt", "windows/Start-HyperQwen.ps1"]
    proc = subprocess.run(["git", "check-attr", "eol", "--", *files], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"git check-attr failed: {proc.stderr.strip()}")
    eol = dict(line.split(": eol: ") for line in proc.stdout.splitlines())
    assert all(eol[f] == "lf" for f in files), eol
    cmd = subprocess.run(["git", "check-attr", "eol", "--", "windows/Start-HyperQwen.cmd"], cwd=REPO,
                         capture_output=True, text=True).stdout
    assert cmd.strip().endswith("crlf")
