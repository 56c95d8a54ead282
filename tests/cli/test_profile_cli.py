"""`poise profile`: bad input fails in one line before minutes of measuring."""

from __future__ import annotations

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


def test_resize_job_needs_four_devices(tmp_path):
    out = tmp_path / "p.json"
    assert_one_line_error(poise("profile", "--resize", "--resize-devices", "2", "--out", str(out)),
                          "--resize-devices 2", "use 4")
    assert not out.exists()


def test_out_under_a_file_or_a_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(poise("profile", "--out", str(blocker / "p.json")), str(blocker / "p.json"),
                          "choose another path")
    assert_one_line_error(poise("profile", "--out", str(tmp_path)), "is a directory")
    assert blocker.read_text() == "x"
