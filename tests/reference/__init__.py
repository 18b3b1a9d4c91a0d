"""float64 references, one module per kernel family, shared by the backend and op tests."""
