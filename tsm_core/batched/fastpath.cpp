// The host side of a batched call on torch CUDA tensors, in C++.
//
// batched_matmul's work per call, once a batch's plan and device metadata exist, is
// to recognise the batch and launch its kernel. In Python that costs about 0.2 us a
// tensor on our H100's host (a few attribute reads each, and a tuple to hash):
// 0.15 ms for a batch of 256 problems, more than the kernel takes on most of the
// paper's batches. Here the same check reads each tensor's TensorImpl directly
// (data pointer, sizes, strides, dtype, device: a few ns a tensor, the next
// tensors' objects asked for ahead of use) and the launch is one cuGraphLaunch of
// the batch's one-node graph (or one cuLaunchKernel; see graph_launch).
// `call` is batched_matmul's whole hot path: the argument checks, torch's current
// device and stream (read through c10's own functions where they are found and
// agree with torch's Python getters, else through those getters), the lookup and
// the launch, so that a repeated call costs about what a prepared run does.
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
// Built on first use by tsm_core/batched/native.py against the installed torch; without a
// compiler, batched_matmul keeps its Python path. No CUDA headers: cuLaunchKernel
// and the graph functions are looked up in the driver library already loaded, the
// launcher can be set by `set_launcher` (the tests pass a recorder instead, so this
// file is tested on machines without a GPU; graphs are used only with the driver's
// own launcher).

#include <Python.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <string>
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
    // A one-node CUDA graph of the launch with the alpha and beta of its first hit
    // (graph_launch below); null where not made (graphs off, failed, or not yet).
    void* graph = nullptr;
    void* exec = nullptr;
    double galpha = 0, gbeta = 0;
    bool gtried = false;
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

// ------------------------------------------------ launches through a CUDA graph
//
// A hit can launch a one-node graph of its kernel (cuGraphLaunch) instead of
// cuLaunchKernel: made on the entry's first hit, with that call's alpha and beta
// baked in (a call with others launches directly), on the device the entry
// belongs to (the current one: the lookup matched it). Not into a stream that is
// capturing (cuLaunchKernel is captured as a node; a graph launch is not for every
// driver). The driver's functions by dlsym, in their CUDA 12 / 13 forms.
struct KernelNodeParams {  // CUDA_KERNEL_NODE_PARAMS_v2
    void* func;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void** kernelParams;
    void** extra;
    void* kern;
    void* ctx;
};
struct GraphApi {
    int (*create)(void** graph, unsigned flags) = nullptr;
    int (*add_kernel)(void** node, void* graph, const void* deps, size_t n,
                      const KernelNodeParams* p) = nullptr;
    int (*instantiate)(void** exec, void* graph, unsigned long long flags) = nullptr;
    int (*launch)(void* exec, void* stream) = nullptr;
    int (*exec_destroy)(void* exec) = nullptr;
    int (*destroy)(void* graph) = nullptr;
    int (*is_capturing)(void* stream, int* status) = nullptr;
} g_graph;
bool g_use_graphs = false;     // use_graphs()
LaunchFn g_driver_launch = nullptr;  // the driver's cuLaunchKernel: graphs only with it

bool find_graph_api(void* h) {
    GraphApi a;
    a.create = reinterpret_cast<decltype(a.create)>(dlsym(h, "cuGraphCreate"));
    a.add_kernel = reinterpret_cast<decltype(a.add_kernel)>(dlsym(h, "cuGraphAddKernelNode_v2"));
    a.instantiate =
        reinterpret_cast<decltype(a.instantiate)>(dlsym(h, "cuGraphInstantiateWithFlags"));
    a.launch = reinterpret_cast<decltype(a.launch)>(dlsym(h, "cuGraphLaunch"));
    a.exec_destroy = reinterpret_cast<decltype(a.exec_destroy)>(dlsym(h, "cuGraphExecDestroy"));
    a.destroy = reinterpret_cast<decltype(a.destroy)>(dlsym(h, "cuGraphDestroy"));
    a.is_capturing = reinterpret_cast<decltype(a.is_capturing)>(dlsym(h, "cuStreamIsCapturing"));
    const bool ok = a.create && a.add_kernel && a.instantiate && a.launch && a.exec_destroy &&
                    a.destroy && a.is_capturing;
    g_graph = ok ? a : GraphApi{};
    return ok;
}

