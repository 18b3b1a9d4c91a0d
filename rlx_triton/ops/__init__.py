"""Public torch ops, one file per kernel family; each validates its input and asks the router."""
