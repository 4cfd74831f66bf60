// The host side of a batched call on torch CUDA tensors, in C++.
//
// batched_matmul's work per call, once a batch's plan and device metadata exist, is
// to recognise the batch and launch its kernel. In Python that costs about 0.2 us a
// tensor on our H100's host (a few attribute reads each, and a tuple to hash):
// 0.15 ms for a batch of 256 problems, more than the kernel takes on most of the
// paper's batches. Here the same check reads each tensor's TensorImpl directly
// (data pointer, sizes, strides, dtype, device: about 10 ns a tensor) and the
// launch is one cuLaunchKernel.
//
// A batch is matched by what its launch depends on, not by object identity: two
// calls whose tensors agree in data pointer, sizes, strides, dtype and device run
// the same kernel with the same metadata, whatever Python objects carry them. So
// nothing here holds a reference to a tensor (the cache never keeps memory alive),
// and no change of a tensor can slip past it: an in-place transpose, `t.data = u`,
// a storage resize, all change one of the fields compared (the Python identity key
// this replaces could not see `t.data = u` with the same pointer). Tensors that
// require grad are never matched (the first call refuses them).
//
// Built on first use by tsm_core/_native.py against the installed torch; without a
// compiler, batched_matmul keeps its Python path. No CUDA headers: cuLaunchKernel
// is looked up in the driver library already loaded, or set by `set_launcher` (the
// tests pass a recorder instead, so this file is tested on machines without a GPU).

#include <Python.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <torch/csrc/autograd/python_variable.h>

