"""benchmarks/page_screenshot.py on the 0.2.0 numbers fixture: a real
kt-serve and headless chromium; the PNG is the whole page at the width
asked, and the server stops cleanly."""

import os
import struct

import pytest

from benchmarks import page_screenshot

pytestmark = pytest.mark.once
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "v0_2_0", "translator.keras")


def test_the_screenshot_is_the_whole_page(tmp_path, capsys):
    out = tmp_path / "page.png"
    argv = ["--model", FIXTURE, "--text", "seven", "--out", str(out), "--width", "900"]
    assert page_screenshot.main(argv) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    # The width asked, and the window resized from the browser's first
    # (1,300 pixels high) to the page's own height.
    assert width == 900 and 300 < height < 1300
    assert "'seven' -> " in capsys.readouterr().out
