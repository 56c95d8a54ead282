"""Multi-turn episodes: environments and tools (torch-free).

A sample becomes an episode: the prompt, then model turns and environment observations
alternating, kept as one token sequence with a loss mask (docs/episodes.md).
"""
