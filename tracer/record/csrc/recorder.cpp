// gradscape native recorder: the Python module (see recorder.h for what it records and how).
#include "recorder.h"
#include "summaries.h"
#include "budget.h"
#include "walk.h"
#include "readout.h"
#include "backward_call.h"
#include "param_grads.h"
#include "light.h"
#include "light_types.h"

namespace {

// ---------------------------------------------------------------------------------------------------
// The Python type

PyObject* rec_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyRecorder* self = reinterpret_cast<PyRecorder*>(type->tp_alloc(type, 0));
  if (self != nullptr) self->rec = new Recorder();
  return reinterpret_cast<PyObject*>(self);
}

void rec_dealloc(PyObject* obj) {
  PyRecorder* self = reinterpret_cast<PyRecorder*>(obj);
  if (self->rec != nullptr) {
    Recorder* r = self->rec;
    r->release();
    for (PyObject* o : r->py) Py_DECREF(o);
    for (PyObject* o : r->chunks) Py_DECREF(o);
    Py_XDECREF(r->fallback);
    Py_XDECREF(r->past_budget);
    delete r;
    self->rec = nullptr;
  }
  Py_TYPE(obj)->tp_free(obj);
}

// configure(fallback, thumb, budget=-1, past_budget=None): what summarises a gradient the kernel cannot, the
// thumbnail size, the thumbnail cells the step keeps (-1: no limit) and what orders them (NOTE [Budget while
// recording] in budget.h; without it, nothing is left out while recording)
PyObject* rec_configure(PyObject* self, PyObject* args) {
  PyObject* fb;
  int thumb;
  long long budget = -1;
  PyObject* past = Py_None;
  if (!PyArg_ParseTuple(args, "Oi|LO", &fb, &thumb, &budget, &past)) return nullptr;
  Recorder* r = R(self);
  Py_XDECREF(r->fallback);
  Py_INCREF(fb);
  r->fallback = fb;
  Py_XDECREF(r->past_budget);
  r->past_budget = nullptr;
  if (past != Py_None) {
    Py_INCREF(past);
    r->past_budget = past;
  }
  r->thumb = thumb;
  r->budget = budget < 0 ? -1 : static_cast<int64_t>(budget);
  Py_RETURN_NONE;
}

// set_thumb(thumb): the thumbnail size from the next gradient summarised on (the step's plans for the old size are
// forgotten; the process's plans are keyed by the size)
PyObject* rec_set_thumb(PyObject* self, PyObject* arg) {
  long thumb = PyLong_AsLong(arg);
  if (thumb == -1 && PyErr_Occurred()) return nullptr;
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  if (r->thumb != static_cast<int32_t>(thumb)) {
    r->thumb = static_cast<int32_t>(thumb);
    r->step_plans.clear();
  }
  Py_RETURN_NONE;
}

PyObject* rec_id_of(PyObject* self, PyObject* obj) {
  NodePtr n;
  if (!node_of(obj, &n)) return PyLong_FromLong(-1);
  return PyLong_FromLong(R(self)->ids.find(n.get()));
}

PyObject* rec_node(PyObject* self, PyObject* arg) {
  long i = PyLong_AsLong(arg);
  Recorder* r = R(self);
  if (i < 0 || i >= static_cast<long>(r->nodes.size()) || !r->nodes[i]) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "node: no such node (or released)");
    return nullptr;
  }
  return torch::autograd::functionToPyObject(r->nodes[i]);
}

PyObject* rec_begin_pass(PyObject* self, PyObject* arg) {
  long p = PyLong_AsLong(arg);
  if (p == -1 && PyErr_Occurred()) return nullptr;
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  r->pass = static_cast<int32_t>(p);
  r->pass_t0 = now_ns();
  return PyLong_FromSize_t(r->runs.size());
}

// set_sum(node, slot, sum index): that slot's gradients are added up into module sum `sum index`
PyObject* rec_set_sum(PyObject* self, PyObject* args) {
  int node, slot, sum;
  if (!PyArg_ParseTuple(args, "iii", &node, &slot, &sum)) return nullptr;
  Recorder* r = R(self);
  if (node < 0 || node >= static_cast<int>(r->sum_of.size()) || sum < 0) {
    PyErr_SetString(PyExc_IndexError, "set_sum: no such node");
    return nullptr;
  }
  r->sum_of[node].emplace_back(slot, sum);
  if (static_cast<int>(r->sums.size()) <= sum) r->sums.resize(sum + 1);
  Py_RETURN_NONE;
}

