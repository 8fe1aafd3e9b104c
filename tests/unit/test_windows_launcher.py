"""windows/Start-HyperQwen.{cmd,ps1}: PowerShell cannot run here, so check what can be checked.

The script is parsed with the tree-sitter PowerShell grammar (a syntax check, not PowerShell's own parser),
and its contract with compose.yaml and the docs is checked by reading it.
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
    assert "/health" in text and "docker compose @profiles down" in text
    # LAN addresses only behind the exposure check.
    lan = text.index("Get-NetIPAddress")
    assert text.rfind("if (-not (Test-Loopback $bind))", 0, lan) != -1
    # Closing the window stops the stack too (a console control handler), not only Ctrl+C.
    assert "SetConsoleCtrlHandler" in text and "ctrlType == 2" in text
