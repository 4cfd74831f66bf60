"""The GoogLeNet Inception block: definition, weights, CPU reference, GPU forward."""

from __future__ import annotations

import numpy as np

import tsm_core
from tsm_core.runtime import arrays as _arrays

# torchvision's GoogLeNet channel counts, modules 1..9:
# (in, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj, input H = W in GoogLeNet)
BLOCKS = {
    "3a": (192, 64, 96, 128, 16, 32, 32, 28),
    "3b": (256, 128, 128, 192, 32, 96, 64, 28),
    "4a": (480, 192, 96, 208, 16, 48, 64, 14),
    "4b": (512, 160, 112, 224, 24, 64, 64, 14),
    "4c": (512, 128, 128, 256, 24, 64, 64, 14),
    "4d": (512, 112, 144, 288, 32, 64, 64, 14),
    "4e": (528, 256, 160, 320, 32, 128, 128, 14),
    "5a": (832, 256, 160, 320, 32, 128, 128, 7),
    "5b": (832, 384, 192, 384, 48, 128, 128, 7),
}
MODULES = {i + 1: name for i, name in enumerate(BLOCKS)}  # 1 -> "3a", ..., 9 -> "5b"
# Parameter names, in branch order: (weight, bias) of each convolution.
PARAMS = ("b1", "b2_reduce", "b2", "b3_reduce", "b3", "b4")


def block_name(module) -> str:
    """'3a'..'5b' from a module number 1..9 or a block name."""
    if isinstance(module, str) and module in BLOCKS:
        return module
    try:
        return MODULES[int(module)]
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"module must be 1..9 or one of {list(BLOCKS)}; got {module!r}") from None