namespace {

// cuLaunchKernel's signature, with the driver's opaque types as void*.
using LaunchFn = int (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned smem, void* stream, void** params,
                         void** extra);

LaunchFn g_launch = nullptr;

// What a launch depends on, per tensor. Fixed size and zero-padded, so that two
// batches compare as bytes.
struct Rec {
    uint64_t ptr;
    int64_t size[2];
    int64_t stride[2];
    int32_t dtype;
    int32_t device;  // device index, or -1 for anything but a CUDA tensor
};
static_assert(sizeof(Rec) == 48, "Rec is compared as bytes: no hidden padding");

// One remembered batch: its records and everything its launch needs.
struct Entry {
    std::vector<Rec> recs;      // As, then Bs, then Cs
    int dev = -1;               // the CUDA device whose context owns `func`
    PyObject* owner = nullptr;  // the Python launch object: keeps meta, tiles alive
    void* func = nullptr;
    unsigned grid = 0, block = 0, smem = 0;
    bool dbl = false;
    uint64_t meta = 0, tiles = 0;
};

constexpr size_t kMaxEntries = 64;  // as tsm_core._batched._META_CACHE
std::vector<Entry*> g_entries;      // most recently used first
std::vector<Rec> g_scratch;         // this call's records

// The launch arguments of tsm_batched_gemm(meta, tiles, alpha, beta).
int launch_args(void* func, unsigned grid, unsigned block, unsigned smem, void* stream,
                uint64_t meta, uint64_t tiles, double alpha, double beta, bool dbl) {
    if (grid == 0) return 0;  // an all-empty batch: nothing to run
    if (g_launch == nullptr) return -3;
    float fa = (float)alpha, fb = (float)beta;
    void* params[4] = {&meta, &tiles, dbl ? (void*)&alpha : (void*)&fa,
                       dbl ? (void*)&beta : (void*)&fb};
    return g_launch(func, grid, 1, 1, block, 1, 1, smem, stream, params, nullptr);
}

// The record of one tensor; false for anything not a strided 2-D tensor that does
// not require grad (the caller then takes the Python path, which says what is wrong).
bool read_rec(PyObject* o, Rec& r) {
    if (!THPVariable_Check(o)) return false;
    try {
        const at::Tensor& t = THPVariable_Unpack(o);
        if (!t.defined() || t.layout() != c10::kStrided || t.dim() != 2 || t.requires_grad())
            return false;
        std::memset(&r, 0, sizeof(r));
        r.ptr = (uint64_t)(uintptr_t)t.const_data_ptr();
        const auto sz = t.sizes();
        const auto st = t.strides();
        r.size[0] = sz[0];
        r.size[1] = sz[1];
        r.stride[0] = st[0];
        r.stride[1] = st[1];
        r.dtype = (int32_t)t.scalar_type();
        r.device = t.is_cuda() ? (int32_t)t.get_device() : -1;
        return true;
    } catch (...) {  // a tensor torch will not describe (no storage, a subclass...)
        return false;
    }
}

// Items of a list or tuple (borrowed), or nullptr.
PyObject** items(PyObject* seq, Py_ssize_t& n) {
    if (PyList_Check(seq)) {
        n = PyList_GET_SIZE(seq);
        return reinterpret_cast<PyListObject*>(seq)->ob_item;
    }
    if (PyTuple_Check(seq)) {
        n = PyTuple_GET_SIZE(seq);
        return reinterpret_cast<PyTupleObject*>(seq)->ob_item;
    }
    return nullptr;
}

// The records of As, Bs, Cs into `out`; false if any is not a list or tuple, the
// lengths differ, or a tensor has no record.
bool read_batch(PyObject* const* lists, std::vector<Rec>& out) {
    Py_ssize_t n[3];
    PyObject** it[3];
    for (int j = 0; j < 3; ++j) {
        it[j] = items(lists[j], n[j]);
        if (it[j] == nullptr) return false;
    }
    if (n[0] != n[1] || n[0] != n[2] || n[0] == 0) return false;
    out.resize(3 * (size_t)n[0]);
    size_t k = 0;
    for (int j = 0; j < 3; ++j)
        for (Py_ssize_t i = 0; i < n[j]; ++i)
            if (!read_rec(it[j][i], out[k++])) return false;
    return true;
}

void drop(Entry* e) {
    Py_XDECREF(e->owner);
    delete e;
}

bool as_u64(PyObject* o, uint64_t& v) {
    v = PyLong_AsUnsignedLongLong(o);
    return !(v == (uint64_t)-1 && PyErr_Occurred());
}

bool as_double(PyObject* o, double& v) {
    v = PyFloat_AsDouble(o);
    return !(v == -1.0 && PyErr_Occurred());
}

// ---------------------------------------------------------------- module functions

// lookup_launch(As, Bs, Cs, device, stream, alpha, beta) -> int
//   0: a remembered batch, launched on `stream`; 1: not remembered (nothing done);
//   2: not a batch this path takes (the Python path checks it); 3: no launcher
//   (no driver library found); < 0: the launch failed, -CUresult.
PyObject* lookup_launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "lookup_launch takes 7 arguments");
        return nullptr;
    }
    if (!read_batch(args, g_scratch)) return PyLong_FromLong(2);
    const long dev = PyLong_AsLong(args[3]);
    uint64_t stream;
    double alpha, beta;
    if ((dev == -1 && PyErr_Occurred()) || !as_u64(args[4], stream) || !as_double(args[5], alpha) ||
        !as_double(args[6], beta))
        return nullptr;
    const size_t bytes = g_scratch.size() * sizeof(Rec);
    for (size_t i = 0; i < g_entries.size(); ++i) {
        Entry* e = g_entries[i];
        if (e->dev != dev || e->recs.size() != g_scratch.size() ||
            std::memcmp(e->recs.data(), g_scratch.data(), bytes) != 0)
            continue;
        if (i) {  // most recently used first
            g_entries.erase(g_entries.begin() + (long)i);
            g_entries.insert(g_entries.begin(), e);
        }
        const int rc = launch_args(e->func, e->grid, e->block, e->smem,
                                   reinterpret_cast<void*>(stream), e->meta, e->tiles, alpha,
                                   beta, e->dbl);
        return PyLong_FromLong(rc == 0 ? 0 : -(long)rc);
    }
    return PyLong_FromLong(1);
}

