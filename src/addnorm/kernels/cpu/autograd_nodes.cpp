// The eager fast path's autograd nodes in C++: Add & Norm, norm-then-add and the parallel residual.
//
// At 64 x 768 (one decode step) the kernels take a few microseconds and a Python torch.autograd.Function
// around them costs more than the whole of eager PyTorch's C++ nodes. These nodes call the same C kernels
// (addnorm_cpu.c, through the function pointers that init() is given) with the same arguments as the
// Python nodes in addnorm.ops (EagerAddNorm, EagerNormAdd, EagerParallelAddNorm), so their results are the
// same bits. Every backward that is not the plain case -- create_graph=True, a forward-AD level, a torch
// dispatch mode, an incoming gradient that is a subclass, batched or otherwise wrapped, only the residual
// output used -- is handed to the Python node's own backward (the `fallback` given to init()), so every
// rule those follow holds here too.
//
// Built against torch's C++ ABI by `python -m addnorm.kernels.cpu.build_nodes` (make setup does it); where
// it is not built or does not load, the Python nodes run instead (addnorm.kernels.cpu.nodes says why).

#include <torch/extension.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Exceptions.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <cmath>
#include <new>
#include <typeinfo>

namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

typedef int (*fwd_t)(int, int, int, int, int, int64_t, int64_t, const void *, int64_t, const void *, int64_t,
                     const void *, const void *, int, float, float, int, void *, int64_t, void *, int64_t, float *,
                     float *, int);
typedef int (*bwd_t)(int, int, int, int, int64_t, int64_t, const void *, int64_t, const void *, int64_t,
                     const float *, const float *, const void *, int, float, const void *, int64_t, void *, int64_t,
                     void *, int64_t, void *, void *, int);
typedef int (*ffwd_t)(int, int, int, int, int, int, int, int, int, int, int64_t, int64_t, const void *, int64_t,
                      const void *, int64_t, const void *, int64_t, const void *, int64_t, const void *, const void *,
                      const void *, const void *, int, float, float, void *, int64_t, void *, int64_t, void *,
                      int64_t, float *, float *, int);
typedef int (*fbwd_t)(int, int, int, int, int, int, int64_t, int64_t, const void *, int64_t, const float *,
                      const float *, const void *, int64_t, const void *, int64_t, const void *, const void *, int,
                      float, const void *, int64_t, void *, int64_t, void *, void *, void *, void *, int);

typedef int (*pwb_t)(int, int, int, int, int64_t, int64_t, const void *, const void *, int64_t, const void *,
                     int64_t, const void *, int, float, float, void *, void *, void *, double *, int);
typedef int (*pwf_t)(int, int, int, int, int, int64_t, int64_t, const void *, int64_t, const void *, int64_t,
                     const void *, const void *, int, float, float, void *, void *, int);

// addnorm_mhc (mhc_rows.h): mHC's pre step and the write before it
typedef int (*mhc_t)(int, int, int, int64_t, int64_t, int, int, int, int, const void *, const float *, const float *,
                     float, float, float, const float *, const int32_t *, float, float, float, int, float, float, int,
                     void *, float *, float *, float *, float *, float *, float *, const void *, const float *,
                     const float *, const float *, const float *, const float *, const float *, void *, float *,
                     float *, float *, const void *, const float *, const float *, int, void *, const void *,
                     const void *, void *, void *, float *, float *, int);

// addnorm_stream (stream_rows.h): the widened stream's read and write
typedef int (*stream_t)(int, int, int, int64_t, int64_t, const void *, const void *, const void *, const void *, void *,
                        void *, const float *, const float *, const float *, float *, const float *, float *, float *,
                        float *, int);
stream_t k_stream = nullptr;

// addnorm_hyper (hyper_rows.h): Qwen4-exp's gated read and the write before it
typedef int (*hyper_t)(int, int, int, int64_t, int64_t, int, const void *, const void *, const void *, const float *,
                       float, float, const float *, void *, void *, const void *, const void *, void *, void *,
                       float *, float *, int);

fwd_t k_forward = nullptr;
mhc_t k_mhc = nullptr;
hyper_t k_hyper = nullptr;
pwf_t k_pointwise_forward = nullptr;
pwb_t k_pointwise_backward = nullptr;
bwd_t k_backward = nullptr;
ffwd_t k_fused_forward = nullptr;
fbwd_t k_fused_backward = nullptr;
py::object *fallback = nullptr;  // never freed: it lives as long as the process

enum Op {
    ADD_NORM = 0, NORM_ADD = 1, PARALLEL = 2, POINTWISE = 3, MHC_PRE = 4, STREAM_WRITE = 5, STREAM_READ = 6,
    MHC_WRITE_PRE = 7
};

// the kernels' dtype codes (addnorm.kernels.cpu.library.DTYPE_CODES)
int code(at::ScalarType st) {
    switch (st) {
        case at::kFloat: return 0;
        case at::kBFloat16: return 1;
        case at::kHalf: return 2;
        default: TORCH_CHECK(false, "addnorm: the CPU kernels take float32, bfloat16 and float16, got ", st);
    }
}

int code(const Tensor &t) { return code(t.scalar_type()); }

at::ScalarType param_type(int pcode) {
    return pcode == 0 ? at::kFloat : pcode == 1 ? at::kBFloat16 : at::kHalf;
}

// A kernel's return code as the Python host calls raise it (ops._check_rc): ValueError for a freed storage,
// MemoryError for scratch memory, raised as those Python exceptions both in forward (called from Python) and in
// backward (called by the autograd engine, which passes a Python error on as it is).
void check_rc(int rc, const char *what) {
    if (rc == 0) return;
    py::gil_scoped_acquire gil;
    if (rc == -1)
        PyErr_Format(PyExc_MemoryError, "addnorm CPU %s kernel could not allocate its scratch rows", what);
    else
        PyErr_Format(PyExc_ValueError, "addnorm CPU %s: a tensor with elements has no storage (was its storage freed, "
                     "e.g. by untyped_storage().resize_(0)?)", what);
    throw python_error();
}

// The kernel runs without the GIL where its caller holds it (the forward, called from Python), so other Python
// threads run meanwhile, as they do beside torch's own ops; the backward runs on autograd's side, without it.
struct NoGil {
    PyThreadState *state = nullptr;
    NoGil() {
        if (PyGILState_Check()) state = PyEval_SaveThread();
    }
    ~NoGil() {
        if (state) PyEval_RestoreThread(state);
    }
};

// The data of an optional tensor (null: absent). A tensor with elements whose storage was freed has a null
// pointer, which the kernels would take for an absent residual or parameter: refused (ops._ptr).
const void *ptr(const Tensor &t) {
    if (!t.defined()) return nullptr;
    const void *p = t.data_ptr();
    if (p == nullptr && t.numel() != 0) check_rc(-2, "kernels");
    return p;
}
void *mptr(const Tensor &t) { return t.defined() ? t.data_ptr() : nullptr; }

// The parameters as the kernels read them (ops.params / fused._params): as they are where all present ones are
// contiguous and share one kernel dtype, else float32 copies; the code of the dtype read.
int read_params(std::vector<Tensor> &ps, int64_t D) {
    int pcode = -1;
    bool as_is = true;
    for (auto &p : ps) {
        if (!p.defined()) continue;
        auto st = p.scalar_type();
        int c = st == at::kFloat ? 0 : st == at::kBFloat16 ? 1 : st == at::kHalf ? 2 : -2;
        if (c < 0 || !p.is_contiguous() || (pcode >= 0 && c != pcode)) as_is = false;
        if (pcode < 0) pcode = c;
    }
    if (pcode == -1) return 0;  // none present
    if (as_is) return pcode;
    for (auto &p : ps)
        if (p.defined()) p = p.detach().reshape({D}).to(at::kFloat).contiguous();
    return 0;
}

// A parameter gradient in the parameter's own shape and dtype (ops.like / ops.spec).
Tensor like(const Tensor &g, const Tensor &param, const Tensor &as_read) {
    if (!g.defined()) return g;
    if (as_read.is_same(param) && param.dim() == 1) return g;
    return g.view(param.sizes()).to(param.scalar_type());
}

// Whether an incoming gradient can go to the kernels: a plain dense CPU tensor (no subclass, no functorch or
// functionalization wrapper) of the expected dtype. Undefined ones are absent gradients.
bool plain_grad(const Tensor &g, at::ScalarType st) {
    if (!g.defined()) return true;
    const c10::TensorImpl *impl = g.unsafeGetTensorImpl();
    // a Python subclass (with __torch_function__ only, it has no Python dispatch key) keeps its type through the
    // Python node's backward: its Python object's type says what it is
    PyObject *obj = impl->pyobj_slot()->load_pyobj();
    if (obj != nullptr && Py_TYPE(obj) != (PyTypeObject *)THPVariableClass) return false;
    return typeid(*impl) == typeid(c10::TensorImpl) && !g.key_set().has(c10::DispatchKey::Python) &&
           g.device().is_cpu() && g.layout() == at::kStrided && g.scalar_type() == st && !g.is_neg() &&
           !g.is_conj();
}

// What the Python nodes' `differentiable_backward()` and their dispatch-mode checks ask, in C++.
bool plain_backward() {
    return !at::GradMode::is_enabled() && !torch::autograd::ForwardADLevel::try_get_by_idx(0) &&
           c10::impl::TorchDispatchModeTLS::stack_len() == 0;
}

// The plain backward (plain_backward) with incoming gradients the kernels can read (plain_grad): the one case the
// C++ nodes compute themselves; every other goes to the Python node's backward.
bool kernel_backward(at::ScalarType st, std::initializer_list<Tensor> grads) {
    if (!plain_backward()) return false;
    for (const Tensor &g : grads)
        if (!plain_grad(g, st)) return false;
    return true;
}

Tensor rows(const Tensor &g) { return g.defined() && !g.is_contiguous() ? g.contiguous() : g; }

// The saved tensors, unpacked once, contiguous (an unpack hook may hand back another layout).
variable_list saved_rows(AutogradContext *ctx) {
    variable_list saved = ctx->get_saved_variables();
    for (auto &t : saved) t = rows(t);
    return saved;
}

// Whether input `pos` (its place in the forward's arguments) needs a gradient. Autograd numbers only the
// tensors that were given (an absent std::optional has no edge): forward records which were, as a bit mask.
bool need(AutogradContext *ctx, int pos) {
    int64_t given = ctx->saved_data["given"].toInt();
    if (!((given >> pos) & 1)) return false;
    size_t edge = 0;
    for (int i = 0; i < pos; i++) edge += (given >> i) & 1;
    return ctx->needs_input_grad(edge);
}

int64_t given(std::initializer_list<bool> present) {
    int64_t m = 0, i = 0;
    for (bool p : present) m |= (int64_t)p << i++;
    return m;
}

std::vector<bool> needs(AutogradContext *ctx, size_t n) {
    std::vector<bool> v(n);
    for (size_t i = 0; i < n; i++) v[i] = need(ctx, (int)i);
    return v;
}

// The Python node's backward, for every case but the plain one.
// `saved`: the saved tensors as the caller already unpacked them -- unpacking twice would run saved-tensor hooks
// twice, which non-reentrant checkpointing refuses.
variable_list python_backward(int op, AutogradContext *ctx, const variable_list &saved_ts, const variable_list &grads,
                              size_t n_inputs) {
    py::gil_scoped_acquire gil;
    py::list saved, gs, need;
    for (auto &t : saved_ts) saved.append(t.defined() ? py::cast(t) : py::none());
    for (auto &t : grads) gs.append(t.defined() ? py::cast(t) : py::none());
    for (auto b : needs(ctx, n_inputs)) need.append(py::bool_(b));
    py::dict meta;
    for (auto &kv : ctx->saved_data) {
        const auto &v = kv.second;
        if (v.isInt()) meta[py::str(kv.first)] = py::int_(v.toInt());
        else if (v.isDouble()) meta[py::str(kv.first)] = py::float_(v.toDouble());
        else if (v.isBool()) meta[py::str(kv.first)] = py::bool_(v.toBool());
        else if (v.isTensor()) meta[py::str(kv.first)] = v.toTensor().defined() ? py::cast(v.toTensor()) : py::none();
    }
    py::object out = (*fallback)(op, saved, gs, need, meta);
    variable_list result;
    for (auto item : out) result.push_back(item.is_none() ? Tensor() : item.cast<Tensor>());
    return result;
}

int nthreads() { return at::get_num_threads(); }

