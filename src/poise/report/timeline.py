"""The report's interactive per-device timeline: an inline SVG and a few lines of JavaScript on the
page itself (wheel: zoom, drag: pan, double-click: whole run), so the page needs no network and no
library when it is viewed. The PNG beside it is the static copy."""

from __future__ import annotations

import json
from typing import Any

ROLES = ("rollout", "train", "resize", "idle")
COLORS = {"rollout": "#4C72B0", "train": "#DD8452", "resize": "#C44E52", "idle": "#DDDDDD"}
MAX_INTERVALS = 200_000  # ~6 MB of page; a longer log is cut to its first intervals (said on the page)


def timeline_data(events: list[dict]) -> dict[str, Any]:
    """{"devices": [...], "intervals": [[row, start, end, role index, step, phase], ...] sorted by
    start, "t0", "t1", "cut"}: what the page draws."""
    intervals = [e for e in events if e.get("kind") == "interval"
                 and isinstance(e.get("start"), (int, float)) and isinstance(e.get("end"), (int, float))]
    devices = sorted({d for e in intervals for d in range(int(e["device"]), int(e["device"]) + int(e.get("devices", 1)))})
    row = {d: i for i, d in enumerate(devices)}
    out = []
    for e in sorted(intervals, key=lambda e: e["start"]):
        role = ROLES.index(e["role"]) if e.get("role") in ROLES else len(ROLES)
        for d in range(int(e["device"]), int(e["device"]) + int(e.get("devices", 1))):
            out.append([row[d], round(float(e["start"]), 6), round(float(e["end"]), 6), role, e.get("step"),
                        str(e.get("phase", ""))])
    cut = len(out) > MAX_INTERVALS
    out = out[:MAX_INTERVALS]
    t1 = max((iv[2] for iv in out), default=1.0)
    return {"devices": devices, "intervals": out, "t0": 0.0, "t1": t1 if t1 > 0 else 1.0, "cut": cut,
            "roles": list(ROLES), "colors": [COLORS[r] for r in ROLES] + ["#999999"]}


def timeline_section(events: list[dict]) -> str:
    data = timeline_data(events)
    if not data["intervals"]:
        return ""
    # "<" escaped: nothing in the log can close the script element
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    note = " (the first %d intervals only)" % MAX_INTERVALS if data["cut"] else ""
    legend = " ".join(f"<span style='background:{COLORS[r]};padding:0 6px'>&nbsp;</span> {r}" for r in ROLES)
    return (f"<h2>timeline</h2><p>wheel: zoom, drag: pan, double-click: the whole run{note}. {legend}</p>"
            f"<div id='poise-timeline'></div>"
            f"<script type='application/json' id='poise-timeline-data'>{payload}</script>"
            f"<script>{_SCRIPT}</script>")


_SCRIPT = r"""
(function () {
  const data = JSON.parse(document.getElementById('poise-timeline-data').textContent);
  const NS = 'http://www.w3.org/2000/svg', W = 1100, LEFT = 44, TOP = 6, ROW = 14, AXIS = 30;
  const H = TOP + data.devices.length * ROW + AXIS, PLOT = W - LEFT;
  const el = (tag, attrs, parent) => {
    const node = document.createElementNS(NS, tag);
    for (const k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  };
  const svg = el('svg', {width: W, height: H, style: 'border:1px solid #ccc;cursor:grab;user-select:none'});
  document.getElementById('poise-timeline').appendChild(svg);
  el('rect', {x: LEFT, y: 0, width: PLOT, height: H - AXIS}, el('clipPath', {id: 'poise-clip'}, svg));
  const inner = el('g', {}, el('g', {'clip-path': 'url(#poise-clip)'}, svg));
  data.devices.forEach((d, i) => {
    const label = el('text', {x: LEFT - 4, y: TOP + i * ROW + ROW - 4, 'text-anchor': 'end', 'font-size': 10}, svg);
    label.textContent = String(d);
  });
  for (const [row, start, end, role, step, phase] of data.intervals) {
    const r = el('rect', {x: start, y: TOP + row * ROW + 1, width: Math.max(end - start, 0), height: ROW - 2,
                          fill: data.colors[role]}, inner);
    const name = data.roles[role] || 'other';
    el('title', {}, r).textContent = 'device ' + data.devices[row] + ': ' + name + ' ' + phase + ', step ' + step +
      ', ' + start.toFixed(3) + '-' + end.toFixed(3) + ' s';
  }
  const axis = el('g', {}, svg);
  el('text', {x: LEFT + PLOT / 2, y: H - 2, 'text-anchor': 'middle', 'font-size': 10}, svg).textContent =
    'seconds from run start';
  let t0 = data.t0, t1 = data.t1;
  function ticks() {
    while (axis.firstChild) axis.removeChild(axis.firstChild);
    const span = t1 - t0, raw = span / 8, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      const x = LEFT + (t - t0) / span * PLOT;
      el('line', {x1: x, x2: x, y1: H - AXIS, y2: H - AXIS + 4, stroke: '#333'}, axis);
      el('text', {x: x, y: H - AXIS + 14, 'text-anchor': 'middle', 'font-size': 10}, axis).textContent =
        (+t.toPrecision(6)).toString();
    }
  }
  function render() {
    const k = PLOT / (t1 - t0);
    inner.setAttribute('transform', 'translate(' + (LEFT - t0 * k) + ',0) scale(' + k + ',1)');
    ticks();
  }
  const timeAt = clientX => t0 + (clientX - svg.getBoundingClientRect().left - LEFT) / PLOT * (t1 - t0);
  svg.addEventListener('wheel', e => {
    e.preventDefault();
    const at = timeAt(e.clientX), f = e.deltaY < 0 ? 0.8 : 1.25;
    t0 = at - (at - t0) * f; t1 = at + (t1 - at) * f;
    if (t1 - t0 < 1e-6) t1 = t0 + 1e-6;
    render();
  }, {passive: false});
  let drag = null;
  svg.addEventListener('mousedown', e => { drag = {x: e.clientX, t0: t0, t1: t1}; svg.style.cursor = 'grabbing'; });
  window.addEventListener('mousemove', e => {
    if (!drag) return;
    const dt = (e.clientX - drag.x) / PLOT * (drag.t1 - drag.t0);
    t0 = drag.t0 - dt; t1 = drag.t1 - dt; render();
  });
  window.addEventListener('mouseup', () => { drag = null; svg.style.cursor = 'grab'; });
  svg.addEventListener('dblclick', () => { t0 = data.t0; t1 = data.t1; render(); });
  window.poiseTimeline = {zoom: (a, b) => { t0 = a; t1 = b; render(); }};  // for a scripted screenshot
  render();
})();
"""
