"""The steady-state host-sync check the GPU tests share (bench/gpu_check.sh's `no-sync`)."""
import torch


def assert_steady_state_never_syncs(step, repeats: int = 1) -> None:
    """Run `step` once to warm up (compile, route, pack), then `repeats` times under
    torch.cuda.set_sync_debug_mode("error"): any .item(), host copy or blocking call raises."""
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(repeats):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
