"""Training: policy log-probs, micro-batch gradients, fixed-order reduction, optimizer step."""