// addnorm's output pool (kernels.cpu.output_pool, through native_nodes._pool_empty(shape, the kernels' dtype code)):
// recycled memory, already faulted in, for outputs of pool_min_bytes or more (every one in a kernel dtype). Under
// glibc's defaults the memory of a training step's large tensors goes back to the system and comes again page by
// page: at a block's 512 tokens x 4 x 768 the widened stream's 6 MB outputs from fresh memory cost the mHC step about
// 2 % of pre's (page faults, the kernel zeroing them). Used by the widened stream's nodes, which take every size.
py::object *pool_empty = nullptr;
int64_t pool_min_bytes = INT64_MAX;

Tensor out_empty(at::IntArrayRef sizes, const at::TensorOptions &opts) {
    const int64_t nbytes = c10::multiply_integers(sizes) * (int64_t)c10::elementSize(opts.dtype().toScalarType());
    if (pool_empty != nullptr && !pool_empty->is_none() && nbytes >= pool_min_bytes && opts.device().is_cpu()) {
        const int c = code(opts.dtype().toScalarType());
        py::gil_scoped_acquire gil;
        py::object t = (*pool_empty)(py::cast(std::vector<int64_t>(sizes.begin(), sizes.end())), c);
        if (!t.is_none()) return t.cast<Tensor>();
    }
    return at::empty(sizes, opts);
}

Tensor out_like(const Tensor &t) { return out_empty(t.sizes(), t.options()); }

using OptT = std::optional<Tensor>;
Tensor opt(const OptT &t) { return t.has_value() ? *t : Tensor(); }

// ---------------------------------------------------------------- Add & Norm: (y, s or None) = norm(x + residual)
struct AddNormOut {
    Tensor out, y2, s, stats;  // y2: the parallel residual's second norm
    std::vector<Tensor> read;  // the parameters as the kernel read them
    int pcode;
};

// One kernel call (ops.forward with contiguous tensors); statistics only where a backward will need them.
AddNormOut add_norm_forward(const Tensor &x, const Tensor &residual, const Tensor &weight, const Tensor &bias,
                            int64_t kind, double eps, double weight_offset, bool cbw, bool want_stats) {
    int64_t D = x.size(-1), N = x.numel() / D;
    AddNormOut r;
    if (want_stats) r.stats = torch::empty({kind == 0 ? 2 : 1, N}, x.options().dtype(at::kFloat));
    r.out = torch::empty_like(x, at::MemoryFormat::Contiguous);
    if (residual.defined()) r.s = torch::empty_like(x, at::MemoryFormat::Contiguous);
    r.read = {weight, bias};
    r.pcode = read_params(r.read, D);
    int c = code(x);
    float *st = want_stats ? r.stats.data_ptr<float>() : nullptr;
    int rc;
    {
        NoGil released;
        rc = k_forward((int)kind, c, c, c, c, N, D, ptr(x), D, ptr(residual), D, ptr(r.read[0]),
                       ptr(r.read[1]), r.pcode, (float)weight_offset, (float)eps, (int)cbw, r.out.data_ptr(), D,
                       mptr(r.s), D, kind == 0 ? st : nullptr, kind == 0 && st ? st + N : st, nthreads());
    }
    check_rc(rc, "forward");
    return r;
}

struct AddNormNode : public torch::autograd::Function<AddNormNode> {
    // absent tensors are std::optional: an undefined Tensor argument has no device for autograd to ask about
    static variable_list forward(AutogradContext *ctx, Tensor x, OptT residual_, OptT weight_, OptT bias_,
                                 int64_t kind, double eps, double weight_offset, bool cbw) {
        Tensor residual = opt(residual_), weight = opt(weight_), bias = opt(bias_);
        ctx->set_materialize_grads(false);
        AddNormOut r = add_norm_forward(x, residual, weight, bias, kind, eps, weight_offset, cbw, true);
        const Tensor &out = r.out, &s = r.s, &stats = r.stats;
        const int pcode = r.pcode;
        const std::vector<Tensor> &ps = r.read;
        ctx->save_for_backward({s.defined() ? s : x, stats, weight, bias});
        ctx->saved_data["kind"] = kind;
        ctx->saved_data["eps"] = eps;
        ctx->saved_data["off"] = weight_offset;
        ctx->saved_data["cbw"] = cbw;
        ctx->saved_data["has_res"] = residual.defined();
        ctx->saved_data["given"] = given({true, residual.defined(), weight.defined(), bias.defined()});
        ctx->saved_data["pcode"] = (int64_t)pcode;
        ctx->saved_data["w_read"] = ps[0];
        ctx->saved_data["b_read"] = ps[1];
        if (!s.defined()) return {out};  // an undefined output has no device: a plain norm has one output
        return {out, s};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        auto saved = saved_rows(ctx);
        const Tensor &sv = saved[0];
        Tensor dy = grads[0], dres = grads.size() > 1 ? grads[1] : Tensor();
        if (!dy.defined() && !dres.defined()) return variable_list(8);
        if (!dy.defined() || !kernel_backward(sv.scalar_type(), {dy, dres}))
            return python_backward(ADD_NORM, ctx, saved, grads, 8);
        const Tensor &stats = saved[1], &w = saved[2], &b = saved[3];
        int kind = (int)ctx->saved_data["kind"].toInt();
        int pcode = (int)ctx->saved_data["pcode"].toInt();
        Tensor w_read = ctx->saved_data["w_read"].toTensor(), b_read = ctx->saved_data["b_read"].toTensor();
        bool want_w = w.defined() && need(ctx, 2), want_b = b.defined() && need(ctx, 3);
        dy = rows(dy);
        dres = rows(dres);
        int64_t D = sv.size(-1), N = sv.numel() / D;
        auto ds = torch::empty_like(sv, at::MemoryFormat::Contiguous);
        auto popt = sv.options().dtype(param_type(pcode));
        Tensor dw = want_w ? torch::empty({D}, popt) : Tensor(), db = want_b ? torch::empty({D}, popt) : Tensor();
        const float *st = static_cast<const float *>(ptr(stats));
        int c = code(sv);
        check_rc(k_backward(kind, code(dy), c, c, N, D, ptr(dy), D, ptr(sv), D, kind == 0 ? st : nullptr,
                            kind == 0 ? st + N : st, ptr(w_read), pcode, (float)ctx->saved_data["off"].toDouble(),
                            ptr(dres), D, ds.data_ptr(), D, nullptr, 0, mptr(dw), mptr(db), nthreads()),
                 "backward");
        bool has_res = ctx->saved_data["has_res"].toBool();
        return {ds, has_res ? ds : Tensor(), like(dw, w, w_read), like(db, b, b_read), Tensor(), Tensor(), Tensor(),
                Tensor()};
    }
};

// ---------------------------------------------------------------- norm-then-add: residual + norm(x)
AddNormOut norm_add_forward(const Tensor &x, const Tensor &residual, const Tensor &weight, const Tensor &bias,
                            int64_t kind, double eps, double weight_offset, bool cbw, bool want_stats) {
    int64_t D = x.size(-1), N = x.numel() / D;
    AddNormOut r;
    if (want_stats) r.stats = torch::empty({kind == 0 ? 2 : 1, N}, x.options().dtype(at::kFloat));
    r.out = torch::empty_like(x, at::MemoryFormat::Contiguous);
    r.read = {weight, bias};
    r.pcode = read_params(r.read, D);
    int c = code(x);
    float *st = want_stats ? r.stats.data_ptr<float>() : nullptr;
    int rc;
    {
        NoGil released;
        rc = k_fused_forward((int)kind, (int)cbw, c, 0, 0, c, c, c, c, c, N, D, ptr(x), D, nullptr, 0, nullptr,
                             0, ptr(residual), D, ptr(r.read[0]), ptr(r.read[1]), nullptr, nullptr, r.pcode,
                             (float)weight_offset, (float)eps, r.out.data_ptr(), D, nullptr, 0, nullptr, 0,
                             kind == 0 ? st : nullptr, kind == 0 && st ? st + N : st, nthreads());
    }
    check_rc(rc, "fused forward");
    return r;
}

struct NormAddNode : public torch::autograd::Function<NormAddNode> {
    static Tensor forward(AutogradContext *ctx, Tensor x, Tensor residual, OptT weight_, OptT bias_, int64_t kind,
                          double eps, double weight_offset, bool cbw) {
        Tensor weight = opt(weight_), bias = opt(bias_);
        ctx->set_materialize_grads(false);
        AddNormOut r = norm_add_forward(x, residual, weight, bias, kind, eps, weight_offset, cbw, true);
        const Tensor &out = r.out, &stats = r.stats;
        const int pcode = r.pcode;
        const std::vector<Tensor> &ps = r.read;
        ctx->save_for_backward({x, stats, weight, bias});
        ctx->saved_data["given"] = given({true, true, weight.defined(), bias.defined()});
        ctx->saved_data["kind"] = kind;
        ctx->saved_data["eps"] = eps;
        ctx->saved_data["off"] = weight_offset;
        ctx->saved_data["cbw"] = cbw;
        ctx->saved_data["pcode"] = (int64_t)pcode;
        ctx->saved_data["w_read"] = ps[0];
        ctx->saved_data["b_read"] = ps[1];
        return out;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        auto saved = saved_rows(ctx);
        const Tensor &x = saved[0];
        Tensor dout = grads[0];
        if (!dout.defined()) return variable_list(8);
        if (!kernel_backward(x.scalar_type(), {dout})) return python_backward(NORM_ADD, ctx, saved, grads, 8);
        const Tensor &stats = saved[1], &w = saved[2], &b = saved[3];
        int kind = (int)ctx->saved_data["kind"].toInt();
        int pcode = (int)ctx->saved_data["pcode"].toInt();
        Tensor w_read = ctx->saved_data["w_read"].toTensor(), b_read = ctx->saved_data["b_read"].toTensor();
        bool want_w = w.defined() && need(ctx, 2), want_b = b.defined() && need(ctx, 3);
        Tensor dy = rows(dout);
        int64_t D = x.size(-1), N = x.numel() / D;
        auto dx = torch::empty_like(x, at::MemoryFormat::Contiguous);
        auto popt = x.options().dtype(param_type(pcode));
        Tensor dw = want_w ? torch::empty({D}, popt) : Tensor(), db = want_b ? torch::empty({D}, popt) : Tensor();
        const float *st = static_cast<const float *>(ptr(stats));
        int c = code(x);
        check_rc(k_backward(kind, code(dy), c, c, N, D, ptr(dy), D, ptr(x), D, kind == 0 ? st : nullptr,
                            kind == 0 ? st + N : st, ptr(w_read), pcode, (float)ctx->saved_data["off"].toDouble(),
                            nullptr, 0, dx.data_ptr(), D, nullptr, 0, mptr(dw), mptr(db), nthreads()),
                 "backward");
        return {dx, need(ctx, 1) ? dout : Tensor(), like(dw, w, w_read), like(db, b, b_read), Tensor(),
                Tensor(), Tensor(), Tensor()};
    }
};

// ---------------------------------------------------------------- the parallel residual: s = residual + x + x2
AddNormOut parallel_forward(const Tensor &x, const Tensor &x2, const Tensor &residual, const Tensor &weight,
                            const Tensor &bias, const Tensor &weight2, const Tensor &bias2, int64_t kind, double eps,
                            double weight_offset, bool cbw, bool branches_first, bool want_stats) {
    int64_t D = x.size(-1), N = x.numel() / D;
    bool two = weight2.defined() || bias2.defined();
    AddNormOut r;
    if (want_stats) r.stats = torch::empty({kind == 0 ? 2 : 1, N}, x.options().dtype(at::kFloat));
    r.out = torch::empty_like(x, at::MemoryFormat::Contiguous);
    if (two) r.y2 = torch::empty_like(x, at::MemoryFormat::Contiguous);
    r.s = torch::empty_like(x, at::MemoryFormat::Contiguous);
    r.read = {weight, bias, two ? weight2 : Tensor(), two ? bias2 : Tensor()};
    r.pcode = read_params(r.read, D);
    // the kernel forms X + round(A + M): the eager order mapped onto it (fused.parallel_contiguous)
    Tensor X, A, M;
    if (!x2.defined()) { X = residual; A = x; }
    else if (branches_first) { X = residual; A = x; M = x2; }
    else { X = x2; A = residual; M = x; }
    int c = code(x);
    float *st = want_stats ? r.stats.data_ptr<float>() : nullptr;
    int rc;
    {
        NoGil released;
        rc = k_fused_forward((int)kind, (int)cbw, c, c, c, c, c, 0, c, c, N, D, ptr(X), D, ptr(A), D,
                             ptr(M), D, nullptr, 0, ptr(r.read[0]), ptr(r.read[1]), ptr(r.read[2]), ptr(r.read[3]),
                             r.pcode, (float)weight_offset, (float)eps, r.out.data_ptr(), D, mptr(r.y2), D,
                             r.s.data_ptr(), D, kind == 0 ? st : nullptr, kind == 0 && st ? st + N : st, nthreads());
    }
    check_rc(rc, "fused forward");
    return r;
}