void drop_graph(Entry* e) {
    if (e->exec != nullptr && g_graph.exec_destroy != nullptr) g_graph.exec_destroy(e->exec);
    if (e->graph != nullptr && g_graph.destroy != nullptr) g_graph.destroy(e->graph);
    e->exec = e->graph = nullptr;
}

// Makes e's graph for this alpha and beta (once an entry; false if it cannot).
bool make_graph(Entry* e, double alpha, double beta) {
    e->gtried = true;
    float fa = (float)alpha, fb = (float)beta;
    void* params[4] = {&e->meta, &e->tiles, e->dbl ? (void*)&alpha : (void*)&fa,
                       e->dbl ? (void*)&beta : (void*)&fb};
    KernelNodeParams kp{e->func, e->grid, 1, 1, e->block, 1, 1, e->smem, params, nullptr, nullptr,
                        nullptr};
    void* node = nullptr;
    if (g_graph.create(&e->graph, 0) != 0 || g_graph.add_kernel(&node, e->graph, nullptr, 0, &kp) != 0 ||
        g_graph.instantiate(&e->exec, e->graph, 0) != 0) {
        e->exec = nullptr;  // (a failed instantiate leaves it undefined)
        drop_graph(e);
        return false;
    }
    e->galpha = alpha;
    e->gbeta = beta;
    return true;
}

// Launches e through its graph where it can: 0 launched, 1 not (the caller launches
// directly), < 0 the graph launch's error as -CUresult.
long graph_launch(Entry* e, uint64_t stream, double alpha, double beta) {
    if (!g_use_graphs || g_launch != g_driver_launch || e->grid == 0) return 1;
    if (!e->gtried && !make_graph(e, alpha, beta)) return 1;
    if (e->exec == nullptr || alpha != e->galpha || beta != e->gbeta) return 1;
    int capturing = 0;
    void* st = reinterpret_cast<void*>(stream);
    if (g_graph.is_capturing(st, &capturing) != 0 || capturing != 0) return 1;
    const int rc = g_graph.launch(e->exec, st);
    return rc == 0 ? 0 : -(long)rc;
}

PyTypeObject* g_tensor_type = nullptr;  // torch.Tensor itself (not a subclass)
int g_host_device = -1;                 // the device a CPU tensor's record names (tests)

const c10::TensorImpl* impl_of(PyObject* o) { return THPVariable_Unpack(o).unsafeGetTensorImpl(); }

// The record of one tensor, read from its TensorImpl and StorageImpl (torch's inline
// accessors; no virtual calls for an ordinary tensor); false for anything not a 2-D
// tensor with storage that does not require grad (the caller then takes the Python
// path, which says what is wrong). Sizes and strides first, since they are what
// differs between the batches a caller alternates. About 9 ns a tensor on the
// development machine, 12-16 on our H100's host, with the next tensors' memory asked
// for ahead (ask_ahead): three dependent reads (the Python object, the TensorImpl,
// the StorageImpl), which is what is left.
// (Throws where torch does: callers catch, once a batch.)
template <bool kChecked>
__attribute__((always_inline)) inline bool read_rec_impl(PyObject* o, Rec& r) {
    if (kChecked && !THPVariable_Check(o)) return false;
    const c10::TensorImpl* ti = impl_of(o);
    // Not strided (sparse, sparse compressed, mkldnn): no storage, refused below; a
    // layout() test here cost about 1 ns a tensor (out of line in torch).
    if (ti->dim() != 2) return false;
    const auto sz = ti->sizes();
    const auto st = ti->strides();
    r.size[0] = sz[0];
    r.size[1] = sz[1];
    r.stride[0] = st[0];
    r.stride[1] = st[1];
    const c10::StorageImpl* si = ti->unsafe_storage().unsafeGetStorageImpl();
    if (si == nullptr) return false;
    const caffe2::TypeMeta dt = ti->dtype();
    r.ptr = (uint64_t)(uintptr_t)si->data() +
            (uint64_t)(ti->storage_offset() * (int64_t)dt.itemsize());
    r.dtype = (int32_t)dt.toScalarType();
    r.device = ti->is_cuda() ? (int32_t)ti->get_device() : g_host_device;
    return !ti->requires_grad();  // (out of line in torch: last)
}

