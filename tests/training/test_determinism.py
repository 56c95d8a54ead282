"""`determinism: bitwise` on CUDA: cuBLAS's workspace fixed, training attention on the math SDPA
backend, and a device missing a deterministic kernel refused in one line. No GPU here: the CUDA
set-up is applied to a `cuda` device object (nothing runs on it; the probe is replaced), and the
probe itself runs for real on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from poise.errors import PoiseError
from poise.training.determinism import CUBLAS_WORKSPACE, bitwise_cuda, probe_training_kernels


@pytest.fixture
def sdp_flags():
    """Restore the process's SDPA backend flags after a test changes them."""
    b = torch.backends.cuda
    saved = (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.cudnn_sdp_enabled(), b.math_sdp_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    b.enable_flash_sdp(saved[0]), b.enable_mem_efficient_sdp(saved[1]), b.enable_cudnn_sdp(saved[2])
    b.enable_math_sdp(saved[3])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[4], saved[5]


def test_cuda_gets_cublas_workspace_and_math_attention(monkeypatch, sdp_flags):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    probed = []
    bitwise_cuda(torch.device("cuda", 0), "qwen2", probe=lambda device, model_type: probed.append(device))
    import os

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    b = torch.backends.cuda
    assert not b.flash_sdp_enabled() and not b.mem_efficient_sdp_enabled() and not b.cudnn_sdp_enabled()
    assert b.math_sdp_enabled() and torch.backends.cudnn.deterministic
    assert probed == [torch.device("cuda", 0)]


def test_a_missing_deterministic_kernel_is_refused_in_one_line(monkeypatch, sdp_flags):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)

    def probe(device, model_type):
        raise RuntimeError("scatter_add_cuda_kernel does not have a deterministic implementation, but you set "
                           "'torch.use_deterministic_algorithms(True)'.\nYou can turn off ...")

    with pytest.raises(PoiseError) as e:
        bitwise_cuda(torch.device("cuda", 0), "qwen2", probe=probe)
    message = str(e.value)
    assert "\n" not in message and "scatter_add_cuda_kernel" in message and "determinism: semantic" in message


def test_cpu_is_left_alone(monkeypatch, sdp_flags):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    bitwise_cuda(torch.device("cpu"), probe=lambda *a: pytest.fail("probed on CPU"))
    import os

    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_the_probe_runs_the_training_kernels_and_restores_the_setting():
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    probe_training_kernels(torch.device("cpu"), "llama")  # CPU has every kernel's deterministic form
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) \
        == before
