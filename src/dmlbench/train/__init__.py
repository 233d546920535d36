"""Training: the shared loop, optimisers, resumable checkpoints, divergence checks and the train stage."""
