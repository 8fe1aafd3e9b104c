"""RAM_CACHE (host-RAM conversation cache): the planner refuses what the host cannot pin."""

from __future__ import annotations

import json

from hyperqwen.config.settings import resolve_settings
from hyperqwen.config.sizes import GiB
from hyperqwen.memory import Outcome, parse_gpu, plan_memory
from hyperqwen.memory.cli import main as plan_main
from hyperqwen.memory.host import SERVER_HOST_BYTES, HostFacts, read_host_facts

HOST = HostFacts(64 * GiB, 48 * GiB, source="test host")


def plan(env, host=HOST):
    return plan_memory(resolve_settings(env, mode="single"), parse_gpu("rtx3090"), host=host)


def test_ram_cache_that_fits():
    b = plan({"RAM_CACHE": "16GiB"})
    assert b.fits and b.resolved["ram_cache"].startswith("16.00 GiB of 48.00 GiB")


def test_ram_cache_larger_than_the_host_is_refused_with_the_largest_that_fits():
    b = plan({"RAM_CACHE": "60GiB"})
    assert b.outcome is Outcome.REFUSES_BOOT and any("RAM_CACHE=60.0 GiB" in p for p in b.problems)
    largest = (48 * GiB - SERVER_HOST_BYTES) // GiB
    assert f"RAM_CACHE={largest}GiB (the largest whole GiB that fits)" in b.fix_hints
    assert plan({"RAM_CACHE": f"{largest}GiB"}).fits


def test_ram_cache_needs_prefix_caching():
    b = plan({"RAM_CACHE": "8GiB", "PREFIX_CACHE": "false"})
    assert b.outcome is Outcome.REFUSES_BOOT and any("PREFIX_CACHE=true" in p for p in b.problems)


def test_off_by_default_and_unchecked_without_host_facts():
    assert plan({}).resolved["ram_cache"] == "off"
    assert "not checked" in plan({"RAM_CACHE": "8GiB"}, host=None).resolved["ram_cache"]


def test_wsl2_warns_about_pinned_memory():
    b = plan({"RAM_CACHE": "8GiB"}, host=HostFacts(64 * GiB, 48 * GiB, wsl2=True))
    assert b.fits and any("WSL2" in h for h in b.fix_hints)


def test_reads_this_hosts_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\nMemFree:  1 kB\nMemAvailable:   32768000 kB\n")
    version = tmp_path / "version"
    version.write_text("Linux version 5.15.153.1-microsoft-standard-WSL2")
    h = read_host_facts(meminfo, version)
    assert h == HostFacts(65536000 * 1024, 32768000 * 1024, True, str(meminfo))
    assert read_host_facts(tmp_path / "missing") is None


def test_cli_host_ram(capsys):
    assert plan_main(["--json", "--host-ram", "16GiB", "--set", "RAM_CACHE=32GiB"]) == 4
    out = json.loads(capsys.readouterr().out)
    assert out["outcome"] == "vLLM would refuse to boot" and "RAM_CACHE" in " ".join(out["problems"])
    assert plan_main(["--host-ram", "lots"]) == 2
    assert "--host-ram='lots'" in capsys.readouterr().err