struct ParallelNode : public torch::autograd::Function<ParallelNode> {
    static variable_list forward(AutogradContext *ctx, Tensor x, OptT x2_, Tensor residual, OptT weight_,
                                 OptT bias_, OptT weight2_, OptT bias2_, int64_t kind, double eps,
                                 double weight_offset, bool cbw, bool branches_first) {
        Tensor x2 = opt(x2_), weight = opt(weight_), bias = opt(bias_), weight2 = opt(weight2_), bias2 = opt(bias2_);
        ctx->set_materialize_grads(false);
        bool two = weight2.defined() || bias2.defined();
        AddNormOut r = parallel_forward(x, x2, residual, weight, bias, weight2, bias2, kind, eps, weight_offset, cbw,
                                        branches_first, true);
        Tensor y = r.out, y2 = r.y2, s = r.s, stats = r.stats;
        const int pcode = r.pcode;
        const std::vector<Tensor> &ps = r.read;
        if (!two) {
            y2 = x.new_empty({0});
            ctx->mark_non_differentiable({y2});
        }
        ctx->save_for_backward({s, stats, weight, bias, weight2, bias2});
        ctx->saved_data["kind"] = kind;
        ctx->saved_data["eps"] = eps;
        ctx->saved_data["off"] = weight_offset;
        ctx->saved_data["cbw"] = cbw;
        ctx->saved_data["two"] = two;
        ctx->saved_data["has_x2"] = x2.defined();
        ctx->saved_data["given"] = given({true, x2.defined(), true, weight.defined(), bias.defined(),
                                          weight2.defined(), bias2.defined()});
        ctx->saved_data["pcode"] = (int64_t)pcode;
        for (int k = 0; k < 4; k++) ctx->saved_data["read" + std::to_string(k)] = ps[k];
        return {y, y2, s};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        auto saved = saved_rows(ctx);
        const Tensor &s = saved[0];
        bool two = ctx->saved_data["two"].toBool();
        Tensor dy = grads[0], dy2 = two ? grads[1] : Tensor(), dres = grads[2];
        if (!dy.defined() && !dy2.defined() && !dres.defined()) return variable_list(12);
        if ((!dy.defined() && !dy2.defined()) || !kernel_backward(s.scalar_type(), {dy, dy2, dres}))
            return python_backward(PARALLEL, ctx, saved, grads, 12);
        const Tensor &stats = saved[1];
        const Tensor params[4] = {saved[2], saved[3], saved[4], saved[5]};
        Tensor read[4];
        for (int k = 0; k < 4; k++) read[k] = ctx->saved_data["read" + std::to_string(k)].toTensor();
        int kind = (int)ctx->saved_data["kind"].toInt();
        int pcode = (int)ctx->saved_data["pcode"].toInt();
        dy = rows(dy);
        dy2 = rows(dy2);
        dres = rows(dres);
        int64_t D = s.size(-1), N = s.numel() / D;
        auto popt = s.options().dtype(param_type(pcode));
        Tensor g[4];
        for (int k = 0; k < 4; k++) {
            bool has_dy = k < 2 ? dy.defined() : dy2.defined();
            if (params[k].defined() && need(ctx, 3 + k) && has_dy) g[k] = torch::empty({D}, popt);
        }
        auto ds = torch::empty_like(s, at::MemoryFormat::Contiguous);
        const float *st = static_cast<const float *>(ptr(stats));
        int c = code(s);
        check_rc(k_fused_backward(kind, c, dy.defined() ? code(dy) : 0, dy2.defined() ? code(dy2) : 0,
                                  dres.defined() ? code(dres) : 0, c, N, D, ptr(s), D,
                                  kind == 0 ? st : nullptr, kind == 0 ? st + N : st, ptr(dy), D, ptr(dy2), D,
                                  ptr(read[0]), ptr(read[2]), pcode, (float)ctx->saved_data["off"].toDouble(),
                                  ptr(dres), D, ds.data_ptr(), D, mptr(g[0]), mptr(g[1]), mptr(g[2]), mptr(g[3]),
                                  nthreads()),
                 "fused backward");
        variable_list out{need(ctx, 0) ? ds : Tensor(),
                          need(ctx, 1) && ctx->saved_data["has_x2"].toBool() ? ds : Tensor(),
                          need(ctx, 2) ? ds : Tensor()};
        for (int k = 0; k < 4; k++) {
            if (!g[k].defined())
                out.push_back(params[k].defined() && need(ctx, 3 + k) ? torch::zeros_like(params[k])
                                                                                   : Tensor());
            else
                out.push_back(like(g[k], params[k], read[k]));
        }
        for (int k = 0; k < 5; k++) out.push_back(Tensor());
        return out;
    }
};

py::tuple add_norm(const Tensor &x, const std::optional<Tensor> &residual, const std::optional<Tensor> &weight,
                   const std::optional<Tensor> &bias, int64_t kind, double eps, double weight_offset, bool cbw) {
    auto r = AddNormNode::apply(x, residual, weight, bias, kind, eps, weight_offset, cbw);
    return py::make_tuple(r[0], r.size() > 1 ? py::cast(r[1]) : py::none());
}

// Inference (no graph): the kernel call and nothing else, no statistics.
py::tuple add_norm_inference(const Tensor &x, const std::optional<Tensor> &residual, const std::optional<Tensor> &weight,
                             const std::optional<Tensor> &bias, int64_t kind, double eps, double weight_offset,
                             bool cbw) {
    AddNormOut r = add_norm_forward(x, opt(residual), opt(weight), opt(bias), kind, eps, weight_offset, cbw, false);
    return py::make_tuple(r.out, r.s.defined() ? py::cast(r.s) : py::none());
}

Tensor norm_add_inference(const Tensor &x, const Tensor &residual, const std::optional<Tensor> &weight,
                          const std::optional<Tensor> &bias, int64_t kind, double eps, double weight_offset, bool cbw) {
    return norm_add_forward(x, residual, opt(weight), opt(bias), kind, eps, weight_offset, cbw, false).out;
}

py::tuple parallel_inference(const Tensor &x, const std::optional<Tensor> &x2, const Tensor &residual,
                             const std::optional<Tensor> &weight, const std::optional<Tensor> &bias,
                             const std::optional<Tensor> &weight2, const std::optional<Tensor> &bias2, int64_t kind,
                             double eps, double weight_offset, bool cbw, bool branches_first) {
    AddNormOut r = parallel_forward(x, opt(x2), residual, opt(weight), opt(bias), opt(weight2), opt(bias2), kind, eps,
                                    weight_offset, cbw, branches_first, false);
    return py::make_tuple(r.out, r.y2.defined() ? py::cast(r.y2) : py::none(), r.s);
}

Tensor norm_add(const Tensor &x, const Tensor &residual, const std::optional<Tensor> &weight,
                const std::optional<Tensor> &bias, int64_t kind, double eps, double weight_offset, bool cbw) {
    return NormAddNode::apply(x, residual, weight, bias, kind, eps, weight_offset, cbw);
}

py::tuple parallel(const Tensor &x, const std::optional<Tensor> &x2, const Tensor &residual,
                   const std::optional<Tensor> &weight, const std::optional<Tensor> &bias,
                   const std::optional<Tensor> &weight2, const std::optional<Tensor> &bias2, int64_t kind, double eps,
                   double weight_offset, bool cbw, bool branches_first) {
    auto r = ParallelNode::apply(x, x2, residual, weight, bias, weight2, bias2, kind, eps,
                                 weight_offset, cbw, branches_first);
    bool two = weight2.has_value() || bias2.has_value();
    return py::make_tuple(r[0], two ? py::cast(r[1]) : py::none(), r[2]);
}

// ---------------------------------------------------------------- the eager fast path's checks and call, in one
// functional.core.fast_path_ok's tensor checks (the caller has asked the rest: no compiler, transform, dispatch mode or
// tracer, a kernel backend), then the node or the inference entry. Returns None where the fast path does not
// apply (the caller then takes its general path, which validates fully), or inside a forward-AD level (the Python
// node carries tangents). Written for speed: in Python these checks cost ~3 us, a quarter of a 64 x 768 call.
int64_t max_numel = 0;

bool plain_tensor(PyObject *o) { return Py_TYPE(o) == (PyTypeObject *)THPVariableClass; }

// a tensor with elements whose storage was freed (FSDP's resize_(0)) has no memory behind it, and a view of it at
// an offset a data pointer that is not null: declined, so that the general path names it (core.check_storage)
bool stored(const Tensor &t) { return t.numel() == 0 || (t.has_storage() && t.storage().nbytes() != 0); }


bool kernel_dtype(at::ScalarType st) { return st == at::kFloat || st == at::kBFloat16 || st == at::kHalf; }

bool fast_core(PyObject *xo, PyObject *ro, long long D, PyObject *wo, PyObject *bo, bool f64_params = true);

// x (and an optional second tensor of its shape and dtype) and 1-D parameters of D elements
bool fast_tensors(PyObject *xo, PyObject *ro, PyObject *Do, PyObject *wo, PyObject *bo, PyObject *epso,
                  PyObject *offo) {
    if (PyTuple_Check(Do) && PyTuple_GET_SIZE(Do) == 1) Do = PyTuple_GET_ITEM(Do, 0);  // (D,), torch.Size([D])
    else if (PyList_Check(Do) && PyList_GET_SIZE(Do) == 1) Do = PyList_GET_ITEM(Do, 0);  // [D]
    if (!plain_tensor(xo) || !PyLong_CheckExact(Do) || !PyFloat_CheckExact(epso)) return false;
    if (!(PyFloat_CheckExact(offo) || PyLong_CheckExact(offo))) return false;
    double eps = PyFloat_AS_DOUBLE(epso);
    double off = PyFloat_CheckExact(offo) ? PyFloat_AS_DOUBLE(offo) : PyLong_AsDouble(offo);
    if (PyErr_Occurred()) { PyErr_Clear(); return false; }
    if (!(eps >= 0.0 && eps < INFINITY) || !std::isfinite(off)) return false;
    int overflow = 0;
    long long D = PyLong_AsLongLongAndOverflow(Do, &overflow);
    if (overflow || D <= 0) return false;
    return fast_core(xo, ro, D, wo, bo);
}

// the tensors' part of the checks: x of kernel dtype, contiguous, rows of D; an optional second tensor like it;
// 1-D parameters of D elements (Tensor or Parameter); float64 ones only with f64_params (the norm forms read them as
// float32 copies; DyT / Derf compute with torch ops then, pointwise_schema's `applies`)
bool fast_core(PyObject *xo, PyObject *ro, long long D, PyObject *wo, PyObject *bo, bool f64_params) {
    if (D <= 0) return false;  // empty rows: the general path (N = numel / D)
    const Tensor &x = THPVariable_Unpack(xo);
    auto st = x.scalar_type();
    if (!kernel_dtype(st) || !x.is_cpu() || x.is_nested() || x.layout() != at::kStrided || !x.is_contiguous() ||
        x.dim() == 0 || x.size(-1) != D || x.is_neg() || x.numel() >= max_numel || !stored(x))
        return false;
    if (ro != Py_None) {
        if (!plain_tensor(ro)) return false;
        const Tensor &r = THPVariable_Unpack(ro);
        if (r.scalar_type() != st || !r.is_cpu() || r.layout() != at::kStrided || !r.is_contiguous() ||
            r.sizes() != x.sizes() || r.is_neg() || !stored(r))
            return false;
    }
    for (PyObject *po : {wo, bo}) {
        if (po == Py_None) continue;
        if (!THPVariable_CheckExact(po)) return false;  // Tensor or Parameter, no other subclass
        const Tensor &p = THPVariable_Unpack(po);
        auto pt = p.scalar_type();
        if (!(kernel_dtype(pt) || (f64_params && pt == at::kDouble)) || !p.is_cpu() || p.layout() != at::kStrided || p.dim() != 1 ||
            p.size(0) != D || p.is_neg() || !stored(p))
            return false;
    }
    return true;
}

Tensor unpack(PyObject *o) { return o == Py_None ? Tensor() : THPVariable_Unpack(o); }

