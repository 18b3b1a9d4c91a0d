"""python -m rlx_triton.perf: the perf command (see rlx_triton.perf)."""
from rlx_triton.perf import main

raise SystemExit(main())