class InceptionBlock:
    """One GoogLeNet Inception block (conv + bias + ReLU in every branch), NCHW float32.

    Branches: 1x1; 1x1 reduce then 3x3 (pad 1); 1x1 reduce then 5x5 (pad 2); 3x3
    max-pool (stride 1, pad 1) then 1x1; outputs concatenated on channels in that
    order. As in the GoogLeNet paper and torchvision's channel table; torchvision's
    own module has a 3x3 in the third branch, which `from_state_dict` follows
    when its weights say so (the kernel size is read off the weight's shape).

    Parameters
    ----------
    module : int or str
        1..9 or '3a', '3b', '4a'..'4e', '5a', '5b'.
    seed : int
        Weights and biases drawn uniform in +-1/sqrt(fan_in) (torch's default
        initialisation) from ``numpy.random.default_rng(seed)``.
    params : dict, optional
        ``{name: (weight, bias)}`` for name in PARAMS, overriding the seeded ones.

    Attributes
    ----------
    in_channels, out_channels : int
        Channels of the input and of the concatenated output.
    params : dict
        name -> (weight of shape (Cout, Cin, R, R), bias of shape (Cout,)), float32 numpy.

    Raises
    ------
    ValueError
        An unknown `module`, or `params` whose shapes do not fit the block.

    Examples
    --------
    >>> import numpy as np
    >>> blk = InceptionBlock(1, seed=0)
    >>> x = np.random.default_rng(1).standard_normal((2, 192, 28, 28)).astype(np.float32)
    >>> blk(x).shape   # numpy in: the CPU reference
    (2, 256, 28, 28)
    """

    def __init__(self, module=8, *, seed: int = 0, params: dict | None = None):
        self.name = block_name(module)
        cin, a, b1, b2, c1, c2, p, self.hw = BLOCKS[self.name]
        self.in_channels = cin
        shapes = {"b1": (a, cin, 1), "b2_reduce": (b1, cin, 1), "b2": (b2, b1, 3),
                  "b3_reduce": (c1, cin, 1), "b3": (c2, c1, 5), "b4": (p, cin, 1)}
        rng = np.random.default_rng(seed)
        self.params = {}
        for name in PARAMS:
            co, ci, r = shapes[name]
            bound = 1.0 / np.sqrt(ci * r * r)
            w = rng.uniform(-bound, bound, (co, ci, r, r)).astype(np.float32)
            b = rng.uniform(-bound, bound, co).astype(np.float32)
            self.params[name] = (w, b)
        if params is not None:
            for name in PARAMS:
                w, b = params[name]
                w = np.ascontiguousarray(w, dtype=np.float32)
                b = np.ascontiguousarray(b, dtype=np.float32)
                co, ci, r = shapes[name]
                ok_r = w.shape[2] == w.shape[3] and w.shape[2] % 2 == 1 if name == "b3" else w.shape[2:] == (r, r)
                if w.shape[:2] != (co, ci) or not ok_r or b.shape != (co,):
                    raise ValueError(f"block {self.name}: {name} weight {w.shape} / bias {b.shape}; "
                                     f"expected ({co}, {ci}, {r}, {r}) / ({co},)")
                self.params[name] = (w, b)
        self.out_channels = a + b2 + c2 + p
        self._groups = None
        self._tmp = {}
        self._fast = {}  # (device, n, H, W) -> what _forward_torch launches with

    # ------------------------------------------------------------------ weights
    @classmethod
    def from_state_dict(cls, module, state, *, prefix: str | None = None) -> "InceptionBlock":
        """A block with weights from a torch state dict (a dict, or a path for torch.load).

        Two layouts are understood:

        - plain: ``b1.weight/bias``, ``b2.0.*`` (reduce), ``b2.2.*``, ``b3.0.*``,
          ``b3.2.*``, ``b4.1.*`` (an ``nn.Module`` with those attribute names);
        - torchvision ``GoogLeNet``: ``inception3a.branch1.conv.weight`` ... with
          BatchNorm (eps 1e-3) folded into each convolution's weight and bias (eval mode).

        `prefix` selects the block inside a whole-network dict (torchvision default:
        ``"inception3a."`` etc.). Nothing is downloaded.
        """
        name = block_name(module)
        if isinstance(state, (str, bytes)) or hasattr(state, "__fspath__"):
            import torch

            state = torch.load(state, map_location="cpu", weights_only=True)

        def get(key):
            v = state[key]
            return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)

        keys = set(state)
        if prefix is None:
            prefix = f"inception{name}." if f"inception{name}.branch1.conv.weight" in keys else ""
        plain = {"b1": "b1", "b2_reduce": "b2.0", "b2": "b2.2", "b3_reduce": "b3.0",
                 "b3": "b3.2", "b4": "b4.1"}
        tv = {"b1": "branch1", "b2_reduce": "branch2.0", "b2": "branch2.1",
              "b3_reduce": "branch3.0", "b3": "branch3.1", "b4": "branch4.1"}
        params = {}
        if prefix + "b1.weight" in keys:
            for p, k in plain.items():
                params[p] = (get(f"{prefix}{k}.weight"), get(f"{prefix}{k}.bias"))
        elif prefix + "branch1.conv.weight" in keys:
            for p, k in tv.items():
                w = get(f"{prefix}{k}.conv.weight").astype(np.float64)
                g, beta = get(f"{prefix}{k}.bn.weight"), get(f"{prefix}{k}.bn.bias")
                mean, var = get(f"{prefix}{k}.bn.running_mean"), get(f"{prefix}{k}.bn.running_var")
                scale = g / np.sqrt(var.astype(np.float64) + 1e-3)
                params[p] = (w * scale[:, None, None, None], beta - mean * scale)
        else:
            raise ValueError(f"no Inception {name} weights under prefix {prefix!r} "
                             "(expected b1.weight or branch1.conv.weight)")
        return cls(name, params=params)

    # ------------------------------------------------------------------ forward
    def _check(self, x):
        kind = _arrays.kind_of(x, "x")
        if x.ndim != 4:
            raise ValueError(f"x must be 4-D (N, C, H, W); got shape {tuple(x.shape)}")
        if _arrays.numpy_dtype(x) != np.float32:
            raise TypeError(f"x must be float32; got {_arrays.dtype_name(x)}")
        if x.shape[1] != self.in_channels:
            raise ValueError(f"block {self.name} takes {self.in_channels} input channels; "
                             f"x has {x.shape[1]}")
        return kind

    def __call__(self, x):
        """The block's output (N, out_channels, H, W) for x (N, in_channels, H, W), float32.

        numpy (or torch CPU) x: the CPU reference; CuPy or torch CUDA x: our kernels,
        two launches, result of the caller's kind.
        """
        y = self._forward_torch(x)
        if y is not None:
            return y
        kind = self._check(x)
        y, xb = run_by_kind(x, kind, self.forward_cpu,
                            lambda a: self.forward_gpu(a, checked=True))
        if kind == "torch":
            self._remember_torch_size(x.device.index, xb.shape)
        return _arrays.wrap(y, kind)

    def _remember_torch_size(self, dev: int, shape) -> None:
        """Record what `_forward_torch` needs for this size: both groups' launches (their
        tuned plans and argument blocks) and the slots' pointers, x and y left open."""
        n, _, H, W = shape
        tmp = self._tmp.get((dev, n, H, W))
        g1, g2 = self.groups()
        L1, L2 = g1.launcher(dev, n, H, W), g2.launcher(dev, n, H, W)
        if tmp is None or L1 is None or L2 is None:
            return
        fixed = {"t3": tmp[0].data.ptr, "t5": tmp[1].data.ptr, "xp": tmp[2].data.ptr}
        self._fast[dev, n, H, W] = (
            L1, L2, [(s, fixed.get(s)) for s in g1.slots], [(s, fixed.get(s)) for s in g2.slots],
            (n, self.out_channels, H, W))

    def _forward_torch(self, x):
        """The torch CUDA path with no DLPack views, for a size this block has run on x's
        device before: raw pointers into the remembered argument blocks, the output
        from torch's allocator, both launches on torch's current stream. None (the
        caller takes the checked CuPy path) for anything else: another kind, a first
        call at this size, a tensor that needs a copy or fails a check. A batch-1 call
        spent about 30 us of host time making and unmaking DLPack views, and the
        checks and lookups of the CuPy path (measured on the H100 host, 2026-11-23)."""
        key = torch_fast_key(x, self.in_channels)
        rec = None if key is None else self._fast.get(key)
        if rec is None:
            return None
        import torch

        L1, L2, slots1, slots2, out_shape = rec
        y = torch.empty(out_shape, dtype=torch.float32, device=x.device)
        xp, yp = x.data_ptr(), y.data_ptr()
        stream = _torch_stream_of(key[0])
        L1([xp if s == "x" else yp if s == "y" else p for s, p in slots1], stream)
        L2([xp if s == "x" else yp if s == "y" else p for s, p in slots2], stream)
        return y

    def forward_cpu(self, x: np.ndarray) -> np.ndarray:
        """The CPU reference, computed in float64, returned as float32."""
        x = np.asarray(x, dtype=np.float64)
        P = {k: (w.astype(np.float64), b.astype(np.float64)) for k, (w, b) in self.params.items()}
        y1 = _relu(_conv(x, *P["b1"]))
        y2 = _relu(_conv(_relu(_conv(x, *P["b2_reduce"])), *P["b2"]))
        y3 = _relu(_conv(_relu(_conv(x, *P["b3_reduce"])), *P["b3"]))
        y4 = _relu(_conv(_maxpool3(x), *P["b4"]))
        return np.concatenate([y1, y2, y3, y4], axis=1).astype(np.float32)

    def groups(self):
        """The two `tsm_core.ConvGroup` launches: (1x1s + pool branch, 3x3 + 5x5)."""
        if self._groups is None:
            from tsm_core import ConvSpec, MaxPoolSpec

            P = self.params
            a, b2, c2 = P["b1"][0].shape[0], P["b2"][0].shape[0], P["b3"][0].shape[0]
            ch = {"y": self.out_channels}
            # The pool branch in two steps: the max-pool stored into xp in the first
            # launch, its 1x1 as a plain GEMM in the second (see MaxPoolSpec).
            g1 = tsm_core.ConvGroup([
                ConvSpec(*P["b1"], "x", ("y", 0)),
                ConvSpec(*P["b2_reduce"], "x", ("t3", 0)),
                ConvSpec(*P["b3_reduce"], "x", ("t5", 0)),
                MaxPoolSpec(self.in_channels, "x", ("xp", 0)),
            ], channels=ch)
            g2 = tsm_core.ConvGroup([
                ConvSpec(*P["b2"], "t3", ("y", a)),
                ConvSpec(*P["b3"], "t5", ("y", a + b2)),
                ConvSpec(*P["b4"], "xp", ("y", a + b2 + c2)),
            ], channels=ch)
            self._groups = (g1, g2)
        return self._groups

    def forward_gpu(self, x, out=None, *, checked: bool = False):
        """Our kernels on a CuPy array x (N, Cin, H, W): two launches on the current stream
        and device. `out` (N, out_channels, H, W), C-contiguous float32, is filled if given.

        The reduce outputs and the pooled input live in buffers kept between calls
        (one set per device, batch and image size): calls on concurrent streams must
        not share a block.
        `checked=True` skips the input checks (``__call__`` has made them).
        """
        import cupy

        if not checked:
            if self._check(x) != "cupy":
                raise TypeError("forward_gpu takes a CuPy array (call the block for other kinds)")
        if x.device.id != cupy.cuda.runtime.getDevice():
            with x.device:  # launches, plans and buffers on x's device
                return self.forward_gpu(x, out, checked=True)
        if not x.flags.c_contiguous:
            x = cupy.ascontiguousarray(x)
        n, _, H, W = x.shape
        g1, g2 = self.groups()
        key = (x.device.id, n, H, W)
        tmp = self._tmp.get(key)
        if tmp is None:
            b1 = self.params["b2_reduce"][0].shape[0]
            c1 = self.params["b3_reduce"][0].shape[0]
            self._tmp.clear()  # keep one size: no unbounded growth over batch sizes
            self._fast.clear()  # its pointers were into those buffers
            tmp = (cupy.empty((n, b1, H, W), np.float32), cupy.empty((n, c1, H, W), np.float32),
                   cupy.empty((n, self.in_channels, H, W), np.float32))
            self._tmp[key] = tmp
        if out is None:
            y = cupy.empty((n, self.out_channels, H, W), np.float32)
        else:
            if (not isinstance(out, cupy.ndarray) or out.shape != (n, self.out_channels, H, W)
                    or out.dtype != np.float32 or not out.flags.c_contiguous):
                raise ValueError(f"out must be a C-contiguous float32 CuPy array of shape "
                                 f"{(n, self.out_channels, H, W)}")
            y = out
        bufs = {"x": x, "y": y, "t3": tmp[0], "t5": tmp[1], "xp": tmp[2]}
        g1(bufs, checked=True)
        g2(bufs, checked=True)
        return y

    def torch_reference(self, x):
        """torch.nn.functional forward with the same weights, on x's device (cuDNN on GPU),
        in x's dtype (float64 input: a float64 reference)."""
        import torch
        import torch.nn.functional as F

        dev = x.device
        key = (str(dev), x.dtype)
        cache = getattr(self, "_torch_params", {})
        if key not in cache:
            cache[key] = {k: (torch.from_numpy(w).to(dev, x.dtype), torch.from_numpy(b).to(dev, x.dtype))
                          for k, (w, b) in self.params.items()}
            self._torch_params = cache
        P = cache[key]
        r3, r5 = P["b2"][0].shape[-1] // 2, P["b3"][0].shape[-1] // 2
        y1 = F.relu(F.conv2d(x, *P["b1"]))
        y2 = F.relu(F.conv2d(F.relu(F.conv2d(x, *P["b2_reduce"])), *P["b2"], padding=r3))
        y3 = F.relu(F.conv2d(F.relu(F.conv2d(x, *P["b3_reduce"])), *P["b3"], padding=r5))
        y4 = F.relu(F.conv2d(F.max_pool2d(x, 3, 1, 1), *P["b4"]))
        return torch.cat([y1, y2, y3, y4], 1)

    def flops(self, n: int, H: int | None = None, W: int | None = None) -> int:
        """2 * MACs of the convolutions for a batch of n (H x W; default GoogLeNet's size)."""
        H = self.hw if H is None else H
        W = H if W is None else W
        return 2 * n * H * W * sum(int(np.prod(w.shape)) for w, _ in self.params.values())