// summarise(tensors) -> [summary index, or -1 where none was made]: each tensor summarised as a hook summarises
// a gradient, into the step's summaries (the gradients an optimizer stepped with: NOTE [Parameter gradients] in
// tracer/record/params.py)
PyObject* rec_summarise(PyObject* self, PyObject* arg) {
  PyObject* seq = PySequence_Fast(arg, "summarise: expected a sequence of tensors");
  if (seq == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  std::vector<at::Tensor> ts;
  ts.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* o = PySequence_Fast_GET_ITEM(seq, i);
    if (!THPVariable_Check(o)) {
      PyErr_Format(PyExc_TypeError, "summarise: item %zd is a %s, not a tensor", i, Py_TYPE(o)->tp_name);
      Py_DECREF(seq);
      return nullptr;
    }
    ts.push_back(THPVariable_Unpack(o));
  }
  Py_DECREF(seq);
  std::vector<int32_t> out = R(self)->summarise_each(ts);
  PyObject* res = PyList_New(n);
  if (res == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(res, i, PyLong_FromLong(out[static_cast<size_t>(i)]));
  return res;
}

PyObject* rec_remove_hooks(PyObject* self, PyObject*) {
  R(self)->remove_hooks();
  Py_RETURN_NONE;
}

PyObject* rec_release(PyObject* self, PyObject*) {
  R(self)->release();
  R(self)->drop_records();
  Py_RETURN_NONE;
}

PyObject* rec_len(PyObject* self, PyObject*) { return PyLong_FromSize_t(R(self)->name.size()); }

PyMethodDef rec_methods[] = {
    {"configure", rec_configure, METH_VARARGS, "configure(fallback, thumb, budget=-1, past_budget=None)"},
    {"set_thumb", rec_set_thumb, METH_O, "set_thumb(thumb): the thumbnail size from the next summary on"},
    {"start_call", rec_start_call, METH_VARARGS,
     "start_call(roots, seq0, names) -> (root ids, first new id, kinds, new AccumulateGrad nodes, call structure)"},
    {"id_of", rec_id_of, METH_O, "id_of(grad_fn) -> its id, or -1"},
    {"node", rec_node, METH_O, "node(id) -> the grad_fn object"},
    {"begin_pass", rec_begin_pass, METH_O, "begin_pass(index) -> runs recorded so far"},
    {"set_sum", rec_set_sum, METH_VARARGS, "set_sum(node, slot, sum)"},
    {"graph", rec_graph, METH_O, "graph(first) -> the nodes' structure, as bytes"},
    {"records", rec_records, METH_NOARGS, "records() -> what the hooks recorded"},
    {"structure", rec_structure, METH_NOARGS, "structure() -> the walked graph's structure, as bytes"},
    {"first_slots", rec_first_slots, METH_O, "first_slots(name codes) -> [(node, sent row, came row)]"},
    {"tables", rec_tables, METH_NOARGS, "tables() -> the runs by node and the raw statistics"},
    {"sums", rec_sums, METH_NOARGS, "sums() -> the module sums"},
    {"arrival_norms", rec_arrival_norms, METH_O, "arrival_norms(runs) -> [norm] or None"},
    {"resolve_params", rec_resolve_params, METH_VARARGS, "resolve_params(traces, replaced, unmade[, held])"},
    {"summarise", rec_summarise, METH_O, "summarise(tensors) -> [summary index, or -1]"},
    {"row_norms", rec_row_norms, METH_O, "row_norms(rows) -> [L2 norm, or None where Python summarised]"},
    {"root_rows", rec_root_rows, METH_O, "root_rows([(node, nr, pass, first run)]) -> [row or None]"},
    {"end_call", rec_end_call, METH_O, "end_call(first run) -> (runs, [(node, run, grad, arrived, version, variable)])"},
    {"remove_hooks", rec_remove_hooks, METH_NOARGS, "take every hook off"},
    {"release", rec_release, METH_NOARGS, "remove the hooks, let go of the graph and of what was recorded (read by now)"},
    {"size", rec_len, METH_NOARGS, "size() -> nodes walked"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject RecorderType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// setup(planner, kernel addresses (4 ints, then gs_summarise_strided's or 0), view node names): once per process
PyObject* mod_setup(PyObject*, PyObject* args) {
  PyObject* planner;
  PyObject* views;
  unsigned long long k[5];
  if (!PyArg_ParseTuple(args, "O(KKKKK)O", &planner, &k[0], &k[1], &k[2], &k[3], &k[4], &views)) return nullptr;
  PyObject* seq = PySequence_Fast(views, "setup: the view node names must be a sequence of str");
  if (seq == nullptr) return nullptr;
  std::vector<std::string> names;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
    const char* nm = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
    if (nm == nullptr) {
      Py_DECREF(seq);
      return nullptr;
    }
    names.emplace_back(nm);
  }
  Py_DECREF(seq);
  std::lock_guard<std::mutex> g(g_mu);
  g_view_names = names;
  for (size_t c = 0; c < g_names.size(); c++) {
    g_is_view[c] = std::find(names.begin(), names.end(), g_names[c]) != names.end();
  }
  Py_XDECREF(g_planner);
  Py_INCREF(planner);
  g_planner = planner;
  for (int i = 0; i < 4; i++) g_kernels[i] = reinterpret_cast<Kernel>(static_cast<uintptr_t>(k[i]));
  g_strided = reinterpret_cast<StridedKernel>(static_cast<uintptr_t>(k[4]));
  g_plans.clear();
  Py_RETURN_NONE;
}

PyObject* mod_scalar_code(PyObject*, PyObject* obj) {
  if (!THPVariable_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "scalar_code: expected a tensor");
    return nullptr;
  }
  return PyLong_FromLong(static_cast<long>(THPVariable_Unpack(obj).scalar_type()));
}

PyObject* mod_names(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> g(g_mu);
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(g_names.size()));
  for (size_t i = 0; i < g_names.size(); i++) PyList_SET_ITEM(out, i, PyUnicode_FromString(g_names[i].c_str()));
  return out;
}

