"""The router: per call, picks a Triton kernel, a Metal shader or the torch library op, and says why.

Public pieces: Request (what a call needs routed), Coverage (what a kernel implements), Approval
(accuracy evidence), route() -> Route, explain(), use_backend(), MissingKernel, routed_op.
"""
from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage, Refusal
from rlx_triton.router.registry import BackendSpec, register_backend
from rlx_triton.router.request import Request
from rlx_triton.router.route import (MissingKernel, Route, clear_route_cache, explain, recording_routes, route,
                                     routed_op)
from rlx_triton.router.settings import use_backend, use_candidate

__all__ = ["Approval", "BackendSpec", "Coverage", "MissingKernel", "Refusal", "Request", "Route",
           "clear_route_cache", "explain", "recording_routes", "register_backend", "route", "routed_op", "use_backend", "use_candidate"]