// 1: the node, 0: inference, -1: not here (a forward-AD level: the Python node; an inference tensor where a
// gradient is wanted: autograd cannot save it, and Python's path copies it first, as functional.core.uninferred says)
int route(std::initializer_list<PyObject *> ts) {
    bool grad = false;
    if (at::GradMode::is_enabled())
        for (PyObject *o : ts)
            if (o != Py_None && THPVariable_Unpack(o).requires_grad()) { grad = true; break; }
    if (torch::autograd::ForwardADLevel::try_get_by_idx(0)) return -1;
    if (grad)
        for (PyObject *o : ts)
            if (o != Py_None && THPVariable_Unpack(o).is_inference()) return -1;
    return grad ? 1 : 0;
}

py::object fast_add_norm(py::handle x, py::handle residual, py::handle D, py::handle weight, py::handle bias,
                         py::handle eps, py::handle off, int64_t kind, bool cbw) {
    if (!fast_tensors(x.ptr(), residual.ptr(), D.ptr(), weight.ptr(), bias.ptr(), eps.ptr(), off.ptr()))
        return py::none();
    int how = route({x.ptr(), residual.ptr(), weight.ptr(), bias.ptr()});
    if (how < 0) return py::none();
    double e = PyFloat_AS_DOUBLE(eps.ptr()), o = py::cast<double>(off);
    Tensor xt = unpack(x.ptr()), rt = unpack(residual.ptr()), wt = unpack(weight.ptr()), bt = unpack(bias.ptr());
    if (how == 0) {
        AddNormOut r = add_norm_forward(xt, rt, wt, bt, kind, e, o, cbw, false);
        return py::make_tuple(r.out, r.s.defined() ? py::cast(r.s) : py::none());
    }
    auto r = AddNormNode::apply(xt, rt.defined() ? OptT(rt) : OptT(), wt.defined() ? OptT(wt) : OptT(),
                                bt.defined() ? OptT(bt) : OptT(), kind, e, o, cbw);
    return py::make_tuple(r[0], r.size() > 1 ? py::cast(r[1]) : py::none());
}

py::object fast_norm_add(py::handle x, py::handle residual, py::handle D, py::handle weight, py::handle bias,
                         py::handle eps, py::handle off, int64_t kind, bool cbw) {
    if (residual.is_none() ||
        !fast_tensors(x.ptr(), residual.ptr(), D.ptr(), weight.ptr(), bias.ptr(), eps.ptr(), off.ptr()))
        return py::none();
    int how = route({x.ptr(), residual.ptr(), weight.ptr(), bias.ptr()});
    if (how < 0) return py::none();
    double e = PyFloat_AS_DOUBLE(eps.ptr()), o = py::cast<double>(off);
    Tensor xt = unpack(x.ptr()), rt = unpack(residual.ptr()), wt = unpack(weight.ptr()), bt = unpack(bias.ptr());
    if (how == 0) return py::cast(norm_add_forward(xt, rt, wt, bt, kind, e, o, cbw, false).out);
    return py::cast(NormAddNode::apply(xt, rt, wt.defined() ? OptT(wt) : OptT(), bt.defined() ? OptT(bt) : OptT(),
                                       kind, e, o, cbw));
}

py::object fast_parallel(py::handle x, py::handle x2, py::handle residual, py::handle D, py::handle weight,
                         py::handle bias, py::handle weight2, py::handle bias2, py::handle eps, py::handle off,
                         int64_t kind, bool cbw, py::handle branches_first) {
    if (residual.is_none() || !PyBool_Check(branches_first.ptr()) ||
        !fast_tensors(x.ptr(), residual.ptr(), D.ptr(), weight.ptr(), bias.ptr(), eps.ptr(), off.ptr()) ||
        !fast_tensors(x.ptr(), x2.ptr(), D.ptr(), weight2.ptr(), bias2.ptr(), eps.ptr(), off.ptr()))
        return py::none();
    int how = route({x.ptr(), x2.ptr(), residual.ptr(), weight.ptr(), bias.ptr(), weight2.ptr(), bias2.ptr()});
    if (how < 0) return py::none();
    double e = PyFloat_AS_DOUBLE(eps.ptr()), o = py::cast<double>(off);
    bool bf = branches_first.ptr() == Py_True;
    Tensor xt = unpack(x.ptr()), x2t = unpack(x2.ptr()), rt = unpack(residual.ptr()), wt = unpack(weight.ptr()),
           bt = unpack(bias.ptr()), w2t = unpack(weight2.ptr()), b2t = unpack(bias2.ptr());
    bool two = w2t.defined() || b2t.defined();
    if (how == 0) {
        AddNormOut r = parallel_forward(xt, x2t, rt, wt, bt, w2t, b2t, kind, e, o, cbw, bf, false);
        return py::make_tuple(r.out, two ? py::cast(r.y2) : py::none(), r.s);
    }
    auto maybe = [](const Tensor &t) { return t.defined() ? OptT(t) : OptT(); };
    auto r = ParallelNode::apply(xt, maybe(x2t), rt, maybe(wt), maybe(bt), maybe(w2t), maybe(b2t), kind, e, o, cbw,
                                 bf);
    return py::make_tuple(r[0], two ? py::cast(r[1]) : py::none(), r[2]);
}

// One DyT / Derf forward (pointwise.forward): y, and s = x + residual where there is a residual.
struct PointwiseOut {
    Tensor y, s;
    std::vector<Tensor> read;
    int pcode;
};

PointwiseOut pointwise_forward(const Tensor &x, const Tensor &residual, float alpha, float shift, const Tensor &weight,
                               const Tensor &bias, int64_t kind) {
    PointwiseOut r;
    int64_t D = x.size(-1), N = x.numel() / D;
    r.read = {weight, bias};
    r.pcode = read_params(r.read, D);
    r.y = torch::empty_like(x, at::MemoryFormat::Contiguous);
    if (residual.defined()) r.s = torch::empty_like(x, at::MemoryFormat::Contiguous);
    int c = code(x), rc;
    {
        NoGil released;
        rc = k_pointwise_forward((int)kind, c, residual.defined() ? c : 0, c, c, N, D, ptr(x), D, ptr(residual), D,
                                 ptr(r.read[0]), ptr(r.read[1]), r.pcode, alpha, shift, r.y.data_ptr(), mptr(r.s),
                                 nthreads());
    }
    check_rc(rc, "pointwise forward");
    return r;
}

// alpha and shift as pointwise_schema._scalar reads them: float32 values
float scalar_value(const Tensor &t) { return t.defined() ? t.to(at::kFloat).item<float>() : 0.0f; }

// (x, residual, alpha, shift, weight, bias, kind) -> (y) or (y, s); the Python node is PointwiseNorm
struct PointwiseNode : public torch::autograd::Function<PointwiseNode> {
    static variable_list forward(AutogradContext *ctx, Tensor x, OptT residual_, Tensor alpha, OptT shift_,
                                 OptT weight_, OptT bias_, int64_t kind) {
        Tensor residual = opt(residual_), shift = opt(shift_), weight = opt(weight_), bias = opt(bias_);
        ctx->set_materialize_grads(false);
        float a = scalar_value(alpha), sh = scalar_value(shift);
        PointwiseOut r = pointwise_forward(x, residual, a, sh, weight, bias, kind);
        ctx->save_for_backward({r.s.defined() ? r.s : x, alpha, shift, weight, bias});
        ctx->saved_data["kind"] = kind;
        ctx->saved_data["has_res"] = residual.defined();
        ctx->saved_data["given"] = given({true, residual.defined(), true, shift.defined(), weight.defined(),
                                          bias.defined()});
        ctx->saved_data["pcode"] = (int64_t)r.pcode;
        ctx->saved_data["w_read"] = r.read[0];
        ctx->saved_data["b_read"] = r.read[1];
        ctx->saved_data["alpha_f"] = (double)a;
        ctx->saved_data["shift_f"] = (double)sh;
        if (!r.s.defined()) return {r.y};
        return {r.y, r.s};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        auto saved = saved_rows(ctx);
        const Tensor &sv = saved[0];
        Tensor dy = grads[0], dres = grads.size() > 1 ? grads[1] : Tensor();
        if (!dy.defined() && !dres.defined()) return variable_list(7);
        if (!dy.defined() || !kernel_backward(sv.scalar_type(), {dy, dres}))
            return python_backward(POINTWISE, ctx, saved, grads, 7);
        const Tensor &alpha = saved[1], &shift = saved[2], &w = saved[3], &b = saved[4];
        bool want_a = need(ctx, 2), want_sh = shift.defined() && need(ctx, 3);
        bool want_w = w.defined() && need(ctx, 4), want_b = b.defined() && need(ctx, 5);
        int pcode = (int)ctx->saved_data["pcode"].toInt();
        Tensor w_read = ctx->saved_data["w_read"].toTensor(), b_read = ctx->saved_data["b_read"].toTensor();
        dy = rows(dy);
        dres = rows(dres);
        int64_t D = sv.size(-1), N = sv.numel() / D;
        auto ds = torch::empty_like(sv, at::MemoryFormat::Contiguous);
        auto popt = sv.options().dtype(param_type(pcode));
        Tensor dw = want_w ? torch::empty({D}, popt) : Tensor(), db = want_b ? torch::empty({D}, popt) : Tensor();
        Tensor scal = want_a || want_sh ? torch::zeros({2}, sv.options().dtype(at::kDouble)) : Tensor();
        int c = code(sv);
        check_rc(k_pointwise_backward((int)ctx->saved_data["kind"].toInt(), c, code(dy), dres.defined() ? code(dres) : 0,
                                      N, D, ptr(sv), ptr(dy), D, ptr(dres), D, ptr(w_read), pcode,
                                      (float)ctx->saved_data["alpha_f"].toDouble(),
                                      (float)ctx->saved_data["shift_f"].toDouble(), ds.data_ptr(), mptr(dw),
                                      mptr(db), scal.defined() ? scal.data_ptr<double>() : nullptr, nthreads()),
                 "pointwise backward");
        Tensor da = want_a ? scal[0].to(alpha.scalar_type()).reshape(alpha.sizes()) : Tensor();
        Tensor dsh = want_sh ? scal[1].to(shift.scalar_type()).reshape(shift.sizes()) : Tensor();
        bool has_res = ctx->saved_data["has_res"].toBool();
        return {ds, has_res ? ds : Tensor(), da, dsh, like(dw, w, w_read), like(db, b, b_read), Tensor()};
    }
};

// DyT / Derf of x + residual: (y, s or x), or None where the fast path does not apply (functional.pointwise._fast's
// rules) or inside a forward-AD level (the Python node carries tangents).
bool pw_scalar(PyObject *o) {
    if (o == Py_None) return true;
    if (!THPVariable_CheckExact(o)) return false;
    const Tensor &t = THPVariable_Unpack(o);
    return t.numel() == 1 && t.is_cpu() && t.is_floating_point() && t.layout() == at::kStrided &&
           t.data_ptr() != nullptr;
}

py::object fast_pointwise(py::handle x, py::handle residual, py::handle alpha, py::handle shift, py::handle weight,
                          py::handle bias, int64_t kind) {
    PyObject *xo = x.ptr();
    if (!plain_tensor(xo) || alpha.is_none() || !pw_scalar(alpha.ptr()) || !pw_scalar(shift.ptr())) return py::none();
    const Tensor &xt = THPVariable_Unpack(xo);
    if (xt.dim() == 0 || !fast_core(xo, residual.ptr(), xt.size(-1), weight.ptr(), bias.ptr(), false))
        return py::none();
    int how = route({xo, residual.ptr(), alpha.ptr(), shift.ptr(), weight.ptr(), bias.ptr()});
    if (how < 0) return py::none();
    Tensor rt = unpack(residual.ptr()), at_ = unpack(alpha.ptr()), st = unpack(shift.ptr());
    Tensor wt = unpack(weight.ptr()), bt = unpack(bias.ptr());
    py::object stream = py::reinterpret_borrow<py::object>(x);
    if (how == 0) {
        PointwiseOut r = pointwise_forward(xt, rt, scalar_value(at_), scalar_value(st), wt, bt, kind);
        return py::make_tuple(r.y, rt.defined() ? py::cast(r.s) : stream);
    }
    auto maybe = [](const Tensor &t) { return t.defined() ? OptT(t) : OptT(); };
    auto r = PointwiseNode::apply(xt, maybe(rt), at_, maybe(st), maybe(wt), maybe(bt), kind);
    return py::make_tuple(r[0], r.size() > 1 ? py::cast(r[1]) : stream);
}

