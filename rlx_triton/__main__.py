"""`python -m rlx_triton` runs the command-line interface."""
from rlx_triton.cli import main

raise SystemExit(main())
