"""Metal launcher of the segdense family (metal/segdense.metal): pyannote's segmentation head
(Linear + leaky ReLU per hidden layer, classifier, final activation) in one kernel.

Same function name and signature as backends/torch_ref/segdense.py. One threadgroup per row keeps
the row's activations in threadgroup memory through every layer; weights and biases of all layers
are packed one after another (float32), their widths passed as an int64 tensor.
Candidate -> launch: tg_size -> threadgroup size (multiple of 32). row_tile, stages, precision and
fused_activation do not change the Metal kernel (the activation is always fused; fp32 math).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from rlx_triton.backends.metal import candidates as _candidates
from rlx_triton.backends.metal import library
from rlx_triton.router.coverage import Coverage

FAMILY = "segdense"
MAX_WIDTH = 1024  # the shader's threadgroup activation buffers
ACTIVATION_CODES = {"none": 0, "log_softmax": 1, "sigmoid": 2}
NEGATIVE_SLOPE = 0.01  # F.leaky_relu's default, as pyannote uses it
KERNEL_ARGUMENTS = {
    "segdense_head": ("x:T", "weights:float32", "biases:float32", "layer_dims:int64", "out:T", "num_layers:long",
                      "negative_slope:float", "activation:long"),
}

COVERAGE = Coverage(
    ops=frozenset({"segdense"}),
    devices=frozenset({"mps"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"classes": (1, MAX_WIDTH), "in_features": (1, MAX_WIDTH), "hidden": (0, MAX_WIDTH),
            "rows": (0, 1 << 31)},
    features={
        "activation": frozenset(ACTIVATION_CODES),
        "linear_layers": frozenset(range(0, 9)),
        "requires_grad": frozenset({False}),
    },
)
APPROVALS = _candidates.approvals(FAMILY)
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}


def pack_layers(weights: Sequence[torch.Tensor], biases: Sequence[Optional[torch.Tensor]], device):
    """(weights packed (sum of out*in,), biases packed (sum of out,), layer widths int64 (layers + 1,))."""
    packed_w, packed_b, dims = [], [], [int(weights[0].shape[1])]
    for weight, bias in zip(weights, biases):
        weight = weight.detach().to(device=device, dtype=torch.float32)
        packed_w.append(weight.reshape(-1))
        packed_b.append(torch.zeros(weight.shape[0], dtype=torch.float32, device=device) if bias is None
                        else bias.detach().to(device=device, dtype=torch.float32).reshape(-1))
        dims.append(int(weight.shape[0]))
    return (torch.cat(packed_w).contiguous(), torch.cat(packed_b).contiguous(),
            torch.tensor(dims, dtype=torch.int64, device=device))


def segdense(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[Optional[torch.Tensor]],
             classifier_weight: torch.Tensor, classifier_bias: Optional[torch.Tensor], *,
             activation: str, candidate=None) -> torch.Tensor:
    """(..., F) -> (..., C): leaky_relu(linear) for each (weight, bias), classifier, activation."""
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    layers = list(weights) + [classifier_weight]
    packed_w, packed_b, dims = pack_layers(layers, list(biases) + [classifier_bias], x.device)
    classes = classifier_weight.shape[0]
    out = torch.empty((rows.shape[0], classes), dtype=x.dtype, device=x.device)
    library.dispatch(FAMILY, "segdense_head", x.dtype, KERNEL_ARGUMENTS["segdense_head"], groups=rows.shape[0],
                     group_size=library.group_size_for(int(_candidates.field(candidate, "tg_size", 128))),
                     x=rows, weights=packed_w, biases=packed_b, layer_dims=dims, out=out, num_layers=len(layers),
                     negative_slope=NEGATIVE_SLOPE, activation=ACTIVATION_CODES[activation])
    return out.reshape(*lead, classes)