// ---------------------------------------------------------------- the widened stream's reads
// mHC's pre step (functional.mhc.mhc_pre), the write before it (mhc_write_pre) and their hyper-connection forms
// without a mixing matrix (functional.hyper.hyper_read, hyper_write_read), checked and run here when no gradient
// is wanted: at one decoded token the kernel takes tens of microseconds and the Python layers around it (checks,
// the kernel choice, the host's outputs and pointers) cost more than HF's whole module. mhc_pre's read (mHC's, or
// mHC-lite's with its permutation matrices) where a gradient is wanted: MhcPreNode. Every call that is not the
// plain one -- a gradient wanted elsewhere, float64 anywhere, a view, another device, matrices in perms that are not
// permutations, a shape or number the Python path would refuse -- returns None, and the caller's general path takes
// it (and names what is wrong). The kernel gets what kernels.cpu.mhc gives it: the same layouts of phi, the same
// float32 coefficients, so the same bits.
constexpr int MHC_MAX_STREAMS = 8, MHC_MAX_M = 128, MHC_MAX_ITERS = 64;  // kernels.cpu.mhc's limits

// a plain CPU tensor (or Parameter) of a kernel dtype, strided, not a negative or conjugate view, with its storage
// (route() says whether a gradient is wanted)
bool small_param(PyObject *o) {
    if (!THPVariable_CheckExact(o)) return false;
    const Tensor &t = THPVariable_Unpack(o);
    return kernel_dtype(t.scalar_type()) && t.is_cpu() && t.layout() == at::kStrided && !t.is_neg() && !t.is_conj() &&
           stored(t);
}

// a Python float (or int) as a finite double, or false
bool number(PyObject *o, double &v) {
    if (PyBool_Check(o)) return false;
    if (PyFloat_CheckExact(o)) v = PyFloat_AS_DOUBLE(o);
    else if (PyLong_CheckExact(o)) v = PyLong_AsDouble(o);
    else return false;
    if (PyErr_Occurred()) { PyErr_Clear(); return false; }
    return std::isfinite(v);
}

// the elements of a small tensor appended to out as float32 (as .float() rounds them)
void append_floats(const Tensor &t, std::vector<float> &out) {
    Tensor f = t.to(at::kFloat).contiguous();
    const float *p = f.data_ptr<float>();
    out.insert(out.end(), p, p + f.numel());
}

// a widened-stream kernel's return code as its Python host raises it (kernels.cpu.mhc / hyper): MemoryError for
// scratch memory, ValueError for a call it refused
void check_stream_rc(int rc, const char *what) {
    if (rc == -1) check_rc(-1, what);
    if (rc == 0) return;
    py::gil_scoped_acquire gil;
    PyErr_Format(PyExc_ValueError, "addnorm CPU %s kernel refused the call (code %d)", what, rc);
    throw python_error();
}

// an activation beside the stream x as the kernels read it: x's dtype, on the CPU, strided and contiguous, not a
// negative or conjugate view, of the given shape, with its storage
bool like_x(const Tensor &t, at::ScalarType st, at::IntArrayRef sizes) {
    return t.scalar_type() == st && t.is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_neg() &&
           !t.is_conj() && t.sizes() == sizes && stored(t);
}

struct MhcCall {
    Tensor x, y, w_post, w_res, phi, phiT;  // phi (K, mp) or phiT (m, K), as the kernel reads it; the coefficients
                                            // float32 and contiguous (kernels.rows.f32)
    std::vector<float> a, bias;
    int n = 0, m = 0, r = 0, groups = 3, iters = 0;
    int64_t C = 0;
    bool products = false;
    double eps = 0, pre_eps = 0, res_eps = 0, post_scale = 2, post_eps = 0;
    bool res_t = false;
    Tensor perms, perm_idx;  // mHC-lite: the (r, n, n) permutation matrices and the kernels' (r, n) int32 index
};

// mHC-lite's permutation matrices as the kernels' index table (ops.mhc.schema.perm_index): a plain CPU float tensor
// (r >= 1, n, n) of 0s and 1s with one 1 in every row and column, idx[k, i] the column of row i's 1; false for
// anything else (the general path answers: the formulas for other matrices, its errors for bad ones)
bool mhc_perms(MhcCall &c, PyObject *po) {
    if (!THPVariable_CheckExact(po)) return false;
    const Tensor &p = THPVariable_Unpack(po);
    if (!p.is_floating_point() || !p.is_cpu() || p.layout() != at::kStrided || p.is_neg() || p.is_conj() ||
        p.dim() != 3 || p.size(0) < 1 || p.size(1) != c.n || p.size(2) != c.n || !stored(p) || p.requires_grad())
        return false;
    const int64_t r = p.size(0), n = c.n;
    if (2 * n + r > MHC_MAX_M) return false;  // more outputs than the kernels take: no table to build
    Tensor v = p.to(at::kDouble).contiguous(), idx = at::empty({r, n}, p.options().dtype(at::kInt));
    const double *d = v.data_ptr<double>();
    int32_t *ix = idx.data_ptr<int32_t>();
    for (int64_t k = 0; k < r; k++) {
        const double *m = d + k * n * n;
        for (int64_t i = 0; i < n; i++) {
            double row = 0, col = 0;
            for (int64_t j = 0; j < n; j++) {
                const double e = m[i * n + j];
                if (e != 0.0 && e != 1.0) return false;
                if (e == 1.0) ix[k * n + i] = (int32_t)j;
                row += e;
                col += m[j * n + i];
            }
            if (row != 1.0 || col != 1.0) return false;
        }
    }
    c.perms = p;
    c.perm_idx = idx;
    return true;
}

// the stream x (..., n, C) and the write's tensors (y None: a read alone); false where the fast entry declines
bool mhc_stream(MhcCall &c, PyObject *xo, PyObject *yo, PyObject *po, PyObject *ro, PyObject *prod) {
    if (!plain_tensor(xo)) return false;
    const Tensor &x = THPVariable_Unpack(xo);
    // any size: the large outputs come from the output pool (out_empty), as the Python hosts' do
    if (!kernel_dtype(x.scalar_type()) || !x.is_cpu() || x.layout() != at::kStrided || !x.is_contiguous() ||
        x.dim() < 2 || x.is_neg() || x.is_conj() || x.numel() == 0 || !stored(x))
        return false;
    c.n = (int)x.size(-2);
    c.C = x.size(-1);
    if (c.n < 1 || c.n > MHC_MAX_STREAMS) return false;
    c.x = x;
    if (yo == Py_None) return po == Py_None && ro == Py_None;
    if (!PyBool_Check(prod)) return false;
    auto lead = x.sizes().slice(0, x.dim() - 2);
    if (!plain_tensor(yo) || !plain_tensor(po)) return false;
    c.y = THPVariable_Unpack(yo);
    const Tensor &post = THPVariable_Unpack(po);
    std::vector<int64_t> ys(lead.begin(), lead.end()), ps(lead.begin(), lead.end());
    ys.push_back(c.C);
    ps.push_back(c.n);
    if (!like_x(c.y, x.scalar_type(), ys)) return false;
    // the coefficients of any kernel dtype (a bfloat16 model's H_post and H_res), read as float32
    if (!small_param(po) || post.sizes() != at::IntArrayRef(ps)) return false;
    // each product H_post[i] y rounded to its own dtype (ops.mhc.write._kernel_products): X's when H_post is no
    // wider than y (y is in X's dtype)
    c.products = prod == Py_True && at::promote_types(post.scalar_type(), x.scalar_type()) == x.scalar_type();
    c.w_post = post.to(at::kFloat).contiguous();
    if (ro == Py_None) return true;
    if (prod == Py_True || !plain_tensor(ro) || !small_param(ro)) return false;  // products with a mixing matrix:
                                                                                // Python refuses it
    const Tensor &res = THPVariable_Unpack(ro);
    ps.push_back(c.n);
    if (res.sizes() != at::IntArrayRef(ps)) return false;
    c.w_res = res.to(at::kFloat).contiguous();
    return true;
}

// phi (K, m) as kernels.cpu.mhc._layouts hands it over: the transposed view of a model's float32 (m, K) weight as
// phiT, a contiguous float32 (K, mp) as phi, anything else copied as float32, zero-padded to (K, mp)
void mhc_layout(MhcCall &c, const Tensor &phi_in) {
    int mp = (c.m + 7) / 8 * 8;
    const bool f32 = phi_in.scalar_type() == at::kFloat;
    Tensor phi = f32 ? phi_in : phi_in.to(at::kFloat);
    if (f32 && phi.t().is_contiguous() && !(phi.is_contiguous() && phi.size(1) == mp)) {
        c.phiT = phi.t();
        return;
    }
    if (phi.is_contiguous() && phi.size(1) == mp) {
        c.phi = phi;
        return;
    }
    c.phi = at::zeros({phi.size(0), mp}, phi.options());
    c.phi.narrow(1, 0, c.m).copy_(phi);
}

// The forward's outputs: (X' where it writes,) h, H_pre, H_post, H_res, and what a backward reads: p, rstd and,
// with keep, Sinkhorn-Knopp's rounds (kernels.cpu.mhc.state_size; (..., 0) where none are kept)
struct MhcOut {
    Tensor x2, h, h_pre, h_post, h_res, p, rstd, state;
};

int64_t mhc_state_size(const MhcCall &c) {
    return c.groups < 3 || c.perm_idx.defined() ? 0 : (int64_t)(1 + c.iters) * c.n * c.n + 2 * (int64_t)c.iters * c.n;
}

MhcOut mhc_forward(MhcCall &c, bool write, bool keep) {
    const Tensor &x = c.x;
    auto lead = x.sizes().slice(0, x.dim() - 2);
    auto with = [&](std::initializer_list<int64_t> tail) {
        std::vector<int64_t> s(lead.begin(), lead.end());
        s.insert(s.end(), tail);
        return s;
    };
    auto f = x.options().dtype(at::kFloat);
    MhcOut o;
    o.h = out_empty(with({c.C}), x.options());
    o.h_pre = at::empty(with({c.n}), f);
    o.h_post = at::empty(with({c.groups > 1 ? c.n : 0}), f);
    o.h_res = c.groups > 2 ? at::empty(with({c.n, c.n}), f) : at::empty(with({0, 0}), f);
    o.p = at::empty(with({c.m}), f);
    o.rstd = at::empty(with({}), f);
    const int64_t S = keep ? mhc_state_size(c) : 0;
    if (keep) o.state = at::empty(with({S}), f);
    if (write) o.x2 = out_like(x);
    int64_t N = x.numel() / (c.n * c.C);
    int mp = (c.m + 7) / 8 * 8, rc;
    const void *xp = ptr(x), *yp = ptr(c.y), *phip = ptr(c.phi), *phiTp = ptr(c.phiT);
    const float *wpp = (const float *)ptr(c.w_post), *wrp = (const float *)ptr(c.w_res);
    float *st = S ? o.state.data_ptr<float>() : nullptr;
    {
        NoGil released;
        rc = k_mhc(write ? 2 : 0, c.n, code(x), N, c.C, c.m, mp, c.r, c.iters, xp, (const float *)phip,
                   (const float *)phiTp, c.a[0], c.a[1], c.a[2], c.bias.data(), (const int32_t *)ptr(c.perm_idx),
                   (float)c.eps,
                   (float)c.pre_eps, (float)c.res_eps, c.res_t ? 1 : 0, (float)c.post_scale, (float)c.post_eps,
                   c.groups, o.h.data_ptr(), o.h_pre.data_ptr<float>(), o.h_post.data_ptr<float>(),
                   o.h_res.data_ptr<float>(), o.p.data_ptr<float>(), o.rstd.data_ptr<float>(), st, nullptr, nullptr,
                   nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, yp, wpp, wrp,
                   c.products ? 1 : 0, mptr(o.x2), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nthreads());
    }
    check_stream_rc(rc, "mHC");
    return o;
}

py::object mhc_run(MhcCall &c, bool write) {
    MhcOut o = mhc_forward(c, write, false);
    if (write) return py::make_tuple(o.x2, o.h, o.h_pre, o.h_post, o.h_res);
    return py::make_tuple(o.h, o.h_pre, o.h_post, o.h_res);
}

// the convention's numbers (MhcConvention.fields: pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)
bool mhc_numbers(MhcCall &c, PyObject *eps, PyObject *iters, PyObject *pre_eps, PyObject *res_eps, PyObject *res_t,
                 PyObject *post_scale, PyObject *post_eps, PyObject *groups) {
    if (!number(eps, c.eps) || !(c.eps >= 0) || !PyLong_CheckExact(iters) || !PyLong_CheckExact(groups) ||
        !PyBool_Check(res_t) || !number(pre_eps, c.pre_eps) || !number(res_eps, c.res_eps) || !(c.res_eps >= 0) ||
        !number(post_scale, c.post_scale) || !number(post_eps, c.post_eps))
        return false;
    long it = PyLong_AsLong(iters), g = PyLong_AsLong(groups);
    if (PyErr_Occurred()) { PyErr_Clear(); return false; }
    if (it < 0 || it > MHC_MAX_ITERS || g < 1 || g > 3) return false;
    c.iters = (int)it;
    c.groups = (int)g;
    c.res_t = res_t == Py_True;
    return true;
}

// ---------------------------------------------------------------- mHC's pre step with a gradient
// The node of functional.mhc.mhc_pre where a gradient is wanted (the plain call fast_mhc takes, with no write before
// it), in place of the Python DirectMhcPre: at a training block's 512 tokens x 4 x 768 its Python around the
// kernels (checks, the kernel choice, the host's outputs and pointers, the coefficients' float32 copies, their
// gradients cut from the kernel's sums) took 0.3 ms forward and 0.4 ms backward a call beside 0.7 and 1.9 ms of
// kernel. Forward and backward call the C kernels as kernels.cpu.mhc does (the same arguments, so the same bits);
// every backward but the plain one goes to MhcPre.backward (ops.mhc.autograd) through the fallback.
//
// phi as a backward reads it (kernels.cpu.mhc._layouts with backward=True): phiT (m, K) where phi is the transposed
// view of an (m, K) float32 weight; phi (K, mp) as it lies, which the kernel transposes; else phiT copied
void mhc_backward_layout(const Tensor &phi_in, int mp, Tensor &phi, Tensor &phiT) {
    const bool f32 = phi_in.scalar_type() == at::kFloat;
    if (f32 && phi_in.t().is_contiguous() && !(phi_in.is_contiguous() && phi_in.size(1) == mp)) {
        phiT = phi_in.t();
        return;
    }
    Tensor p = f32 ? phi_in : phi_in.to(at::kFloat);
    if (p.size(1) == mp && p.is_contiguous()) phi = p;
    else phiT = p.t().contiguous();
}

// the incoming gradients of h and the maps as the kernel reads them: contiguous, H_post's and H_res's only where the
// convention's groups make those maps
void mhc_grad_rows(Tensor &dh, Tensor &dpre, Tensor &dpost, Tensor &dres, int groups) {
    dh = rows(dh);
    dpre = rows(dpre);
    dpost = groups > 1 ? rows(dpost) : Tensor();
    dres = groups > 2 ? rows(dres) : Tensor();
}

// A node's forward: the three scalars and the three biases read as float32 (the kernel's), phi laid out as the kernel
// reads it, the kernel run (with y: the write first) keeping Sinkhorn-Knopp's rounds for the backward
MhcOut mhc_node_forward(MhcCall &c, const Tensor &phi, std::initializer_list<const Tensor *> coeffs, bool write) {
    int i = 0;
    for (const Tensor *t : coeffs) append_floats(*t, i++ < 3 ? c.a : c.bias);
    mhc_layout(c, phi);
    return mhc_forward(c, write, true);
}

// The call's numbers and the coefficients as the kernel read them (float32), kept for a backward: the saved ones
// cannot change meanwhile (autograd refuses a saved tensor modified in place)
void mhc_save_call(AutogradContext *ctx, const MhcCall &c, const at::TensorOptions &opts) {
    ctx->saved_data["eps"] = c.eps;
    ctx->saved_data["iters"] = (int64_t)c.iters;
    ctx->saved_data["pre_eps"] = c.pre_eps;
    ctx->saved_data["res_eps"] = c.res_eps;
    ctx->saved_data["res_t"] = c.res_t;
    ctx->saved_data["post_scale"] = c.post_scale;
    ctx->saved_data["post_eps"] = c.post_eps;
    ctx->saved_data["groups"] = (int64_t)c.groups;
    ctx->saved_data["r"] = (int64_t)c.r;
    ctx->saved_data["scal"] = torch::tensor(c.a, opts.dtype(at::kFloat));
    ctx->saved_data["bias"] = torch::tensor(c.bias, opts.dtype(at::kFloat));
}

// the coefficients' gradients from the kernel's sums (ops.mhc.formulas.coefficient_grads_from_sums): da_pre, da_post,
// da_res, then db over the columns of each group, each its own tensor in its coefficient's dtype, into out[first..]
// for the six coefficients saved at saved[first..]
void mhc_coefficient_grads(AutogradContext *ctx, const variable_list &saved, int first, const Tensor &dcoef, int n,
                           int m, variable_list &out) {
    const int64_t sizes[6] = {1, 1, 1, n, std::max<int64_t>(0, std::min<int64_t>(n, m - n)),
                              std::max<int64_t>(0, m - 2 * n)};
    int64_t off = 0;
    for (int i = 0; i < 6; i++) {
        const Tensor &coef = saved[first + i];
        if (need(ctx, first + i))
            out[first + i] = dcoef.narrow(0, off, sizes[i]).reshape(coef.sizes()).to(coef.scalar_type(), false, true);
        off += sizes[i];
    }
}

// x, phi, the six coefficients, then the call fast_mhc checked (MhcCall: the numbers, the convention and mHC-lite's
// permutations; no gradient edge)
constexpr int MHC_TENSORS = 8, MHC_OTHERS = 1;

struct MhcPreNode : public torch::autograd::Function<MhcPreNode> {
    static variable_list forward(AutogradContext *ctx, Tensor x, Tensor phi, Tensor a_pre, Tensor a_post,
                                 Tensor a_res, Tensor b_pre, Tensor b_post, Tensor b_res, const MhcCall &call) {
        ctx->set_materialize_grads(false);
        MhcCall c = call;
        MhcOut o = mhc_node_forward(c, phi, {&a_pre, &a_post, &a_res, &b_pre, &b_post, &b_res}, false);
        ctx->save_for_backward({x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, o.p, o.rstd, o.state});
        mhc_save_call(ctx, c, x.options());
        ctx->saved_data["given"] = given({true, true, true, true, true, true, true, true});
        ctx->saved_data["perms"] = c.perms;
        ctx->saved_data["perm_idx"] = c.perm_idx;
        return {o.h, o.h_pre, o.h_post, o.h_res};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        variable_list saved = ctx->get_saved_variables();
        const size_t n_out = MHC_TENSORS + MHC_OTHERS;
        Tensor dh = grads[0], dpre = grads[1], dpost = grads[2], dres = grads[3];
        if (!dh.defined() && !dpre.defined() && !dpost.defined() && !dres.defined()) return variable_list(n_out);
        const Tensor x = rows(saved[0]);
        const Tensor &phi = saved[1], &p = saved[8], &rstd = saved[9], &state = saved[10];
        if (!kernel_backward(x.scalar_type(), {dh}) || !kernel_backward(at::kFloat, {dpre, dpost, dres}) ||
            p.scalar_type() != at::kFloat || !p.is_contiguous() || !rstd.is_contiguous() || !state.is_contiguous()) {
            variable_list g = python_backward(MHC_PRE, ctx, saved, grads, MHC_TENSORS);
            g.resize(n_out);
            return g;
        }
        const int groups = (int)ctx->saved_data["groups"].toInt(), iters = (int)ctx->saved_data["iters"].toInt();
        const Tensor perm_idx = ctx->saved_data["perm_idx"].toTensor();
        const int n = (int)x.size(-2), m = (int)p.size(-1), mp = (m + 7) / 8 * 8, r = (int)ctx->saved_data["r"].toInt();
        const int64_t C = x.size(-1), N = x.numel() / (n * C);
        mhc_grad_rows(dh, dpre, dpost, dres, groups);
        auto f = x.options().dtype(at::kFloat);
        auto lead = x.sizes().slice(0, x.dim() - 2);
        std::vector<int64_t> ls(lead.begin(), lead.end());
        ls.push_back(m);
        Tensor dx = out_like(x), dlogits = at::empty(ls, f);
        Tensor dphi = at::empty(phi.sizes(), f), dcoef = at::empty({3 + m}, f);
        Tensor ph, phT;
        mhc_backward_layout(phi, mp, ph, phT);
        const Tensor scal = ctx->saved_data["scal"].toTensor(), bias = ctx->saved_data["bias"].toTensor();
        const float *a = scal.data_ptr<float>();
        const float *kept = state.numel() > 0 ? state.data_ptr<float>() : nullptr;
        int rc = k_mhc(1, n, code(x), N, C, m, mp, r, iters, ptr(x), (const float *)ptr(ph), (const float *)ptr(phT),
                       a[0], a[1], a[2], bias.data_ptr<float>(), (const int32_t *)ptr(perm_idx), 0.0f,
                       (float)ctx->saved_data["pre_eps"].toDouble(), (float)ctx->saved_data["res_eps"].toDouble(),
                       ctx->saved_data["res_t"].toBool() ? 1 : 0, (float)ctx->saved_data["post_scale"].toDouble(),
                       (float)ctx->saved_data["post_eps"].toDouble(), groups, nullptr, nullptr, nullptr, nullptr,
                       nullptr, nullptr, nullptr, ptr(dh), (const float *)ptr(dpre), (const float *)ptr(dpost),
                       (const float *)ptr(dres), p.data_ptr<float>(), rstd.data_ptr<float>(), kept, dx.data_ptr(),
                       dlogits.data_ptr<float>(), dphi.data_ptr<float>(), dcoef.data_ptr<float>(), nullptr, nullptr,
                       nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nthreads());
        check_stream_rc(rc, "mHC");
        variable_list out(n_out);
        if (need(ctx, 0)) out[0] = dx;
        if (need(ctx, 1)) out[1] = dphi.to(phi.scalar_type());
        mhc_coefficient_grads(ctx, saved, 2, dcoef, n, m, out);
        return out;
    }
};

// ---------------------------------------------------------------- a write of the stream and mHC's pre step on it
// The node of functional.mhc.mhc_write_pre where a gradient is wanted (the plain call fast_mhc takes), in place of the
// Python MhcWritePre: what a widened sub-layer leaves pending (its output y and the coefficients that write it)
// finished in the pass that computes the next read. Forward keeps Sinkhorn-Knopp's rounds (the Python operator's
// schema has no output for them, so its backward recomputes them); backward is one C pass per token, the read's
// backward then the write's, with the kept rounds. Every backward but the plain one goes to MhcWritePre.backward
// (ops.mhc.write) through the fallback, which reads the saved tensors but the rounds.
constexpr int WRITE_PRE_TENSORS = 11;  // x, y, w_post, w_res (optional), phi, the six coefficients