def _relu(x):
    return np.maximum(x, 0)


def _conv(x, w, b):
    """Same-padding stride-1 convolution (cross-correlation, as torch) of NCHW x."""
    r = w.shape[-1]
    p = r // 2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (r, r), axis=(2, 3))  # N,C,H,W,r,r
    y = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3]))  # N,H,W,O
    return y.transpose(0, 3, 1, 2) + b[None, :, None, None]


def _maxpool3(x):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    return np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3)).max(axis=(4, 5))


def run_by_kind(x, kind: str, forward_cpu, forward_gpu):
    """(result, backend input) of x, a checked array of `kind` (`_arrays.kind_of`):
    numpy or torch CPU on `forward_cpu`, CuPy or torch CUDA on `forward_gpu`, a torch
    tensor on torch's current stream (where the remembered-launch paths launch too).
    The result is the backend's; the caller wraps it as `kind`."""
    xb = _arrays.to_backend(x, "x")
    if kind in ("numpy", "torch-cpu"):
        return forward_cpu(xb), xb
    if kind == "torch":
        from tsm_core.batched.api import _stream_from_ptr

        with _stream_from_ptr(_torch_stream_of(x.device.index)):
            return forward_gpu(xb), xb
    return forward_gpu(xb), xb


def torch_fast_key(x, in_channels: int):
    """(device, n, H, W) of x if it is a tensor the remembered-launch paths take as it
    is (a torch CUDA float32 tensor, contiguous, 4-D with `in_channels` channels, not
    requiring grad, on CuPy's current device); None for anything else, which then
    takes the checked path."""
    torch = _arrays._loaded("torch")
    if torch is None or type(x) is not torch.Tensor or not x.is_cuda or x.requires_grad:
        return None
    shape = x.shape
    if len(shape) != 4 or x.dtype is not torch.float32 or shape[1] != in_channels \
            or not x.is_contiguous():
        return None
    dev = x.get_device()
    import cupy

    if cupy.cuda.runtime.getDevice() != dev:
        return None
    return dev, shape[0], shape[2], shape[3]


def _torch_stream_of(device: int) -> int:
    """torch's current stream on CUDA device `device`, as a raw cudaStream_t."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream
