"""The paper's Table 6: the 1x1-convolution GEMMs of nine Inception modules, batch 1.

Each set is a list of GEMMs M x N x K with M = H*W pixels, N output channels and
K = 192 input channels: the 1x1 convolutions that share one input. Here a set is
run as what it is, 1x1 convolutions of one (1, 192, H, W) input, on one
``tsm_core.ConvGroup`` launch (one GEMM over the concatenated weights, bias and
ReLU fused, each convolution written into its channel slice of one output).
"""

from __future__ import annotations

import numpy as np

import tsm_core
from tsm_core.runtime import arrays as _arrays

# Inception-i: (M = H*W, [N of each GEMM]), K = 192 (Table 6 of the paper).
TABLE6 = {
    1: (784, [96, 64, 32, 16]),
    2: (784, [64, 32, 128]),
    3: (196, [192, 16, 96, 64]),
    4: (196, [64, 24, 160]),
    5: (196, [64, 128, 24]),
    6: (196, [112, 144, 32, 64]),
    7: (196, [256, 160, 128]),
    8: (49, [160, 128, 256, 160, 32]),
    9: (49, [192, 128, 384, 192, 48]),
}
K = 192


class Table6Set:
    """One Table 6 set as 1x1 convolutions (+ bias + ReLU) of a (n, 192, H, W) input.

    The paper's Table 6 lists, per Inception module, the GEMMs of its 1x1
    convolutions on the block input; on the GPU a set runs as one
    ``tsm_core.ConvGroup`` launch, on numpy input as the CPU reference.

    Parameters
    ----------
    module : int
        1..9, the Inception module (3a, 3b, 4a-4e, 5a, 5b) whose set it is.
    seed : int, default=0
        Weights and biases drawn from ``numpy.random.default_rng(seed)``.

    Attributes
    ----------
    hw : int
        The spatial size H = W of the module's input.
    out_channels : int
        Output channels of all the set's convolutions together.
    weights : list
        (weight, bias) of each convolution, float32 numpy.

    Raises
    ------
    ValueError
        `module` is not 1..9.

    Examples
    --------
    >>> s = Table6Set(8, seed=0)
    >>> s.hw, s.out_channels, len(s.weights)
    (7, 736, 5)
    >>> x = np.random.default_rng(1).standard_normal((1, 192, 7, 7)).astype(np.float32)
    >>> s(x).shape   # numpy in: the CPU reference
    (1, 736, 7, 7)
    """

    def __init__(self, module: int, *, seed: int = 0):
        if module not in TABLE6:
            raise ValueError(f"Table 6 has modules 1..9; got {module!r}")
        m, ns = TABLE6[module]
        self.module = module
        self.hw = int(round(m ** 0.5))
        self.ns = list(ns)
        self.out_channels = sum(ns)
        rng = np.random.default_rng(seed)
        bound = 1.0 / np.sqrt(K)
        self.weights = [(rng.uniform(-bound, bound, (n, K, 1, 1)).astype(np.float32),
                         rng.uniform(-bound, bound, n).astype(np.float32)) for n in ns]
        self._group = None
        self._fast = {}  # (device, n, H, W) -> the group's launch, for torch tensors

    def gemm_sizes(self):
        """[(M, N, K)] as the paper lists them."""
        return [(self.hw * self.hw, n, K) for n in self.ns]

    def group(self):
        if self._group is None:
            from tsm_core import ConvSpec

            specs, off = [], 0
            for w, b in self.weights:
                specs.append(ConvSpec(w, b, "x", ("y", off)))
                off += w.shape[0]
            self._group = tsm_core.ConvGroup(specs)
        return self._group

    def __call__(self, x):
        """relu(conv1x1(x) + b) of every GEMM, concatenated on channels, for x
        (n, 192, H, W) float32: numpy or torch CPU x on the CPU reference, CuPy or
        torch CUDA x in one launch (`forward_gpu`), the result of x's kind.

        A torch CUDA tensor of a size seen before takes the block's remembered-launch
        path (tsm_apps.inception._block.torch_fast_key): the output from torch's
        allocator and the group's argument block written with raw pointers, on
        torch's current stream (no DLPack views, no slot checks).
        """
        from tsm_apps.inception._block import _torch_stream_of, run_by_kind, torch_fast_key

        key = torch_fast_key(x, K)
        launch = None if key is None else self._fast.get(key)
        if launch is not None:
            import torch

            n, dev = key[1], key[0]
            y = torch.empty((n, self.out_channels, key[2], key[3]), dtype=torch.float32,
                            device=x.device)
            launch([x.data_ptr(), y.data_ptr()], _torch_stream_of(dev))
            return y
        kind = _arrays.kind_of(x, "x")
        if x.ndim != 4 or _arrays.numpy_dtype(x) != np.float32 or x.shape[1] != K:
            raise ValueError(f"x must be a 4-D float32 (n, {K}, H, W) array; got shape "
                             f"{tuple(x.shape)}, {_arrays.dtype_name(x)}")
        y, xb = run_by_kind(x, kind, self.forward_cpu, self.forward_gpu)
        if kind == "torch":  # remember the launch for the next call of this size
            dev = x.device.index
            n, _, H, W = xb.shape
            launch = self.group().launcher(dev, n, H, W)  # its slots: ("x", "y")
            if launch is not None:
                self._fast[dev, n, H, W] = launch
        return _arrays.wrap(y, kind)

    def forward_gpu(self, x):
        """relu(conv1x1(x) + b) of every GEMM, concatenated on channels: one launch."""
        import cupy

        if not x.flags.c_contiguous:
            x = cupy.ascontiguousarray(x)
        y = cupy.empty((x.shape[0], self.out_channels) + tuple(x.shape[2:]), np.float32)
        self.group()({"x": x, "y": y})
        return y

    def forward_cpu(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        ys = [np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x) + b[None, :, None, None]
              for w, b in self.weights]
        return np.maximum(np.concatenate(ys, axis=1), 0).astype(np.float32)

    def flops(self, n: int = 1) -> int:
        return 2 * n * sum(m * nn * k for m, nn, k in self.gemm_sizes())
