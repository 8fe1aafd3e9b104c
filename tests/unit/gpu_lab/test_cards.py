"""Card emulation arithmetic: the lab GPU requests the bytes the emulated card would."""

from __future__ import annotations

import pytest
from gpu_lab.cards import EmulationError, card_cuda_total_bytes, emulated_gpu_util

H200_CUDA_TOTAL = 143156 * 2**20  # torch.cuda.mem_get_info()[1] on the lent H200


def test_3090_budget_on_an_h200():
    util = emulated_gpu_util("rtx3090", 0.93, H200_CUDA_TOTAL)
    assert util == 0.156725
    requested = util * H200_CUDA_TOTAL
    card_requested = 0.93 * card_cuda_total_bytes("rtx3090")
    assert card_requested - 2**20 < requested <= card_requested  # never more than the card, within 1 MiB


def test_smaller_gpu_than_the_card_is_refused():
    with pytest.raises(EmulationError, match="less than the emulated rtx3090's"):
        emulated_gpu_util("rtx3090", 0.93, 16 * 2**30)


def test_unknown_card_and_bad_util():
    with pytest.raises(EmulationError, match="unknown card 'gtx480'"):
        emulated_gpu_util("gtx480", 0.9, H200_CUDA_TOTAL)
    with pytest.raises(EmulationError, match="not in"):
        emulated_gpu_util("rtx3090", 1.5, H200_CUDA_TOTAL)