// remember(As, Bs, Cs, device, owner, func, grid, block, smem, meta, tiles, is_double)
//   -> bool: keeps the batch's records and launch (the least recently used of
//   kMaxEntries goes); False where the batch has no records (nothing kept).
PyObject* remember(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "remember takes 12 arguments");
        return nullptr;
    }
    std::vector<Rec> recs;
    if (!read_batch(args, recs)) Py_RETURN_FALSE;
    uint64_t func, grid, block, smem, meta, tiles;
    const long dev = PyLong_AsLong(args[3]);
    if ((dev == -1 && PyErr_Occurred()) || !as_u64(args[5], func) || !as_u64(args[6], grid) ||
        !as_u64(args[7], block) || !as_u64(args[8], smem) || !as_u64(args[9], meta) ||
        !as_u64(args[10], tiles))
        return nullptr;
    const int dbl = PyObject_IsTrue(args[11]);
    if (dbl < 0) return nullptr;
    // The same records again (a batch re-planned): replace the old entry.
    const size_t bytes = recs.size() * sizeof(Rec);
    for (size_t i = 0; i < g_entries.size(); ++i) {
        Entry* e = g_entries[i];
        if (e->dev == dev && e->recs.size() == recs.size() &&
            std::memcmp(e->recs.data(), recs.data(), bytes) == 0) {
            g_entries.erase(g_entries.begin() + (long)i);
            drop(e);
            break;
        }
    }
    Entry* e = new Entry;
    e->recs = std::move(recs);
    e->dev = (int)dev;
    Py_INCREF(args[4]);
    e->owner = args[4];
    e->func = reinterpret_cast<void*>(func);
    e->grid = (unsigned)grid;
    e->block = (unsigned)block;
    e->smem = (unsigned)smem;
    e->meta = meta;
    e->tiles = tiles;
    e->dbl = dbl != 0;
    g_entries.insert(g_entries.begin(), e);
    if (g_entries.size() > kMaxEntries) {
        drop(g_entries.back());
        g_entries.pop_back();
    }
    Py_RETURN_TRUE;
}

// launch(func, grid, block, smem, stream, meta, tiles, alpha, beta, is_double) -> int:
//   one launch of tsm_batched_gemm (a prepared batch); 0, or the launch's error as
//   lookup_launch returns it.
PyObject* launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "launch takes 10 arguments");
        return nullptr;
    }
    uint64_t func, grid, block, smem, stream, meta, tiles;
    double alpha, beta;
    if (!as_u64(args[0], func) || !as_u64(args[1], grid) || !as_u64(args[2], block) ||
        !as_u64(args[3], smem) || !as_u64(args[4], stream) || !as_u64(args[5], meta) ||
        !as_u64(args[6], tiles) || !as_double(args[7], alpha) || !as_double(args[8], beta))
        return nullptr;
    const int dbl = PyObject_IsTrue(args[9]);
    if (dbl < 0) return nullptr;
    const int rc = launch_args(reinterpret_cast<void*>(func), (unsigned)grid, (unsigned)block,
                               (unsigned)smem, reinterpret_cast<void*>(stream), meta, tiles, alpha,
                               beta, dbl != 0);
    return PyLong_FromLong(rc == 0 ? 0 : -(long)rc);
}

PyObject* clear(PyObject*, PyObject*) {
    for (Entry* e : g_entries) drop(e);
    g_entries.clear();
    Py_RETURN_NONE;
}

PyObject* size(PyObject*, PyObject*) { return PyLong_FromSize_t(g_entries.size()); }

// set_launcher(address): the function launches go to (cuLaunchKernel's signature);
// 0 restores the driver's. Returns the address in use before.
PyObject* find_driver_launch();
PyObject* set_launcher(PyObject*, PyObject* arg) {
    uint64_t addr;
    if (!as_u64(arg, addr)) return nullptr;
    const uint64_t before = (uint64_t)(uintptr_t)g_launch;
    if (addr == 0) {
        PyObject* r = find_driver_launch();
        if (r == nullptr) return nullptr;
        Py_DECREF(r);
    } else {
        g_launch = reinterpret_cast<LaunchFn>((uintptr_t)addr);
    }
    return PyLong_FromUnsignedLongLong(before);
}

// cuLaunchKernel from the driver library (loaded already by CuPy or torch where a
// GPU is used); True if found.
PyObject* find_driver_launch() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) h = dlopen("libcuda.so.1", RTLD_NOW);
    g_launch = h ? reinterpret_cast<LaunchFn>(dlsym(h, "cuLaunchKernel")) : nullptr;
    return PyBool_FromLong(g_launch != nullptr);
}

PyObject* find_driver(PyObject*, PyObject*) { return find_driver_launch(); }

// ------------------------------------------------ a recording launcher, for the tests

