"""RL algorithms as small pure tensor functions (advantages, policy losses, KL)."""
