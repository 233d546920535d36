"""What a grid costs before it runs (``make plan``) and when a running one ends (the runner's ETA)."""
