"""Steps that run inside a backend's own environment (one module per environment, class Steps)."""
