"""A checkpoint's parts written by every train device: a failure of any kind on one device (not only
an OSError) reaches every rank at once, so none waits out the collectives' deadline for a rank that
stopped taking part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("write_parts_ranks.py")


def _ranks(tmp_path: Path, failing: int) -> list[dict]:
    (tmp_path / "ckpt").mkdir()
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(r), str(tmp_path / "store"), str(tmp_path / "ckpt"),
                               str(failing), str(tmp_path / f"{r}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, out[-3000:]
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("failing", [1, 0], ids=["owner", "writer"])
def test_a_non_os_error_on_one_device_reaches_the_writer_without_a_timeout(tmp_path, failing):
    ranks = _ranks(tmp_path, failing)
    assert ranks[failing]["raised"] == "ValueError: injected: a tensor that is not what the listing said"
    writer = ranks[0]["raised"]
    assert writer is not None and "injected" in writer and "Timeout" not in writer, writer
    if failing == 1:
        assert writer.startswith("RuntimeError: device 1 "), writer  # names the device that failed
    other = ranks[1 - failing]
    assert "Timed out" not in str(other["raised"]), other
    assert other["seconds"] < 30, ranks  # the 40 s deadline: it did not wait it out
