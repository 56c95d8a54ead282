"""Causal LMs: the built-in tiny Qwen2/Llama, and transformers checkpoints from a local directory."""
