"""Poise: RL post-training of LLMs on disaggregated devices.

See DESIGN.md for the layers; `poise.policy` is pure and never imports torch or ray.
"""

__version__ = "0.1.0"
