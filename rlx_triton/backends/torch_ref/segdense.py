"""Library fallback for the segdense family: pyannote's dense head written with torch.nn.functional."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS: Dict[str, Approval] = {}
RECIPES: Dict[str, str] = {}
SPEED_EVIDENCE: Dict[str, str] = {}


def segdense(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[Optional[torch.Tensor]],
             classifier_weight: torch.Tensor, classifier_bias: Optional[torch.Tensor], *,
             activation: str, candidate=None) -> torch.Tensor:
    """leaky_relu(linear) for each (weight, bias), then the classifier and the final activation."""
    out = x
    for weight, bias in zip(weights, biases):
        out = F.leaky_relu(F.linear(out, weight, bias))
    out = F.linear(out, classifier_weight, classifier_bias)
    if activation == "log_softmax":
        return torch.log_softmax(out, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(out)
    return out


def library_kernels(request, profile) -> list:
    """The kernels `segdense` above runs on a GPU for a routed request (rlx_triton.backends.torch_ref.library_kernel
    .LibraryKernel), priced by rlx_triton.perf.library's models: each F.linear on the (rows, features) input is
    one cuBLASLt GEMM with its bias in the epilogue (aten linear's fused addmm path for a contiguous input; fp32
    with TF32 off, as pyannote runs it), each leaky_relu its own elementwise kernel, then the classifier's GEMM and
    the activation (log_softmax: one softmax kernel over the classes; sigmoid: one elementwise kernel). Every
    hidden layer is taken as `hidden` wide (the request's widest)."""
    from rlx_triton.perf.library import Unmodelled
    from rlx_triton.perf.library.eager import elementwise
    from rlx_triton.perf.library.gemm import gemm_kernels

    if request.dtype != "float32":
        raise Unmodelled(f"the segdense library path in {request.dtype} is not modelled (float32 is)")
    fields, features = request.field_map, request.feature_map
    rows, width, hidden, classes = fields["rows"], fields["in_features"], fields["hidden"], fields["classes"]
    kernels = []
    for layer in range(int(features.get("linear_layers", 2))):
        kernels += gemm_kernels(rows, hidden, width, "fp32", profile,
                                read_bytes=(rows * width + width * hidden + hidden) * 4, written_bytes=rows * hidden * 4,
                                label=f"linear {layer} (addmm: cuBLASLt, bias in the epilogue)")
        kernels.append(elementwise(f"linear {layer} leaky_relu", rows * hidden * 4, rows * hidden * 4, 2 * rows * hidden))
        width = hidden
    kernels += gemm_kernels(rows, classes, width, "fp32", profile,
                            read_bytes=(rows * width + width * classes + classes) * 4, written_bytes=rows * classes * 4,
                            label="classifier (addmm: cuBLASLt, bias in the epilogue)")
    activation = features.get("activation", "log_softmax")
    scores = rows * classes * 4
    if activation == "log_softmax":
        kernels.append(elementwise("log_softmax", scores, scores, 4 * rows * classes,
                                   note="torch's softmax kernel over the last dim (one launch): max, exp-sum, log"))
    elif activation == "sigmoid":
        kernels.append(elementwise("sigmoid", scores, scores, 2 * rows * classes))
    return kernels