__attribute__((always_inline)) inline bool read_rec_throws(PyObject* o, Rec& r) {
    return Py_TYPE(o) == g_tensor_type ? read_rec_impl<false>(o, r) : read_rec_impl<true>(o, r);
}

bool read_rec(PyObject* o, Rec& r) {
    try {
        return read_rec_throws(o, r);
    } catch (...) {  // a tensor torch will not describe (custom sizes, no data...)
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

// How far ahead the reading loops ask for the next tensors' memory: the Python
// object kAhead * 2 tensors on, the TensorImpl kAhead on (its object is in cache
// by then; 0: none). A repeated call finds the tensors' objects out of the CPU's caches
// more often than not (the GPU's work comes between two calls); this keeps several
// of those misses in flight instead of one at a time (measured on the development
// machine, 768 tensors: 8 against 11 ns a tensor warm, 90 against 170 cold).
Py_ssize_t g_ahead = 4;  // kAhead; set_ahead changes it (for measurements)

inline void ask_ahead(PyObject* const* obj, Py_ssize_t i, Py_ssize_t total) {
    const Py_ssize_t d = g_ahead;
    if (d == 0) return;
    if (i + 2 * d < total) __builtin_prefetch(reinterpret_cast<const char*>(obj[i + 2 * d]) + 16);
    if (i + d < total && Py_TYPE(obj[i + d]) == g_tensor_type) {
        const char* p = reinterpret_cast<const char*>(impl_of(obj[i + d]));
        __builtin_prefetch(p);
        __builtin_prefetch(p + 64);
        __builtin_prefetch(p + 128);
    }
}

std::vector<PyObject*> g_objs;  // this call's tensors, As then Bs then Cs

// This call's tensors into g_objs (As, then Bs, then Cs); false if a list is not a
// list or tuple, the lengths differ, or they are empty.
bool gather(PyObject* const* lists) {
    Py_ssize_t n[3];
    PyObject** it[3];
    for (int j = 0; j < 3; ++j) {
        it[j] = items(lists[j], n[j]);
        if (it[j] == nullptr) return false;
    }
    if (n[0] != n[1] || n[0] != n[2] || n[0] == 0) return false;
    g_objs.resize(3 * (size_t)n[0]);
    for (int j = 0; j < 3; ++j)
        std::memcpy(g_objs.data() + j * n[0], it[j], sizeof(PyObject*) * (size_t)n[0]);
    return true;
}

// The records of g_objs into `out`; false if a tensor has no record.
bool read_objs(std::vector<Rec>& out) {
    const Py_ssize_t total = (Py_ssize_t)g_objs.size();
    out.resize((size_t)total);
    PyObject* const* obj = g_objs.data();
    try {  // (a tensor torch will not describe: custom sizes, no data...)
        for (Py_ssize_t i = 0; i < total; ++i) {
            ask_ahead(obj, i, total);
            if (!read_rec_throws(obj[i], out[(size_t)i])) return false;
        }
    } catch (...) {
        return false;
    }
    return true;
}

// Whether g_objs have exactly the records `cand` (the hit test of a repeated call:
// each record read and compared, nothing stored; it stops at the first that
// differs).
bool same_objs(const std::vector<Rec>& cand) {
    const Py_ssize_t total = (Py_ssize_t)g_objs.size();
    if (cand.size() != (size_t)total) return false;
    PyObject* const* obj = g_objs.data();
    try {
        for (Py_ssize_t i = 0; i < total; ++i) {
            ask_ahead(obj, i, total);
            Rec r;
            if (!read_rec_throws(obj[i], r) || std::memcmp(&r, &cand[(size_t)i], sizeof(Rec)) != 0)
                return false;
        }
    } catch (...) {
        return false;
    }
    return true;
}

// The records of As, Bs, Cs into `out` (remember's reader); false as gather and
// read_objs.
bool read_batch(PyObject* const* lists, std::vector<Rec>& out) {
    return gather(lists) && read_objs(out);
}

void drop(Entry* e) {
    drop_graph(e);
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

// The remembered batch of device `dev` whose tensors g_objs holds, most recently
// used first; nullptr if none. `same`: g_objs has the first entry's records
// (same_objs); otherwise, or where that entry is of another device, every record
// is read into g_scratch and compared with every entry's. `readable` false: a
// tensor has no record (not a batch this path takes).
Entry* match(long dev, bool same, bool& readable) {
    readable = true;
    if (same && g_entries[0]->dev == dev) return g_entries[0];
    if (!read_objs(g_scratch)) {
        readable = false;
        return nullptr;
    }
    const size_t bytes = g_scratch.size() * sizeof(Rec);
    for (size_t i = 0; i < g_entries.size(); ++i) {
        Entry* e = g_entries[i];
        if (e->dev != dev || e->recs.size() != g_scratch.size() ||
            std::memcmp(e->recs.data(), g_scratch.data(), bytes) != 0)
            continue;
        if (i) {
            g_entries.erase(g_entries.begin() + (long)i);
            g_entries.insert(g_entries.begin(), e);
        }
        return e;
    }
    return nullptr;
}

// The call's tensors gathered (false: not lists of one length) and compared with
// the most recently used entry's records (`same`).
bool start_call(PyObject* const* lists, bool& same) {
    if (g_tensor_type == nullptr) g_tensor_type = reinterpret_cast<PyTypeObject*>(THPVariableClass);
    if (!gather(lists)) return false;
    same = !g_entries.empty() && same_objs(g_entries[0]->recs);
    return true;
}

// Launch entry e on `stream`: 0, or the launch's error as -CUresult (3: no launcher).
long launch_entry(Entry* e, uint64_t stream, double alpha, double beta) {
    const long g = graph_launch(e, stream, alpha, beta);
    if (g != 1) return g;
    const int rc = launch_args(e->func, e->grid, e->block, e->smem, reinterpret_cast<void*>(stream),
                               e->meta, e->tiles, alpha, beta, e->dbl);
    return rc == 0 ? 0 : -(long)rc;
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
    const long dev = PyLong_AsLong(args[3]);
    uint64_t stream;
    double alpha, beta;
    if ((dev == -1 && PyErr_Occurred()) || !as_u64(args[4], stream) || !as_double(args[5], alpha) ||
        !as_double(args[6], beta))
        return nullptr;
    bool same, readable;
    if (!start_call(args, same)) return PyLong_FromLong(2);
    Entry* e = match(dev, same, readable);
    if (!readable) return PyLong_FromLong(2);
    if (e == nullptr) return PyLong_FromLong(1);
    return PyLong_FromLong(launch_entry(e, stream, alpha, beta));
}

// ------------------------------------------------ torch's current device and stream

// c10's own functions, found in the loaded libc10_cuda by their (Itanium ABI)
// names: c10::cuda::current_device() and getCurrentCUDAStream(DeviceIndex), whose
// CUDAStream (16 trivially copyable bytes: a Device and a stream id) comes back in
// two registers and is passed by address as `this` to CUDAStream::stream(). Python
// enables them only after they gave what torch's getters give (tsm_core._batched).
struct StreamBits {
    uint64_t lo, hi;
};
using CurDeviceFn = int8_t (*)();
using CurStreamFn = StreamBits (*)(int8_t);
using RawStreamFn = void* (*)(const StreamBits*);
std::string g_c10_path;  // the library they came from, "" for none
CurDeviceFn g_cur_device = nullptr;
CurStreamFn g_cur_stream = nullptr;
RawStreamFn g_raw_stream = nullptr;
PyObject* g_py_device = nullptr;  // torch's Python getters: () -> int, (int) -> int
PyObject* g_py_stream = nullptr;

// torch's current device and raw stream: 0, 2 (no getters set) or -1 (a Python error).
int current_stream(long& dev, uint64_t& stream) {
    if (g_cur_stream != nullptr) {
        try {
            dev = g_cur_device();
            const StreamBits b = g_cur_stream((int8_t)dev);
            stream = (uint64_t)(uintptr_t)g_raw_stream(&b);
            return 0;
        } catch (...) {  // a CUDA error: torch's Python getters will say which
        }
    }
    if (g_py_stream == nullptr) return 2;
    PyObject* d = PyObject_CallNoArgs(g_py_device);
    if (d == nullptr) return -1;
    dev = PyLong_AsLong(d);
    PyObject* st = (dev == -1 && PyErr_Occurred()) ? nullptr : PyObject_CallOneArg(g_py_stream, d);
    Py_DECREF(d);
    if (st == nullptr) return -1;
    const bool ok = as_u64(st, stream);
    Py_DECREF(st);
    return ok ? 0 : -1;
}

// set_stream_getters(device_fn, stream_fn): torch's Python getters of the current
// device and of a device's current raw stream (the fallback of c10's); two Nones
// forget them.
PyObject* set_stream_getters(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    const bool none = nargs == 2 && args[0] == Py_None && args[1] == Py_None;
    if (nargs != 2 || (!none && (!PyCallable_Check(args[0]) || !PyCallable_Check(args[1])))) {
        PyErr_SetString(PyExc_TypeError, "set_stream_getters takes two callables (or two Nones)");
        return nullptr;
    }
    PyObject* d = none ? nullptr : args[0];
    PyObject* st = none ? nullptr : args[1];
    Py_XINCREF(d);
    Py_XINCREF(st);
    Py_XSETREF(g_py_device, d);
    Py_XSETREF(g_py_stream, st);
    Py_RETURN_NONE;
}

// use_c10(path) -> bool: read the current device and stream through the c10
// functions of the already loaded library `path` (libc10_cuda); "" stops. False
// (and the Python getters stay in use) where the library or a name is not found.
PyObject* use_c10(PyObject*, PyObject* arg) {
    const char* path = PyUnicode_AsUTF8(arg);
    if (path == nullptr) return nullptr;
    g_cur_device = nullptr;
    g_cur_stream = nullptr;
    g_raw_stream = nullptr;
    g_c10_path.clear();
    if (*path == '\0') Py_RETURN_FALSE;
    void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);  // never loads it: torch has, or not
    if (h == nullptr) Py_RETURN_FALSE;
    auto dev = reinterpret_cast<CurDeviceFn>(dlsym(h, "_ZN3c104cuda14current_deviceEv"));
    auto cur = reinterpret_cast<CurStreamFn>(dlsym(h, "_ZN3c104cuda20getCurrentCUDAStreamEa"));
    auto raw = reinterpret_cast<RawStreamFn>(dlsym(h, "_ZNK3c104cuda10CUDAStream6streamEv"));
    dlclose(h);  // a reference dropped; the library stays loaded (torch holds it)
    if (dev == nullptr || cur == nullptr || raw == nullptr) Py_RETURN_FALSE;
    g_cur_device = dev;
    g_cur_stream = cur;
    g_raw_stream = raw;
    g_c10_path = path;
    Py_RETURN_TRUE;
}

// stream_state() -> (device_fn, stream_fn, c10 path): what set_stream_getters and
// use_c10 set (None, None, "" where nothing), for a caller that restores them.
PyObject* stream_state(PyObject*, PyObject*) {
    return Py_BuildValue("(OOs)", g_py_device ? g_py_device : Py_None,
                         g_py_stream ? g_py_stream : Py_None, g_c10_path.c_str());
}

// current() -> (device, raw stream) as `call` reads them; None without getters.
PyObject* current(PyObject*, PyObject*) {
    long dev;
    uint64_t stream;
    const int rc = current_stream(dev, stream);
    if (rc < 0) return nullptr;
    if (rc == 2) Py_RETURN_NONE;
    return Py_BuildValue("(lK)", dev, (unsigned long long)stream);
}

// call(As, Bs, Cs, alpha, beta) -> int: batched_matmul's hot path. Codes as
// lookup_launch's; 2 also for alpha or beta not exactly float or int, a tensor not
// on a GPU, or no stream getters.
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "call takes 5 arguments");
        return nullptr;
    }
    for (int j = 3; j < 5; ++j)
        if (!PyFloat_CheckExact(args[j]) && !PyLong_CheckExact(args[j])) return PyLong_FromLong(2);
    for (int j = 0; j < 3; ++j)
        if (!PyList_CheckExact(args[j]) && !PyTuple_CheckExact(args[j])) return PyLong_FromLong(2);
    double alpha, beta;
    if (!as_double(args[3], alpha) || !as_double(args[4], beta)) return nullptr;
    bool same, readable;
    if (!start_call(args, same)) return PyLong_FromLong(2);
    // Tensors not on a GPU are the Python path's (first the first one's record).
    Rec r0;
    if (!read_rec(g_objs[0], r0) || r0.device < 0) return PyLong_FromLong(2);
    long dev;  // after that: a CPU-only torch has no current device to ask for
    uint64_t stream;
    const int rc = current_stream(dev, stream);
    if (rc < 0) return nullptr;
    if (rc == 2) return PyLong_FromLong(2);
    Entry* e = match(dev, same, readable);
    if (!readable) return PyLong_FromLong(2);
    if (e == nullptr) return PyLong_FromLong(1);
    return PyLong_FromLong(launch_entry(e, stream, alpha, beta));
}

