"""The worlds of ranks: bad arguments are one clear error before any allocation; the one-GPU world places the
host link's destination buffers in pinned host memory and keeps everything the observed rank reads on the GPU."""
from __future__ import annotations

import pytest
import torch

from xstage import ranks

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(world_size=0), ValueError, "world_size must be >= 1"),
    (dict(world_size=2, link="nvlink"), ValueError, "link must be one of"),
    (dict(world_size=2, observed=2), ValueError, r"observed rank must be in \[0, 2\)"),
    (dict(world_size=2, observed=-1), ValueError, "observed rank must be in"),
])
def test_one_gpu_world_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ranks.OneGPUWorld(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_one_gpu_world_without_a_gpu_is_one_clear_error():
    with pytest.raises(RuntimeError, match="one-GPU world of 4 ranks needs 1 CUDA GPU"):
        ranks.OneGPUWorld(4, link="host")


def test_emulated_world_ignores_destination():
    w = ranks.EmulatedWorld(3)
    st = w.symmetric_empty(8, torch.float32, destination=True)
    assert w.link == "emulated" and all(t.device.type == "cpu" for t in st.tensors.values())
    assert st.ptrs == [st.local(r).data_ptr() for r in range(3)]


@pytest.mark.gpu
@pytest.mark.parametrize("link", ranks.ONE_GPU_LINKS)
def test_one_gpu_world_placement(link):
    w = ranks.OneGPUWorld(3, link=link, observed=1)
    src = w.symmetric_empty(16, torch.float32)
    dst = w.symmetric_empty(16, torch.float32, destination=True)
    assert all(t.is_cuda for t in src.tensors.values())
    for r in range(3):
        on_host = link == "host" and r != 1
        assert dst.local(r).is_cuda is not on_host and dst.local(r).is_pinned() is on_host
        assert dst.ptr(r) == dst.local(r).data_ptr()