PyObject* mod_name_count(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> g(g_mu);
  return PyLong_FromSize_t(g_names.size());
}

PyObject* mod_code(PyObject*, PyObject* arg) {
  const char* s = PyUnicode_AsUTF8(arg);
  if (s == nullptr) return nullptr;
  std::lock_guard<std::mutex> g(g_mu);
  return PyLong_FromLong(code_of_name(s));
}

// norms(tensors, most) -> [the L2 norm of each], or None: the monitor's norms of small CPU gradients in one call
// (NOTE [Native norms] in tracer/monitor/grad_norms.py), from the summary kernel's statistics without a thumbnail:
// the sum of squares in float64; NaN where a tensor holds a NaN, inf where it holds an Inf and no NaN, as torch's
// norm gives them. None where one is not a dense CPU tensor of float32, bfloat16, float16 or float64 (its elements
// one block from its first, in any order: a transposed or channels-last gradient is read as it lies), where they
// hold more than `most` elements together, or where the kernel could not (a float32 partial sum overflowed).
PyObject* mod_norms(PyObject*, PyObject* args) {
  PyObject* arg;
  long long most;
  if (!PyArg_ParseTuple(args, "OL", &arg, &most)) return nullptr;
  PyObject* seq = PySequence_Fast(arg, "norms: expected a sequence of tensors");
  if (seq == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  std::vector<const at::Tensor*> ts;
  long long total = 0;
  for (Py_ssize_t i = 0; i < n; i++) {  // every one taken, and not too many elements, before any is read
    PyObject* o = PySequence_Fast_GET_ITEM(seq, i);
    const at::Tensor* t = THPVariable_Check(o) ? &THPVariable_Unpack(o) : nullptr;
    // (a tensor subclass that dispatches to Python, a DTensor, first: its sizes and strides may be Python's)
    int k = t != nullptr && t->defined() && !t->unsafeGetTensorImpl()->is_python_dispatch() && !t->is_nested()
                ? dtype_code(t->scalar_type()) : -1;
    if (k < 0 || g_kernels[k] == nullptr || !t->device().is_cpu() || t->layout() != c10::kStrided ||
        !t->has_storage() || !t->is_non_overlapping_and_dense() || (total += t->numel()) > most) {
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
    ts.push_back(t);
  }
  std::vector<double> norms;
  for (const at::Tensor* t : ts) {
    int64_t g[7] = {t->numel(), 0, 0, 0, 1, 1, 1};  // (no planes: no thumbnail)
    double a[8];
    if (g_kernels[dtype_code(t->scalar_type())](t->const_data_ptr(), g, a) != 0) break;
    norms.push_back(torch_norm(a));
  }
  Py_DECREF(seq);  // (the tensors were the sequence's items: read by now)
  if (norms.size() != ts.size()) Py_RETURN_NONE;
  PyObject* out = PyList_New(n);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(out, i, PyFloat_FromDouble(norms[static_cast<size_t>(i)]));
  return out;
}

// grads(tensors) -> ([position], [grad]) of those of `tensors` whose `.grad` is set, in order, or None where one is not
// a plain tensor (a subclass's `.grad` may be its own): the monitor's read of the parameters' gradients after a
// backward call, in one call (`set_grads` in tracer/monitor/grad_norms.py)
PyObject* mod_grads(PyObject*, PyObject* arg) {
  PyObject* seq = PySequence_Fast(arg, "grads: expected a sequence of tensors");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject* idx = PyList_New(0);
  PyObject* grads = PyList_New(0);
  for (Py_ssize_t i = 0; idx != nullptr && grads != nullptr && i < n; i++) {
    PyObject* o = PySequence_Fast_GET_ITEM(seq, i);
    if (!THPVariable_CheckExact(o)) {  // (a Tensor or a Parameter)
      Py_DECREF(seq);
      Py_DECREF(idx);
      Py_DECREF(grads);
      Py_RETURN_NONE;
    }
    const at::Tensor& g = THPVariable_Unpack(o).grad();
    if (!g.defined()) continue;
    PyObject* k = PyLong_FromSsize_t(i);
    PyObject* t = THPVariable_Wrap(g);
    if (k == nullptr || t == nullptr || PyList_Append(idx, k) < 0 || PyList_Append(grads, t) < 0) {
      Py_XDECREF(k);
      Py_XDECREF(t);
      Py_DECREF(seq);
      Py_DECREF(idx);
      Py_DECREF(grads);
      return nullptr;
    }
    Py_DECREF(k);
    Py_DECREF(t);
  }
  Py_DECREF(seq);
  if (idx == nullptr || grads == nullptr) {
    Py_XDECREF(idx);
    Py_XDECREF(grads);
    return nullptr;
  }
  return Py_BuildValue("(NN)", idx, grads);
}

PyMethodDef mod_methods[] = {
    {"setup", mod_setup, METH_VARARGS, "setup(planner, (k_f32, k_bf16, k_f16, k_f64), view names)"},
    {"scalar_code", mod_scalar_code, METH_O, "scalar_code(tensor) -> its dtype's code, as `graph` gives them"},
    {"names", mod_names, METH_NOARGS, "names() -> every node name seen, by code"},
    {"name_count", mod_name_count, METH_NOARGS, "name_count() -> how many node names have codes"},
    {"code", mod_code, METH_O, "code(name) -> its code"},
    {"grads", mod_grads, METH_O, "grads(tensors) -> ([position], [grad]) of those whose .grad is set, or None"},
    {"after_call", mod_after_call, METH_VARARGS, "after_call(entries, params, traces, pending, plain)"},
    {"unchanged_runs", mod_unchanged_runs, METH_VARARGS, "unchanged_runs(entries, grads) -> [run] or None"},
    {"made", mod_made, METH_VARARGS, "made(entries, grads) -> [summary or None]"},
    {"note_made", mod_note_made, METH_VARARGS, "note_made(made_of, names, grads, summaries)"},
    {"group_norms", mod_group_norms, METH_VARARGS, "group_norms(values, groups, n) -> [norm or None]"},
    {"stepped", mod_stepped, METH_VARARGS, "stepped(param_groups, index) -> ([index], [grad]) or None"},
    {"norms", mod_norms, METH_VARARGS, "norms(tensors, most) -> [L2 norm of each], or None (a tensor it does not take)"},
    {"backward_front", mod_backward_front, METH_VARARGS,
     "backward_front(python wrapper, original, captures, handling, reads) -> a backward function's front (light.h)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_recorder", "gradscape's native step recorder", -1, mod_methods};

}  // namespace

PyMODINIT_FUNC PyInit__recorder(void) {
  RecorderType.tp_name = "gradscape._recorder.Recorder";
  RecorderType.tp_basicsize = sizeof(PyRecorder);
  RecorderType.tp_flags = Py_TPFLAGS_DEFAULT;
  RecorderType.tp_new = rec_new;
  RecorderType.tp_dealloc = rec_dealloc;
  RecorderType.tp_methods = rec_methods;
  if (PyType_Ready(&RecorderType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&RecorderType);
  PyModule_AddObject(m, "Recorder", reinterpret_cast<PyObject*>(&RecorderType));
  PyModule_AddStringConstant(m, "TORCH_VERSION", GS_TORCH_VERSION);
  PyModule_AddIntConstant(m, "RUN_BYTES", sizeof(RunRec));
  PyModule_AddIntConstant(m, "SUMM_BYTES", sizeof(Summ));
  if (light_ready(m) < 0) return nullptr;
  return m;
}