// use_graphs(on) -> bool: hits launch through a one-node CUDA graph (graph_launch)
// from now on, where the driver has the functions (and while the launcher is the
// driver's: the tests' recorder sees every launch); returns whether it is on.
// None only asks.
PyObject* use_graphs(PyObject*, PyObject* arg) {
    if (arg != Py_None) {
        const int on = PyObject_IsTrue(arg);
        if (on < 0) return nullptr;
        g_use_graphs = on != 0 && g_graph.launch != nullptr;
    }
    return PyBool_FromLong(g_use_graphs);
}

// set_ahead(d): how many tensors ahead the reading loops ask for memory (for measurements);
// returns the distance before.
PyObject* set_ahead(PyObject*, PyObject* arg) {
    const long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return nullptr;
    if (v < 0 || v > 64) {
        PyErr_SetString(PyExc_ValueError, "set_ahead takes 0 to 64");
        return nullptr;
    }
    const long before = (long)g_ahead;
    g_ahead = (Py_ssize_t)v;
    return PyLong_FromLong(before);
}

// host_device(d): the device that the records of tensors not on a GPU name from
// now on (-1, the default: none, so `call` leaves them to the Python path). For
// the tests, which stand CPU tensors in for CUDA ones.
PyObject* host_device(PyObject*, PyObject* arg) {
    const long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return nullptr;
    g_host_device = (int)v;
    Py_RETURN_NONE;
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
    g_driver_launch = g_launch;
    if (h != nullptr) find_graph_api(h);
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
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
     "call(As, Bs, Cs, alpha, beta) -> as lookup_launch, on torch's current device and stream"},
    {"set_stream_getters", (PyCFunction)(void (*)(void))set_stream_getters, METH_FASTCALL,
     "set_stream_getters(device_fn, stream_fn): torch's Python getters, call's fallback"},
    {"use_c10", use_c10, METH_O,
     "use_c10(path_of_libc10_cuda) -> bool: read device and stream through c10; '' stops"},
    {"stream_state", stream_state, METH_NOARGS,
     "(device_fn, stream_fn, c10 path) as set, to restore them"},
    {"current", current, METH_NOARGS, "(device, raw stream) as call reads them, or None"},
    {"use_graphs", use_graphs, METH_O,
     "use_graphs(on or None) -> bool: hits launch through one-node CUDA graphs where possible"},
    {"set_ahead", set_ahead, METH_O, "set_ahead(d) -> previous: tensors read ahead (0-64)"},
    {"host_device", host_device, METH_O,
     "host_device(d): the device records of CPU tensors name (tests; -1: none)"},
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
                       "Batched-call fast path for torch tensors (tsm_core/batched/fastpath.cpp)", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_tsm_fastpath() {
    PyObject* m = PyModule_Create(&kModule);
    if (m == nullptr) return nullptr;
    g_tensor_type = reinterpret_cast<PyTypeObject*>(THPVariableClass);  // torch is imported
    PyObject* r = find_driver_launch();  // None found is fine: set_launcher, or no GPU
    Py_XDECREF(r);
    PyModule_AddIntConstant(m, "REC_BYTES", (long)sizeof(Rec));
    PyModule_AddIntConstant(m, "MAX_ENTRIES", (long)kMaxEntries);
    return m;
}
