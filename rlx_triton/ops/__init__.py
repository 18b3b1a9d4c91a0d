"""Public torch ops, one module per kernel family (the sdpa_decode family's torch drop-in is ops/sdpa.py), each
validating its input and asking the router; the _-prefixed modules hold what several ops share."""
