"""Command-line behaviour: clear errors, exit codes, atomic result files, no key in output."""

from __future__ import annotations

import json
import subprocess
import sys

from hyperqwen.bench.cli import main


def test_bad_url_names_the_option(capsys):
    assert main(["bench", "chat", "--url", "localhost:18020"]) == 2
    assert "--url must start with http://" in capsys.readouterr().err


def test_unreachable_server_is_exit_2_without_traceback(capsys):
    assert main(["bench", "gates", "--url", "http://127.0.0.1:9", "--api-key", "k-should-not-show-1234"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:9/v1/models" in err and "k-should-not-show-1234" not in err


def test_bad_concurrency_value(fake_openai_server, capsys):
    code = main(["bench", "chat", "--url", fake_openai_server.base_url, "--api-key", fake_openai_server.config.api_key,
                 "--concurrency", "1,x"])
    assert code == 2 and "--concurrency must be a comma-separated list" in capsys.readouterr().err


def test_result_written_atomically_and_key_masked(fake_openai_server, tmp_path, capsys):
    out = tmp_path / "r" / "chat.json"
    key = fake_openai_server.config.api_key
    code = main(["bench", "chat", "--url", fake_openai_server.base_url, "--api-key", key, "--concurrency", "1",
                 "--requests", "1", "--max-tokens", "4", "--out", str(out), "--hardware", "cpu"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "hyperqwen-bench/1" and doc["environment"]["hardware"] == "cpu"
    assert not list(out.parent.glob("*.tmp"))
    captured = capsys.readouterr()
    assert key not in captured.err + captured.out + out.read_text()


BLOCK_AIOHTTP = "import sys; sys.modules['aiohttp'] = None; from hyperqwen.bench.cli import main; "


def _without_aiohttp(code: str) -> subprocess.CompletedProcess:
    # A fresh interpreter where `import aiohttp` fails, as on `pip install hyperqwen` without the bench extra.
    return subprocess.run([sys.executable, "-c", BLOCK_AIOHTTP + code], capture_output=True, text=True, timeout=60)


def test_help_needs_no_bench_extra():
    result = _without_aiohttp("main(['bench', '--help'])")
    assert result.returncode == 0 and "suite" in result.stdout and "Traceback" not in result.stderr
    result = _without_aiohttp("main(['bench', 'suite', '--help'])")
    assert result.returncode == 0 and "--quick" in result.stdout


def test_running_without_the_bench_extra_names_it():
    result = _without_aiohttp("sys.exit(main(['bench', 'chat', '--url', 'http://127.0.0.1:9']))")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "pip install 'hyperqwen[bench]'" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = _without_aiohttp("sys.exit(main(['bench', 'suite', '--url', 'http://127.0.0.1:9']))")
    assert result.returncode == 2 and "pip install 'hyperqwen[bench]'" in result.stderr


def test_workload_list_matches_the_functions():
    from hyperqwen.bench.cli import WORKLOAD_DOCS
    from hyperqwen.bench.workloads import WORKLOADS

    assert list(WORKLOAD_DOCS) == list(WORKLOADS)
