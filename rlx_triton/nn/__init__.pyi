# Static view of rlx_triton.nn: at run time the modules resolve lazily (__init__.py).
# tests/cli/test_packaging.py keeps this list equal to __init__.py's __all__.
from rlx_triton.nn.conv import Conv1d as Conv1d
from rlx_triton.nn.conv import SincNet as SincNet
from rlx_triton.nn.conv2d import BasicBlock as BasicBlock
from rlx_triton.nn.conv2d import Bottleneck as Bottleneck
from rlx_triton.nn.conv2d import Conv2d as Conv2d
from rlx_triton.nn.conv2d import Projection as Projection
from rlx_triton.nn.conv2d import StatsPool as StatsPool
from rlx_triton.nn.fbank import Fbank as Fbank
from rlx_triton.nn.lstm import LSTM as LSTM
from rlx_triton.nn.segdense import SegDense as SegDense

__all__: list[str]
