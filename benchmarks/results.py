"""Where every benchmark writes its JSON: bench-results/<name>-<UTC timestamp>.json (gitignored)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path


def write_results(name: str, payload: dict, out: str | Path = "bench-results") -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return path
