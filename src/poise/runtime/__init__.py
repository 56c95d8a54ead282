"""The disaggregated runtime on Ray — the only package that imports ray (DESIGN.md, layers)."""
