"""The disaggregated runtime on Ray — the only package that imports ray (docs/design.md, layers)."""

import os

# A local Ray binds to loopback only. Ray picks its single-machine mode (node IP = localhost, every
# server bound to it) from this variable when ray is first imported; `_node_ip_address="127.0.0.1"`
# alone is rewritten to a routable address. Joining a cluster on other hosts needs a routable node
# IP: run such jobs with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 (cluster.connect says so).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