struct MhcWritePreNode : public torch::autograd::Function<MhcWritePreNode> {
    static variable_list forward(AutogradContext *ctx, Tensor x, Tensor y, Tensor w_post, OptT w_res_, Tensor phi,
                                 Tensor a_pre, Tensor a_post, Tensor a_res, Tensor b_pre, Tensor b_post, Tensor b_res,
                                 const MhcCall &call) {
        ctx->set_materialize_grads(false);
        MhcCall c = call;
        MhcOut o = mhc_node_forward(c, phi, {&a_pre, &a_post, &a_res, &b_pre, &b_post, &b_res}, true);
        const Tensor w_res = opt(w_res_);
        ctx->save_for_backward({x, y, w_post, w_res, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, o.x2, o.p,
                                o.rstd, o.state});
        mhc_save_call(ctx, c, x.options());
        ctx->saved_data["products"] = c.products;
        ctx->saved_data["perms"] = c.perms;
        ctx->saved_data["perm_idx"] = c.perm_idx;
        ctx->saved_data["given"] = given({true, true, true, w_res.defined(), true, true, true, true, true, true, true});
        return {o.x2, o.h, o.h_pre, o.h_post, o.h_res};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        variable_list saved = ctx->get_saved_variables();
        const size_t n_out = WRITE_PRE_TENSORS + 1;  // and the call's MhcCall
        Tensor dx2 = grads[0], dh = grads[1], dpre = grads[2], dpost = grads[3], dres = grads[4];
        if (!dx2.defined() && !dh.defined() && !dpre.defined() && !dpost.defined() && !dres.defined())
            return variable_list(n_out);
        const Tensor x = rows(saved[0]), y = rows(saved[1]), x2 = rows(saved[11]);
        const Tensor &w_post = saved[2], &w_res = saved[3], &phi = saved[4], &p = saved[12], &rstd = saved[13],
                     &state = saved[14];
        if (!kernel_backward(x.scalar_type(), {dx2, dh}) || !kernel_backward(at::kFloat, {dpre, dpost, dres}) ||
            p.scalar_type() != at::kFloat || !p.is_contiguous() || !rstd.is_contiguous() || !state.is_contiguous()) {
            const variable_list py_saved(saved.begin(), saved.begin() + 14);  // all but the rounds
            variable_list g = python_backward(MHC_WRITE_PRE, ctx, py_saved, grads, WRITE_PRE_TENSORS);
            g.resize(n_out);
            return g;
        }
        const int groups = (int)ctx->saved_data["groups"].toInt(), iters = (int)ctx->saved_data["iters"].toInt();
        const int n = (int)x.size(-2), m = (int)p.size(-1), mp = (m + 7) / 8 * 8, r = (int)ctx->saved_data["r"].toInt();
        const int64_t C = x.size(-1), N = x.numel() / (n * C);
        dx2 = rows(dx2);
        mhc_grad_rows(dh, dpre, dpost, dres, groups);
        auto f = x.options().dtype(at::kFloat);
        auto lead = x.sizes().slice(0, x.dim() - 2);
        std::vector<int64_t> ls(lead.begin(), lead.end()), ps(lead.begin(), lead.end());
        ls.push_back(m);
        ps.push_back(n);
        Tensor dlogits = at::empty(ls, f), dphi = at::empty(phi.sizes(), f), dcoef = at::empty({3 + m}, f);
        Tensor dx = out_like(x), dy = out_like(y), d_post = at::empty(ps, f), d_res;
        const Tensor wp = w_post.to(at::kFloat).contiguous();
        Tensor wr;
        if (w_res.defined()) {
            wr = w_res.to(at::kFloat).contiguous();
            ps.push_back(n);
            d_res = at::empty(ps, f);
        }
        Tensor ph, phT;
        mhc_backward_layout(phi, mp, ph, phT);
        const Tensor scal = ctx->saved_data["scal"].toTensor(), bias = ctx->saved_data["bias"].toTensor();
        const float *a = scal.data_ptr<float>();
        const float *kept = state.numel() > 0 ? state.data_ptr<float>() : nullptr;
        const Tensor perm_idx = ctx->saved_data["perm_idx"].toTensor();
        int rc = k_mhc(3, n, code(x), N, C, m, mp, r, iters, ptr(x2), (const float *)ptr(ph), (const float *)ptr(phT),
                       a[0], a[1], a[2], bias.data_ptr<float>(), (const int32_t *)ptr(perm_idx), 0.0f,
                       (float)ctx->saved_data["pre_eps"].toDouble(), (float)ctx->saved_data["res_eps"].toDouble(),
                       ctx->saved_data["res_t"].toBool() ? 1 : 0, (float)ctx->saved_data["post_scale"].toDouble(),
                       (float)ctx->saved_data["post_eps"].toDouble(), groups, nullptr, nullptr, nullptr, nullptr,
                       nullptr, nullptr, nullptr, ptr(dh), (const float *)ptr(dpre), (const float *)ptr(dpost),
                       (const float *)ptr(dres), p.data_ptr<float>(), rstd.data_ptr<float>(), kept, nullptr,
                       dlogits.data_ptr<float>(), dphi.data_ptr<float>(), dcoef.data_ptr<float>(), ptr(y),
                       wp.data_ptr<float>(), (const float *)ptr(wr), 0, nullptr, w_res.defined() ? ptr(x) : nullptr,
                       ptr(dx2), dx.data_ptr(), dy.data_ptr(), d_post.data_ptr<float>(), (float *)ptr(d_res),
                       nthreads());
        check_stream_rc(rc, "mHC");
        variable_list out(n_out);
        if (need(ctx, 0)) out[0] = dx;
        if (need(ctx, 1)) out[1] = dy;
        if (need(ctx, 2)) out[2] = d_post.to(w_post.scalar_type());
        if (need(ctx, 3)) out[3] = d_res.to(w_res.scalar_type());
        if (need(ctx, 4)) out[4] = dphi.to(phi.scalar_type());
        mhc_coefficient_grads(ctx, saved, 5, dcoef, n, m, out);
        return out;
    }
};

// (h, H_pre, H_post, H_res) or, with y, (X', h, H_pre, H_post, H_res) of functional.mhc's mhc_pre / mhc_write_pre,
// or None
py::object fast_mhc(py::handle x, py::handle y, py::handle h_post, py::handle h_res, py::handle products,
                    py::handle phi, py::handle a_pre, py::handle a_post, py::handle a_res, py::handle b_pre,
                    py::handle b_post, py::handle b_res, py::handle perms, py::handle eps, py::handle iters,
                    py::handle pre_eps, py::handle res_eps, py::handle res_t, py::handle post_scale,
                    py::handle post_eps, py::handle groups) {
    MhcCall c;
    if (!mhc_stream(c, x.ptr(), y.ptr(), h_post.ptr(), h_res.ptr(), products.ptr()) ||
        !mhc_numbers(c, eps.ptr(), iters.ptr(), pre_eps.ptr(), res_eps.ptr(), res_t.ptr(), post_scale.ptr(),
                     post_eps.ptr(), groups.ptr()))
        return py::none();
    // mHC-lite (its read, or a write and its read) with the paper's H_res (the general path refuses the others)
    if (!perms.is_none() && (c.groups != 3 || c.res_eps != 0 || c.res_t || !mhc_perms(c, perms.ptr())))
        return py::none();
    int n = c.n;
    c.r = c.groups < 3 ? 0 : c.perm_idx.defined() ? (int)c.perm_idx.size(0) : n * n;
    c.m = c.groups == 1 ? n : 2 * n + c.r;
    if (c.m > MHC_MAX_M || !small_param(phi.ptr())) return py::none();
    const Tensor &ph = THPVariable_Unpack(phi.ptr());
    if (ph.dim() != 2 || ph.size(0) != n * c.C || ph.size(1) != c.m) return py::none();
    PyObject *coeffs[6] = {a_pre.ptr(), a_post.ptr(), a_res.ptr(), b_pre.ptr(), b_post.ptr(), b_res.ptr()};
    int64_t want[6] = {1, 1, 1, n, c.groups > 1 ? n : 0, c.r};
    for (int i = 0; i < 6; i++) {
        if (!small_param(coeffs[i])) return py::none();
        const Tensor &t = THPVariable_Unpack(coeffs[i]);
        if (t.numel() != want[i] || (i < 3 ? t.dim() > 1 : i != 5 && t.dim() != 1)) return py::none();
    }
    const int how = route({x.ptr(), y.ptr(), h_post.ptr(), h_res.ptr(), phi.ptr(), coeffs[0], coeffs[1], coeffs[2],
                           coeffs[3], coeffs[4], coeffs[5]});
    if (how < 0) return py::none();
    if (how == 1) {
        Tensor t[6];
        for (int i = 0; i < 6; i++) t[i] = THPVariable_Unpack(coeffs[i]);
        if (!y.is_none()) {
            const Tensor &post = THPVariable_Unpack(h_post.ptr());
            OptT res = h_res.is_none() ? OptT() : OptT(THPVariable_Unpack(h_res.ptr()));
            variable_list r = MhcWritePreNode::apply(c.x, c.y, post, res, ph, t[0], t[1], t[2], t[3], t[4], t[5], c);
            return py::make_tuple(r[0], r[1], r[2], r[3], r[4]);
        }
        variable_list r = MhcPreNode::apply(c.x, ph, t[0], t[1], t[2], t[3], t[4], t[5], c);
        return py::make_tuple(r[0], r[1], r[2], r[3]);
    }
    for (int i = 0; i < 3; i++) append_floats(THPVariable_Unpack(coeffs[i]), c.a);
    for (int i = 3; i < 6; i++) append_floats(THPVariable_Unpack(coeffs[i]), c.bias);
    mhc_layout(c, ph);
    return mhc_run(c, !y.is_none());
}

// ---------------------------------------------------------------- the widened stream's write
// functional.stream.stream_write, (X', q) = (H_res X + H_post^T y, the sum of squares of each token's X'), checked
// and run here: at a training block's 512 tokens x 4 x 768 its Python (checks, the kernel choice, the host, the
// autograd Function) took 0.2 ms forward and 0.14 ms backward a call beside 0.5 and 0.8 ms of kernel. The kernel gets
// what kernels.cpu.stream gives it (the coefficients as contiguous float32); every backward but the plain one goes to
// StreamWrite.backward (ops.stream.autograd) through the fallback.
struct WriteOut {
    Tensor x2, q;
};

WriteOut stream_write_forward(const Tensor &x, const Tensor &y, const Tensor &h_post, const Tensor &h_res) {
    const int64_t n = x.size(-2), C = x.size(-1), N = x.numel() / (n * C);
    auto lead = x.sizes().slice(0, x.dim() - 2);
    WriteOut o;
    o.x2 = out_like(x);
    o.q = at::empty(lead, x.options().dtype(at::kFloat));
    const Tensor hp = h_post.to(at::kFloat).contiguous(), hr = h_res.to(at::kFloat).contiguous();
    const void *xp = ptr(x), *yp = ptr(y);
    const float *hpp = hp.data_ptr<float>(), *hrp = hr.data_ptr<float>();
    void *out = o.x2.data_ptr();
    float *q = o.q.data_ptr<float>();
    int rc;
    {
        NoGil released;
        rc = k_stream(2, (int)n, code(x), N, C, xp, yp, nullptr, nullptr, out, nullptr, nullptr, hpp, hrp, q, nullptr,
                      nullptr, nullptr, nullptr, nthreads());
    }
    check_stream_rc(rc, "stream");
    return o;
}

struct StreamWriteNode : public torch::autograd::Function<StreamWriteNode> {
    static variable_list forward(AutogradContext *ctx, Tensor x, Tensor y, Tensor h_post, Tensor h_res) {
        ctx->set_materialize_grads(false);
        WriteOut o = stream_write_forward(x, y, h_post, h_res);
        ctx->save_for_backward({x, y, h_post, h_res, o.x2});
        ctx->saved_data["given"] = given({true, true, true, true});
        return {o.x2, o.q};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        variable_list saved = ctx->get_saved_variables();
        Tensor dx2 = grads[0], dq = grads.size() > 1 ? grads[1] : Tensor();
        if (!dx2.defined() && !dq.defined()) return variable_list(4);
        const Tensor x = rows(saved[0]), y = rows(saved[1]);
        if (!dx2.defined() || !kernel_backward(x.scalar_type(), {dx2}) || !kernel_backward(at::kFloat, {dq}))
            return python_backward(STREAM_WRITE, ctx, saved, grads, 4);
        const Tensor &h_post = saved[2], &h_res = saved[3];
        const int64_t n = x.size(-2), C = x.size(-1), N = x.numel() / (n * C);
        dx2 = rows(dx2);
        dq = rows(dq);
        const Tensor x2 = dq.defined() ? rows(saved[4]) : Tensor();
        const Tensor hp = h_post.to(at::kFloat).contiguous(), hr = h_res.to(at::kFloat).contiguous();
        auto f = x.options().dtype(at::kFloat);
        auto lead = x.sizes().slice(0, x.dim() - 1);
        std::vector<int64_t> ps(lead.begin(), lead.end()), rs(lead.begin(), lead.end());
        rs.push_back(n);
        Tensor dx = out_like(x), dy = out_like(y);
        Tensor d_post = at::empty(ps, f), d_res = at::empty(rs, f);
        check_stream_rc(k_stream(3, (int)n, code(x), N, C, ptr(dx2), ptr(y), ptr(x), ptr(x2), dx.data_ptr(),
                                 dy.data_ptr(), nullptr, hp.data_ptr<float>(), hr.data_ptr<float>(), nullptr,
                                 (const float *)ptr(dq), nullptr, d_post.data_ptr<float>(), d_res.data_ptr<float>(),
                                 nthreads()),
                        "stream");
        variable_list out(4);
        if (need(ctx, 0)) out[0] = dx;
        if (need(ctx, 1)) out[1] = dy;
        if (need(ctx, 2)) out[2] = d_post.to(h_post.scalar_type());
        if (need(ctx, 3)) out[3] = d_res.to(h_res.scalar_type());
        return out;
    }
};

// functional.stream.stream_read, h = H_pre X, as the write: the read of hyper-connections' stream (HC's; mHC reads
// with its pre step); every backward but the plain one goes to StreamRead.backward (ops.stream.autograd)
Tensor stream_read_forward(const Tensor &x, const Tensor &h_pre) {
    const int64_t n = x.size(-2), C = x.size(-1), N = x.numel() / (n * C);
    auto lead = x.sizes().slice(0, x.dim() - 2);
    std::vector<int64_t> hs(lead.begin(), lead.end());
    hs.push_back(C);
    Tensor h = out_empty(hs, x.options());
    const Tensor hp = h_pre.to(at::kFloat).contiguous();
    const void *xp = ptr(x);
    const float *hpp = hp.data_ptr<float>();
    void *out = h.data_ptr();
    int rc;
    {
        NoGil released;
        rc = k_stream(0, (int)n, code(x), N, C, xp, nullptr, nullptr, nullptr, out, nullptr, hpp, nullptr, nullptr,
                      nullptr, nullptr, nullptr, nullptr, nullptr, nthreads());
    }
    check_stream_rc(rc, "stream");
    return h;
}

