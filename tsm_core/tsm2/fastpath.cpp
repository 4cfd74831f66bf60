// The host side of a repeated matmul() on torch tensors routed to cuBLAS, in C++.
//
// tsm2/api.py remembers, per key of array properties, where a call goes; for torch
// tensors on the cuBLAS route that is torch's own mm / addmm_. Reading the key in
// Python costs about 1 us a tensor (shape, stride(), dtype, device, requires_grad:
// each a Python-level attribute), which is more than the gap to torch.mm allowed.
// Here the same properties are read from each tensor's TensorImpl (a few ns), the
// key is compared with the remembered ones, out's bytes are checked against A's and
// B's (every call: addresses are never part of a key), and at::mm_out / mm / addmm_
// run in the same call.
//
// A key holds, per tensor (A, B, out): sizes, strides, dtype, device type and index;
// and whether out is given, alpha is 1, beta is 0 (or out absent), and the algorithm
// asked for. No pointer: a freed and reused allocation meets only the properties'
// decision, which does not depend on where the data is. Tensors that require grad,
// subclasses, non-strided layouts and alpha / beta that are not a Python float or
// int are never matched (the Python path checks and refuses or computes them).
// `call` returns None on any miss; the caller then takes the Python path, which
// computes the same result.
//
// Built on first use by tsm_core/tsm2/fastpath.py against the installed torch (as the
// batched fast path); without a compiler, matmul keeps its Python path.

#include <Python.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

struct Rec {
    int64_t size[2];
    int64_t stride[2];
    int32_t dtype;
    int32_t devtype;
    int32_t devindex;
    int32_t itemsize;
};
static_assert(sizeof(Rec) == 48, "Rec is compared as bytes: no hidden padding");

struct Key {
    Rec r[3];       // A, B, out (zeros when out is absent)
    int32_t flags;  // bit 0 out given, bit 1 alpha == 1, bit 2 beta == 0 or no out
    int32_t algo;   // 0 "auto", 1 "cublas"
};
static_assert(sizeof(Key) == 152, "Key is compared as bytes: no hidden padding");

constexpr size_t kMaxEntries = 256;
std::vector<Key> g_keys;  // most recently remembered last
PyTypeObject* g_tensor_type = nullptr;
PyObject* g_auto = nullptr;    // "auto"
PyObject* g_cublas = nullptr;  // "cublas"

// The record of one tensor and the address of its first element; false for anything
// the key cannot describe (then the Python path decides).
bool read_rec(PyObject* o, Rec& r, uint64_t& ptr) {
    if (Py_TYPE(o) != g_tensor_type) return false;
    const at::Tensor& t = THPVariable_Unpack(o);
    const c10::TensorImpl* ti = t.unsafeGetTensorImpl();
    if (ti->dim() != 2 || ti->layout() != c10::kStrided || ti->requires_grad()) return false;
    const c10::StorageImpl* si = ti->unsafe_storage().unsafeGetStorageImpl();
    if (si == nullptr) return false;
    const auto sz = ti->sizes();
    const auto st = ti->strides();
    r.size[0] = sz[0];
    r.size[1] = sz[1];
    r.stride[0] = st[0];
    r.stride[1] = st[1];
    const caffe2::TypeMeta dt = ti->dtype();
    r.dtype = (int32_t)dt.toScalarType();
    const c10::Device dev = ti->device();
    r.devtype = (int32_t)dev.type();
    r.devindex = (int32_t)dev.index();
    r.itemsize = (int32_t)dt.itemsize();
    ptr = (uint64_t)(uintptr_t)si->data() + (uint64_t)(ti->storage_offset() * (int64_t)dt.itemsize());
    return true;
}

// [lo, hi): the bytes a non-empty tensor of this record at `ptr` spans.
void extent(const Rec& r, uint64_t ptr, uint64_t& lo, uint64_t& hi) {
    int64_t l = 0, h = 0;
    for (int d = 0; d < 2; ++d) {
        const int64_t step = (r.size[d] - 1) * r.stride[d] * r.itemsize;
        if (step < 0) l += step; else h += step;
    }
    lo = ptr + (uint64_t)l;
    hi = ptr + (uint64_t)h + (uint64_t)r.itemsize;
}

bool meets(const Rec& a, uint64_t pa, const Rec& b, uint64_t pb) {
    uint64_t alo, ahi, blo, bhi;
    extent(a, pa, alo, ahi);
    extent(b, pb, blo, bhi);
    return alo < bhi && blo < ahi;
}

// A Python float or int (not bool) as a double; false for anything else.
bool as_real(PyObject* o, double& v) {
    if (PyFloat_CheckExact(o)) {
        v = PyFloat_AS_DOUBLE(o);
        return true;
    }
    if (PyLong_CheckExact(o)) {
        v = PyLong_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return false;
        }
        return true;
    }
    return false;
}

int algo_code(PyObject* a) {
    if (a == g_auto) return 0;
    if (a == g_cublas) return 1;
    if (!PyUnicode_Check(a)) return -1;
    if (PyUnicode_CompareWithASCIIString(a, "auto") == 0) return 0;
    if (PyUnicode_CompareWithASCIIString(a, "cublas") == 0) return 1;
    return -1;
}

