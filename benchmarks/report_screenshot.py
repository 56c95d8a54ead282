"""Screenshots of `poise report`'s interactive timeline by headless Chromium: the whole run and a
zoomed window, of a simulated run with a resize. Needs `chromium` on PATH (apt-get install
chromium); the tests never do.

    .venv/bin/python benchmarks/report_screenshot.py --out docs   # docs/report-timeline{,-zoom}.png
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from poise.report.draw import load_run
from poise.report.timeline import timeline_section
from poise.sim import load_scenario, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="dynaresize-8xh20")
    parser.add_argument("--zoom", default="560,760", help="seconds shown in the zoomed shot")
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("report_screenshot: no chromium on PATH (apt-get install chromium)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        simulate(load_scenario(args.scenario, []), run)
        section = timeline_section(load_run(run)["events"])  # the report page's own section and script
        a, b = (float(v) for v in args.zoom.split(","))
        for name, extra in (("report-timeline", ""),
                            ("report-timeline-zoom", f"<script>window.poiseTimeline.zoom({a}, {b});</script>")):
            page = Path(tmp) / f"{name}.html"
            page.write_text("<!doctype html><html><head><meta charset='utf-8'></head>"
                            f"<body style='font-family:sans-serif'>{section}{extra}</body></html>")
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            f"--user-data-dir={tmp}/profile-{name}", "--window-size=1150,260", "--hide-scrollbars",
                            f"--screenshot={out.resolve() / (name + '.png')}", page.as_uri()],
                           check=True, capture_output=True, timeout=120)
            print(out / f"{name}.png")


if __name__ == "__main__":
    main()