struct DryLaunch {
    uint64_t func = 0, stream = 0, meta = 0, tiles = 0;
    unsigned grid = 0, block = 0, smem = 0;
    double alpha = 0, beta = 0;
    float falpha = 0, fbeta = 0;
    long count = 0;
} g_dry;

// Records its arguments as cuLaunchKernel would read them (alpha and beta read as
// float and as double: the test knows which the kernel takes); returns dry_status.
int g_dry_status = 0;
int dry_launch(void* f, unsigned gx, unsigned, unsigned, unsigned bx, unsigned, unsigned,
               unsigned smem, void* stream, void** params, void**) {
    g_dry.func = (uint64_t)(uintptr_t)f;
    g_dry.grid = gx;
    g_dry.block = bx;
    g_dry.smem = smem;
    g_dry.stream = (uint64_t)(uintptr_t)stream;
    std::memcpy(&g_dry.meta, params[0], 8);
    std::memcpy(&g_dry.tiles, params[1], 8);
    std::memcpy(&g_dry.falpha, params[2], 4);
    std::memcpy(&g_dry.fbeta, params[3], 4);
    std::memcpy(&g_dry.alpha, params[2], 8);
    std::memcpy(&g_dry.beta, params[3], 8);
    ++g_dry.count;
    return g_dry_status;
}

PyObject* dry_launcher(PyObject*, PyObject*) {
    return PyLong_FromUnsignedLongLong((uint64_t)(uintptr_t)&dry_launch);
}

// dry_last() -> dict of the recording launcher's last call and its call count.
PyObject* dry_last(PyObject*, PyObject*) {
    return Py_BuildValue("{sKsIsIsIsKsKsKsdsdsdsdsl}", "func", (unsigned long long)g_dry.func,
                         "grid", g_dry.grid, "block", g_dry.block, "smem", g_dry.smem, "stream",
                         (unsigned long long)g_dry.stream, "meta", (unsigned long long)g_dry.meta,
                         "tiles", (unsigned long long)g_dry.tiles, "alpha_f32",
                         (double)g_dry.falpha, "beta_f32", (double)g_dry.fbeta, "alpha_f64",
                         g_dry.alpha, "beta_f64", g_dry.beta, "count", g_dry.count);
}

// dry_status(code): what the recording launcher returns from now on (a CUresult).
PyObject* dry_status(PyObject*, PyObject* arg) {
    const long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return nullptr;
    g_dry_status = (int)v;
    Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"lookup_launch", (PyCFunction)(void (*)(void))lookup_launch, METH_FASTCALL,
     "lookup_launch(As, Bs, Cs, device, stream, alpha, beta) -> 0 launched, 1 not "
     "remembered, 2 not for this path, 3 no launcher, < 0 -CUresult"},
    {"remember", (PyCFunction)(void (*)(void))remember, METH_FASTCALL,
     "remember(As, Bs, Cs, device, owner, func, grid, block, smem, meta, tiles, is_double) -> bool"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(func, grid, block, smem, stream, meta, tiles, alpha, beta, is_double) -> 0 or -CUresult"},
    {"clear", clear, METH_NOARGS, "forget every remembered batch"},
    {"size", size, METH_NOARGS, "number of remembered batches"},
    {"set_launcher", set_launcher, METH_O,
     "set_launcher(address) -> previous address; 0: the driver's cuLaunchKernel"},
    {"find_driver", find_driver, METH_NOARGS, "look up cuLaunchKernel; True if found"},
    {"dry_launcher", dry_launcher, METH_NOARGS, "address of a launcher that records its call"},
    {"dry_last", dry_last, METH_NOARGS, "the recording launcher's last call"},
    {"dry_status", dry_status, METH_O, "set what the recording launcher returns"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "tsm_fastpath",
                       "Batched-call fast path for torch tensors (tsm_core/csrc/fastpath.cpp)", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_tsm_fastpath() {
    PyObject* m = PyModule_Create(&kModule);
    if (m == nullptr) return nullptr;
    PyObject* r = find_driver_launch();  // None found is fine: set_launcher, or no GPU
    Py_XDECREF(r);
    PyModule_AddIntConstant(m, "REC_BYTES", (long)sizeof(Rec));
    PyModule_AddIntConstant(m, "MAX_ENTRIES", (long)kMaxEntries);
    return m;
}
