"""The report's completions page: what the model wrote (RUN_DIR/completions.jsonl, poise.completions).

    path = write_completions_page(run_dir, out)   # out/completions.html, or None when the run logged none

The last `LAST_STEPS` steps, newest first; per sample its id, reward (and each reward function's),
length, finish reason, prompt and completion; an episode's observations shaded. Every value from the
log is escaped; the page has no script.
"""

from __future__ import annotations

import html
from pathlib import Path

from poise.completions import read_completions

LAST_STEPS = 50  # the page stays a few MB at run.log_completions 4 and 2,000 characters a text
PAGE = "completions.html"


def write_completions_page(run_dir: Path, out: Path) -> Path | None:
    rows = read_completions(run_dir)
    if not rows:
        return None
    steps = sorted({r["step"] for r in rows})
    shown = steps[-LAST_STEPS:]
    note = f" (the last {LAST_STEPS} of {len(steps)} steps)" if len(steps) > LAST_STEPS else ""
    body = "".join(_step(step, [r for r in rows if r["step"] == step]) for step in reversed(shown))
    path = out / PAGE
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>poise completions: "
                    f"{html.escape(run_dir.name)}</title><style>{_STYLE}</style></head><body>"
                    f"<h1>completions: {html.escape(str(run_dir))}</h1><p>{len(rows)} samples from {len(steps)} "
                    f"steps{note}, newest first; <a href='index.html'>the report</a></p>{body}</body></html>")
    return path


def index_section(run_dir: Path, page: Path | None) -> str:
    """What the report's index page says about the completions: a link, or nothing."""
    if page is None:
        return ""
    return (f"<h2>completions</h2><p><a href='{html.escape(page.name)}'>what the model wrote</a>: prompts, "
            f"completions and rewards of a few samples a step (also `poise completions {html.escape(str(run_dir))}`)"
            f"</p>")


def _step(step: int, rows: list[dict]) -> str:
    return (f"<h2 id='step-{step}'>step {step}</h2><table><tr><th>sample</th><th>reward</th><th>tokens</th>"
            f"<th>finished</th><th>prompt</th><th>completion</th></tr>" + "".join(_row(r) for r in rows) + "</table>")


def _row(r: dict) -> str:
    esc = lambda v: html.escape(str(v))  # noqa: E731
    parts = "".join(f"<br><small>{esc(k)} {esc(_num(v))}</small>" for k, v in (r.get("rewards") or {}).items())
    if "turns" in r:  # an episode: model turns plain, observations shaded
        completion = "".join(f"<pre class='{'obs' if t['role'] == 'observation' else 'model'}'>{esc(t['text'])}</pre>"
                             for t in r["turns"])
    else:
        completion = f"<pre>{esc(r.get('completion', ''))}</pre>"
    cut = "<br><small>text cut</small>" if r.get("truncated") else ""
    return (f"<tr><td>{esc('/'.join(map(str, r['id'])))}<br><small>{esc(r.get('prompt_id', ''))}</small></td>"
            f"<td>{esc(_num(r.get('reward')))}{parts}</td><td>{esc(r.get('length'))}</td>"
            f"<td>{esc(r.get('finish_reason'))}{cut}</td><td><pre>{esc(r.get('prompt', ''))}</pre></td>"
            f"<td>{completion}</td></tr>")


def _num(value) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else str(value)


_STYLE = ("body{font-family:sans-serif} table{border-collapse:collapse;margin-bottom:1em} "
          "td,th{border:1px solid #bbb;padding:3px;vertical-align:top;text-align:left} "
          "pre{white-space:pre-wrap;max-width:60em;margin:0} pre.obs{background:#eef3e6;border-left:3px solid #8a6}")
