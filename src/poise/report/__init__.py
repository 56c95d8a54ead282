"""`poise report`: draw a run directory's JSONL (simulated or real) as PNGs and one HTML page.

Reads only the files of docs/events.md; nothing in policy/, sim/ or runtime/ imports this package.
"""

from poise.report.draw import draw_report, draw_sweep, load_run

__all__ = ["draw_report", "draw_sweep", "load_run"]
