"""GPU facts: card names, sizes, and the one nvidia-smi reader (a fake nvidia-smi: no GPU on this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperqwen.config.sizes import GiB, MiB
from hyperqwen.memory.gpu import (
    CARDS,
    RESERVED_MAX_MIB,
    WSL2_LOSS_MIB,
    GpuError,
    GpuFacts,
    GpuQueryError,
    find_card,
    parse_gpu,
    query_nvidia_smi,
    read_gpu_facts,
)


@pytest.mark.parametrize("text", ["rtx3090", "RTX3090", "3090", "rtx-3090", "NVIDIA GeForce RTX 3090"])
def test_card_names(text):
    assert find_card(text) is CARDS["rtx3090"]


@pytest.mark.parametrize("name", ["rtx3090", "rtx4090", "rtx3090ti", "a5000", "rtx5090"])
def test_every_card_is_cuda_total_below_nvidia_smi_with_a_source(name):
    card = CARDS[name]
    assert card.linux_mib < card.smi_mib and card.wsl2_mib == card.linux_mib - WSL2_LOSS_MIB
    assert "github.com" in card.source or "derived" in card.source
    linux, wsl2 = parse_gpu(name), parse_gpu(name, wsl2=True)
    assert linux.total_bytes == card.linux_mib * MiB and wsl2.total_bytes == card.wsl2_mib * MiB
    assert "WSL2" in wsl2.source


def test_rtx3090_is_what_vllm_logged():
    # vLLM's log on a 3090: "Free memory on device (22.93/23.56 GiB)".
    assert round(parse_gpu("rtx3090").total_bytes / GiB, 2) == 23.56


def test_sizes_and_reserved():
    g = parse_gpu("24GiB", reserved="1.5GiB", wsl2=True)
    assert g.total_bytes == 24 * GiB - WSL2_LOSS_MIB * MiB
    assert g.free_bytes == g.total_bytes - int(1.5 * GiB) and "WSL2" in g.source and "other programs" in g.source
    assert parse_gpu("24GB").total_bytes == 24 * 10**9  # one unit rule: GB = 10^9


@pytest.mark.parametrize("text", ["0", "1B", "3GiB", "2TiB", "nan", "lots", "-1GiB", "rtx9999"])
def test_bad_cards_are_one_line_errors(text):
    with pytest.raises(GpuError, match=f"--gpu='{text}'") as exc:
        parse_gpu(text)
    assert "\n" not in str(exc.value)


def test_reserved_above_the_card_is_refused():
    with pytest.raises(GpuError, match="--reserved"):
        parse_gpu("rtx3090", reserved="30GiB")


def fake_nvidia_smi(bin_dir: Path, answer: str) -> None:
    """An executable printing what the real nvidia-smi prints for --query-gpu=memory.total,memory.free,name."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in *memory.total,memory.free,name*) echo '" + answer + "';;"
                   " *) echo 'bad query' >&2; exit 9;; esac\n")
    smi.chmod(0o755)


def test_read_gpu_facts_converts_nvidia_smi_to_cudas_total(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, "24576, 23117, NVIDIA GeForce RTX 3090")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    g = read_gpu_facts()
    assert g is not None and g.total_bytes == CARDS["rtx3090"].linux_mib * MiB
    assert g.free_bytes == 23117 * MiB and g.name == "NVIDIA GeForce RTX 3090" and "card table" in g.source


def test_unknown_card_loses_the_largest_measured_reservation(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, "81559, 80000, NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    g = read_gpu_facts()
    assert g is not None and g.total_bytes == (81559 - RESERVED_MAX_MIB) * MiB


def test_query_errors_are_gpu_query_errors(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, "x")
    with pytest.raises(GpuQueryError, match="bad query"):
        query_nvidia_smi("index,name", exe=str(tmp_path / "nvidia-smi"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(GpuQueryError, match="not on PATH"):
        query_nvidia_smi("index")


def test_no_gpu_here_means_no_facts():
    assert read_gpu_facts() is None  # no nvidia-smi and no CUDA on this machine: "unknown", not a guess


def test_nominal_card():
    assert GpuFacts.nominal(24 * GiB).free_bytes == 24 * GiB