struct StreamReadNode : public torch::autograd::Function<StreamReadNode> {
    static Tensor forward(AutogradContext *ctx, Tensor x, Tensor h_pre) {
        ctx->set_materialize_grads(false);
        ctx->save_for_backward({x, h_pre});
        ctx->saved_data["given"] = given({true, true});
        return stream_read_forward(x, h_pre);
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        variable_list saved = ctx->get_saved_variables();
        Tensor dh = grads[0];
        if (!dh.defined()) return variable_list(2);
        const Tensor x = rows(saved[0]);
        if (!kernel_backward(x.scalar_type(), {dh})) return python_backward(STREAM_READ, ctx, saved, grads, 2);
        const Tensor &h_pre = saved[1];
        const int64_t n = x.size(-2), C = x.size(-1), N = x.numel() / (n * C);
        dh = rows(dh);
        const Tensor hp = h_pre.to(at::kFloat).contiguous();
        auto lead = x.sizes().slice(0, x.dim() - 1);
        Tensor dx = out_like(x), d_pre = at::empty(lead, x.options().dtype(at::kFloat));
        check_stream_rc(k_stream(1, (int)n, code(x), N, C, ptr(x), ptr(dh), nullptr, nullptr, dx.data_ptr(), nullptr,
                                 hp.data_ptr<float>(), nullptr, nullptr, nullptr, nullptr, d_pre.data_ptr<float>(),
                                 nullptr, nullptr, nthreads()),
                        "stream");
        variable_list out(2);
        if (need(ctx, 0)) out[0] = dx;
        if (need(ctx, 1)) out[1] = d_pre.to(h_pre.scalar_type());
        return out;
    }
};

// h of functional.stream.stream_read, or None where the call is not the plain one: x (..., n, C) contiguous in a
// kernel dtype, h_pre (..., n) of any kernel dtype (read as float32)
py::object fast_stream_read(py::handle x, py::handle h_pre) {
    MhcCall c;
    if (!mhc_stream(c, x.ptr(), Py_None, Py_None, Py_None, Py_False) || !small_param(h_pre.ptr())) return py::none();
    const Tensor &hp = THPVariable_Unpack(h_pre.ptr());
    auto lead = c.x.sizes().slice(0, c.x.dim() - 1);
    if (hp.sizes() != lead) return py::none();
    const int how = route({x.ptr(), h_pre.ptr()});
    if (how < 0) return py::none();
    if (how == 0) return py::cast(stream_read_forward(c.x, hp));
    return py::cast(StreamReadNode::apply(c.x, hp));
}

// (X', q) of functional.stream.stream_write, or None where the call is not the plain one (the caller's general
// path takes it, and names what is wrong): x (..., n, C) contiguous in a kernel dtype, y (..., C) in x's dtype,
// h_post (..., n) and h_res (..., n, n) of any kernel dtype (read as float32)
py::object fast_stream_write(py::handle x, py::handle y, py::handle h_post, py::handle h_res) {
    MhcCall c;
    if (y.is_none() || h_res.is_none() || !mhc_stream(c, x.ptr(), y.ptr(), h_post.ptr(), h_res.ptr(), Py_False))
        return py::none();
    const int how = route({x.ptr(), y.ptr(), h_post.ptr(), h_res.ptr()});
    if (how < 0) return py::none();
    const Tensor &post = THPVariable_Unpack(h_post.ptr()), &res = THPVariable_Unpack(h_res.ptr());
    if (how == 0) {
        WriteOut o = stream_write_forward(c.x, c.y, post, res);
        return py::make_tuple(o.x2, o.q);
    }
    variable_list r = StreamWriteNode::apply(c.x, c.y, post, res);
    return py::make_tuple(r[0], r[1]);
}

// (h, H_pre, H_post) or, with y, (X', h, H_pre, H_post) of functional.hyper's hyper_read / hyper_write_read: the
// projection weight (m, nC) with m = 2n (or n: a head), scale (m / n,), base (m,) -- ops.hyper.schema.mhc_args's
// mapping onto mHC's pre step with groups m / n -- or None
py::object fast_hyper_read(py::handle x, py::handle y, py::handle h_post, py::handle h_res, py::handle products,
                           py::handle weight, py::handle scale, py::handle base, py::handle eps, py::handle pre_eps,
                           py::handle post_scale, py::handle post_eps) {
    MhcCall c;
    if (!mhc_stream(c, x.ptr(), y.ptr(), h_post.ptr(), h_res.ptr(), products.ptr()) ||
        !number(eps.ptr(), c.eps) || !(c.eps >= 0) || !number(pre_eps.ptr(), c.pre_eps) ||
        !number(post_scale.ptr(), c.post_scale) || !number(post_eps.ptr(), c.post_eps))
        return py::none();
    if (!small_param(weight.ptr()) || !small_param(scale.ptr()) || !small_param(base.ptr())) return py::none();
    const Tensor &w = THPVariable_Unpack(weight.ptr()), &s = THPVariable_Unpack(scale.ptr()),
                 &b = THPVariable_Unpack(base.ptr());
    int n = c.n;
    if (w.dim() != 2 || w.size(1) != n * c.C || (w.size(0) != n && w.size(0) != 2 * n)) return py::none();
    c.groups = (int)(w.size(0) / n);
    c.m = c.groups * n;
    if (s.numel() != c.groups || b.dim() != 1 || b.numel() != c.m) return py::none();
    if (route({x.ptr(), y.ptr(), h_post.ptr(), h_res.ptr(), weight.ptr(), scale.ptr(), base.ptr()}) != 0)
        return py::none();
    std::vector<float> sv;
    append_floats(s, sv);
    c.a = {sv[0], c.groups == 2 ? sv.back() : 0.0f, 0.0f};
    append_floats(b, c.bias);
    mhc_layout(c, w.t());
    py::tuple r = mhc_run(c, !y.is_none());
    if (y.is_none()) return py::make_tuple(r[0], r[1], r[2]);
    return py::make_tuple(r[0], r[1], r[2], r[3]);
}

// Qwen4-exp's gated read on addnorm_hyper (kernels.cpu.hyper), checked and run here when no gradient is wanted:
// op 0 the stream norm (x, other = its weight: functional.hyper.stream_rms_norm), 2 the write and the norm of its
// result (x, y, h_post, other = the weight: hyper_write_norm), 4 the sigmoid-gated collapse (x, other = the gates'
// logits: sigmoid_gated_collapse). products: the caller's rounding is "products". The normed stream, (X', normed)
// or h; None where the call is not the plain one (the caller's general path takes it).
py::object fast_hyper_gated(int64_t op, py::handle x, py::handle y, py::handle h_post, py::handle other,
                            py::handle eps, py::handle off, bool products) {
    if ((op != 0 && op != 2 && op != 4) || !plain_tensor(x.ptr())) return py::none();
    const Tensor &xt = THPVariable_Unpack(x.ptr());
    auto st = xt.scalar_type();
    if (!kernel_dtype(st) || !xt.is_cpu() || xt.layout() != at::kStrided || !xt.is_contiguous() || xt.dim() < 2 ||
        xt.is_neg() || xt.is_conj() || xt.numel() == 0 || xt.numel() >= max_numel || !stored(xt))
        return py::none();
    int64_t n = xt.size(-2), C = xt.size(-1);
    auto lead = xt.sizes().slice(0, xt.dim() - 2);
    std::vector<int64_t> row(lead.begin(), lead.end());
    Tensor w, yt, post, u;
    double e = 0, o = 0;
    if (op == 4) {  // the logits: X's dtype and shape, contiguous
        if (!plain_tensor(other.ptr())) return py::none();
        u = THPVariable_Unpack(other.ptr());
        if (!like_x(u, st, xt.sizes())) return py::none();
    } else {  // the weight (n, C) or (nC,), any kernel dtype (read as float32); eps >= 0 and the offset finite
        if (!small_param(other.ptr()) || !number(eps.ptr(), e) || !(e >= 0) || !number(off.ptr(), o))
            return py::none();
        w = THPVariable_Unpack(other.ptr());
        if (!(w.dim() == 1 && w.size(0) == n * C) && !(w.dim() == 2 && w.size(0) == n && w.size(1) == C))
            return py::none();
    }
    if (op == 2) {  // y (..., C) in X's dtype, contiguous; h_post (..., n) of a kernel dtype (read as float32)
        if (!plain_tensor(y.ptr()) || !small_param(h_post.ptr())) return py::none();
        yt = THPVariable_Unpack(y.ptr());
        post = THPVariable_Unpack(h_post.ptr());
        std::vector<int64_t> ys = row, ps = row;
        ys.push_back(C);
        ps.push_back(n);
        if (!like_x(yt, st, ys) || post.sizes() != at::IntArrayRef(ps)) return py::none();
        // each product H_post[i] y rounded where the formulas round it: to its own dtype, X's only when H_post is no
        // wider than y (ops.hyper.schema.write_products)
        products = products && at::promote_types(post.scalar_type(), st) == st;
    } else if (!y.is_none() || !h_post.is_none()) {
        return py::none();
    }
    if (route({x.ptr(), op == 2 ? y.ptr() : Py_None, op == 2 ? h_post.ptr() : Py_None, other.ptr()}) != 0)
        return py::none();
    Tensor wf = w.defined() ? w.to(at::kFloat).contiguous() : Tensor();
    Tensor pf = post.defined() ? post.to(at::kFloat).contiguous() : Tensor();
    Tensor out, x2;
    if (op == 4) {
        row.push_back(C);
        out = at::empty(row, xt.options());
    } else {
        out = at::empty_like(xt, at::MemoryFormat::Contiguous);
        if (op == 2) x2 = at::empty_like(xt, at::MemoryFormat::Contiguous);
    }
    int64_t N = xt.numel() / (n * C);
    const void *xp = ptr(xt), *yp = ptr(yt), *up = ptr(u);
    const float *wp = (const float *)ptr(wf), *pp = (const float *)ptr(pf);
    int rc;
    {
        NoGil released;
        rc = k_hyper((int)op, (int)n, code(xt), N, C, products ? 1 : 0, xp, yp, up, wp, (float)o, (float)e, pp,
                     out.data_ptr(), mptr(x2), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nthreads());
    }
    check_stream_rc(rc, "hyper");
    if (op == 2) return py::make_tuple(x2, out);
    return py::cast(out);
}

void init(uintptr_t forward, uintptr_t backward, uintptr_t fused_forward, uintptr_t fused_backward,
          uintptr_t pointwise_forward, uintptr_t pointwise_backward, uintptr_t mhc, uintptr_t hyper,
          uintptr_t stream, py::object python_fallback, int64_t max_fast_numel, py::object pool,
          int64_t pool_min) {
    max_numel = max_fast_numel;
    if (pool_empty == nullptr) pool_empty = new py::object();
    *pool_empty = std::move(pool);
    pool_min_bytes = pool_min;
    k_mhc = (mhc_t)mhc;
    k_stream = (stream_t)stream;
    k_hyper = (hyper_t)hyper;
    k_pointwise_forward = (pwf_t)pointwise_forward;
    k_pointwise_backward = (pwb_t)pointwise_backward;
    k_forward = (fwd_t)forward;
    k_backward = (bwd_t)backward;
    k_fused_forward = (ffwd_t)fused_forward;
    k_fused_backward = (fbwd_t)fused_backward;
    if (fallback == nullptr) fallback = new py::object();
    *fallback = std::move(python_fallback);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "addnorm's eager fast-path autograd nodes (C++), calling the C kernels of _addnorm_cpu";
    m.def("init", &init);
    m.def("add_norm", &add_norm);
    m.def("add_norm_inference", &add_norm_inference);
    m.def("fast_add_norm", &fast_add_norm);
    m.def("fast_norm_add", &fast_norm_add);
    m.def("fast_parallel", &fast_parallel);
    m.def("fast_pointwise", &fast_pointwise);
    m.def("norm_add_inference", &norm_add_inference);
    m.def("parallel_inference", &parallel_inference);
    m.def("norm_add", &norm_add);
    m.def("parallel", &parallel);
    m.def("fast_mhc", &fast_mhc);
    m.def("fast_stream_write", &fast_stream_write);
    m.def("fast_stream_read", &fast_stream_read);
    m.def("fast_hyper_read", &fast_hyper_read);
    m.def("fast_hyper_gated", &fast_hyper_gated);
    m.attr("torch_version") = TORCH_VERSION;
    m.attr("abi") = 12;  // nodes.ABI: raised with every change to the functions above
}