// The key of a call (and the tensors' addresses); false where none can be made.
bool make_key(PyObject* const* args, Key& k, uint64_t* ptr, double& alpha, double& beta) {
    std::memset(&k, 0, sizeof(Key));
    PyObject* out = args[2];
    const bool has_out = out != Py_None;
    if (!as_real(args[3], alpha) || !as_real(args[4], beta)) return false;
    const int algo = algo_code(args[5]);
    if (algo < 0) return false;
    if (!read_rec(args[0], k.r[0], ptr[0]) || !read_rec(args[1], k.r[1], ptr[1])) return false;
    if (has_out && !read_rec(out, k.r[2], ptr[2])) return false;
    k.flags = (has_out ? 1 : 0) | (alpha == 1.0 ? 2 : 0) | ((!has_out || beta == 0.0) ? 4 : 0);
    k.algo = algo;
    return true;
}

bool known(const Key& k) {
    for (size_t i = g_keys.size(); i-- > 0;)
        if (std::memcmp(&g_keys[i], &k, sizeof(Key)) == 0) return true;
    return false;
}

// call(A, B, out, alpha, beta, algorithm) -> the result (out itself when given), or
// None where the call is not one this path remembers (or an overlap must be judged).
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "call(A, B, out, alpha, beta, algorithm)");
        return nullptr;
    }
    Key k;
    uint64_t ptr[3] = {0, 0, 0};
    double alpha = 1.0, beta = 0.0;
    try {
        if (!make_key(args, k, ptr, alpha, beta) || !known(k)) Py_RETURN_NONE;
        const bool has_out = (k.flags & 1) != 0;
        if (has_out && (meets(k.r[2], ptr[2], k.r[0], ptr[0]) || meets(k.r[2], ptr[2], k.r[1], ptr[1])))
            Py_RETURN_NONE;  // the Python path says which operand and refuses
        const at::Tensor& A = THPVariable_Unpack(args[0]);
        const at::Tensor& B = THPVariable_Unpack(args[1]);
        const bool plain = (k.flags & 6) == 6;
        // Operands that need no gradient skip the autograd and view layers of the
        // dispatcher (an out= result's version counter is bumped here instead).
        const bool below = !A.requires_grad() && !B.requires_grad();
        if (has_out) {
            at::Tensor C = THPVariable_Unpack(args[2]);
            const bool skip = below && !C.requires_grad();
            {
                PyThreadState* save = PyEval_SaveThread();  // as torch's own bindings do
                try {
                    if (skip) {
                        at::AutoDispatchBelowADInplaceOrView guard;
                        if (plain) at::mm_out(C, A, B);
                        else C.addmm_(A, B, beta, alpha);
                    } else if (plain) {
                        at::mm_out(C, A, B);
                    } else {
                        C.addmm_(A, B, beta, alpha);
                    }
                } catch (...) {
                    PyEval_RestoreThread(save);
                    throw;
                }
                PyEval_RestoreThread(save);
            }
            if (skip) C.unsafeGetTensorImpl()->bump_version();
            Py_INCREF(args[2]);
            return args[2];
        }
        at::Tensor C;
        {
            PyThreadState* save = PyEval_SaveThread();
            try {
                c10::optional<at::AutoDispatchBelowADInplaceOrView> guard;
                if (below) guard.emplace();
                if (plain) {
                    C = at::mm(A, B);
                } else {
                    C = at::empty({k.r[0].size[0], k.r[1].size[1]}, A.options());
                    C.addmm_(A, B, 0.0, alpha);
                }
            } catch (...) {
                PyEval_RestoreThread(save);
                throw;
            }
            PyEval_RestoreThread(save);
        }
        return THPVariable_Wrap(std::move(C));
    } catch (...) {  // torch refused: the Python path computes or words the error
        PyErr_Clear();
        Py_RETURN_NONE;
    }
}

// remember(A, B, out, alpha, beta, algorithm) -> bool: later calls with this key
// take torch's mm / addmm_ here.
PyObject* remember(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "remember(A, B, out, alpha, beta, algorithm)");
        return nullptr;
    }
    Key k;
    uint64_t ptr[3];
    double alpha, beta;
    bool ok = false;
    try {
        ok = make_key(args, k, ptr, alpha, beta);
    } catch (...) {
        ok = false;
    }
    if (!ok) Py_RETURN_FALSE;
    if (!known(k)) {
        if (g_keys.size() >= kMaxEntries) g_keys.erase(g_keys.begin());
        g_keys.push_back(k);
    }
    Py_RETURN_TRUE;
}

PyObject* clear(PyObject*, PyObject*) {
    g_keys.clear();
    Py_RETURN_NONE;
}

PyObject* size(PyObject*, PyObject*) { return PyLong_FromSize_t(g_keys.size()); }

PyMethodDef kMethods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
     "call(A, B, out, alpha, beta, algorithm) -> result, or None (not remembered here)"},
    {"remember", (PyCFunction)(void (*)(void))remember, METH_FASTCALL,
     "remember(A, B, out, alpha, beta, algorithm) -> bool"},
    {"clear", clear, METH_NOARGS, "forget every key"},
    {"size", size, METH_NOARGS, "keys remembered"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "tsm_mm_fastpath",
                       "matmul fast path for torch tensors (tsm_core/tsm2/fastpath.cpp)", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_tsm_mm_fastpath() {
    PyObject* m = PyModule_Create(&kModule);
    if (m == nullptr) return nullptr;
    g_tensor_type = reinterpret_cast<PyTypeObject*>(THPVariableClass);  // torch is imported
    g_auto = PyUnicode_InternFromString("auto");
    g_cublas = PyUnicode_InternFromString("cublas");
    PyModule_AddIntConstant(m, "MAX_ENTRIES", (long)kMaxEntries);
    return m;
}
