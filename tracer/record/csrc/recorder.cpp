// gradscape native recorder: the Python module (see recorder.h for what it records and how).
#include "recorder.h"
#include "summaries.h"
#include "walk.h"

namespace {

// ---------------------------------------------------------------------------------------------------
// The Python type

struct PyRecorder {
  PyObject_HEAD Recorder* rec;
};

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
    delete r;
    self->rec = nullptr;
  }
  Py_TYPE(obj)->tp_free(obj);
}

Recorder* R(PyObject* self) { return reinterpret_cast<PyRecorder*>(self)->rec; }

bool node_of(PyObject* obj, NodePtr* out) {
  if (torch::autograd::THPCppFunction_Check(obj)) {
    *out = reinterpret_cast<torch::autograd::THPCppFunction*>(obj)->cdata;
    return true;
  }
  if (THPFunction_Check(obj)) {
    *out = reinterpret_cast<THPFunction*>(obj)->cdata;
    return static_cast<bool>(*out);
  }
  return false;
}

// configure(fallback, thumb): what summarises a gradient the kernel cannot, and the thumbnail size
PyObject* rec_configure(PyObject* self, PyObject* args) {
  PyObject* fb;
  int thumb;
  if (!PyArg_ParseTuple(args, "Oi", &fb, &thumb)) return nullptr;
  Recorder* r = R(self);
  Py_XDECREF(r->fallback);
  Py_INCREF(fb);
  r->fallback = fb;
  r->thumb = thumb;
  Py_RETURN_NONE;
}

PyObject* rec_walk(PyObject* self, PyObject* obj) {
  NodePtr root;
  if (!node_of(obj, &root)) {
    PyErr_Format(PyExc_TypeError, "walk: expected a graph node (grad_fn), got %s", Py_TYPE(obj)->tp_name);
    return nullptr;
  }
  try {
    return PyLong_FromLong(R(self)->walk_from(root));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* rec_id_of(PyObject* self, PyObject* obj) {
  NodePtr n;
  if (!node_of(obj, &n)) return PyLong_FromLong(-1);
  auto it = R(self)->ids.find(n.get());
  return PyLong_FromLong(it == R(self)->ids.end() ? -1 : it->second);
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

PyObject* rec_install(PyObject* self, PyObject* arg) {
  long first = PyLong_AsLong(arg);
  if (first == -1 && PyErr_Occurred()) return nullptr;
  R(self)->install(static_cast<int32_t>(first));
  Py_RETURN_NONE;
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

PyObject* bytes_of(const void* p, size_t n) {
  return PyBytes_FromStringAndSize(static_cast<const char*>(p), static_cast<Py_ssize_t>(n));
}

// graph(first) -> (name codes int32, kinds int8, seq uint64, child_off int32, child_id int32, child_nr int32)
// of the nodes from `first` on (child_off relative to the first of them)
PyObject* rec_graph(PyObject* self, PyObject* arg) {
  long first = PyLong_AsLong(arg);
  if (first == -1 && PyErr_Occurred()) return nullptr;
  Recorder* r = R(self);
  size_t n = r->name.size();
  if (first < 0 || static_cast<size_t>(first) > n) {
    PyErr_SetString(PyExc_IndexError, "graph: bad first node");
    return nullptr;
  }
  size_t c0 = r->child_off[first], c1 = r->child_off[n];
  std::vector<int32_t> off(r->child_off.begin() + first, r->child_off.end());
  for (auto& o : off) o -= static_cast<int32_t>(c0);
  size_t o0 = r->in_off[first], o1 = r->in_off[n];
  std::vector<int32_t> ooff(r->in_off.begin() + first, r->in_off.end());
  for (auto& o : ooff) o -= static_cast<int32_t>(o0);
  size_t d0 = 0, d1 = 0;  // the dims of outputs [o0, o1)
  for (size_t i = 0; i < o0; i++) d0 += r->out_ndim[i] > 0 ? r->out_ndim[i] : 0;
  d1 = d0;
  for (size_t i = o0; i < o1; i++) d1 += r->out_ndim[i] > 0 ? r->out_ndim[i] : 0;
  return Py_BuildValue("(NNNNNNNNNN)", bytes_of(r->name.data() + first, 4 * (n - first)),
                       bytes_of(r->kind.data() + first, n - first), bytes_of(r->seq.data() + first, 8 * (n - first)),
                       bytes_of(off.data(), 4 * off.size()), bytes_of(r->child_id.data() + c0, 4 * (c1 - c0)),
                       bytes_of(r->child_nr.data() + c0, 4 * (c1 - c0)), bytes_of(ooff.data(), 4 * ooff.size()),
                       bytes_of(r->out_ndim.data() + o0, 4 * (o1 - o0)),
                       bytes_of(r->out_dtype.data() + o0, o1 - o0), bytes_of(r->out_dims.data() + d0, 8 * (d1 - d0)));
}

// structure() -> bytes: the node and slot counts, then every node's name code, kind and slot offsets, and every
// slot's child and input number, as walked (what a graph's structure hash is made of)
PyObject* rec_structure(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  int64_t counts[2] = {static_cast<int64_t>(r->name.size()), static_cast<int64_t>(r->child_id.size())};
  std::string out(reinterpret_cast<const char*>(counts), sizeof(counts));
  auto add = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  add(r->name.data(), 4 * r->name.size());
  add(r->kind.data(), r->kind.size());
  add(r->child_off.data(), 4 * r->child_off.size());
  add(r->child_id.data(), 4 * r->child_id.size());
  add(r->child_nr.data(), 4 * r->child_nr.size());
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

// rel_seq(seq0) -> int64 bytes: each node's creation number counted from `seq0`; -1 for an AccumulateGrad node
// (whose creation number is the all-ones maximum)
PyObject* rec_rel_seq(PyObject* self, PyObject* arg) {
  unsigned long long seq0 = PyLong_AsUnsignedLongLong(arg);
  if (seq0 == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  Recorder* r = R(self);
  std::vector<int64_t> rel(r->seq.size());
  for (size_t i = 0; i < rel.size(); i++) {
    uint64_t s = r->seq[i];
    rel[i] = s == std::numeric_limits<uint64_t>::max() ? -1 : static_cast<int64_t>(s - seq0);
  }
  return bytes_of(rel.data(), 8 * rel.size());
}

// acc_variables(first) -> [(id, tensor)] of the AccumulateGrad nodes from `first` on
PyObject* rec_acc_variables(PyObject* self, PyObject* arg) {
  long first = PyLong_AsLong(arg);
  if (first == -1 && PyErr_Occurred()) return nullptr;
  Recorder* r = R(self);
  PyObject* out = PyList_New(0);
  for (size_t i = first; i < r->nodes.size(); i++) {
    if (r->kind[i] != KIND_ACC || !r->nodes[i]) continue;
    auto* acc = static_cast<torch::autograd::AccumulateGrad*>(r->nodes[i].get());  // by its name (kind_of)
    PyObject* t = acc == nullptr ? (Py_INCREF(Py_None), Py_None) : THPVariable_Wrap(acc->variable);
    PyObject* item = Py_BuildValue("(lN)", static_cast<long>(i), t);
    PyList_Append(out, item);
    Py_DECREF(item);
  }
  return out;
}

// records() -> (runs bytes, slots bytes, summaries bytes, chunks list, python summaries list, failures)
PyObject* rec_records(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  PyObject* chunks = PyList_New(static_cast<Py_ssize_t>(r->chunks.size()));
  for (size_t i = 0; i < r->chunks.size(); i++) {
    Py_INCREF(r->chunks[i]);
    PyList_SET_ITEM(chunks, i, r->chunks[i]);
  }
  PyObject* py = PyList_New(static_cast<Py_ssize_t>(r->py.size()));
  for (size_t i = 0; i < r->py.size(); i++) {
    Py_INCREF(r->py[i]);
    PyList_SET_ITEM(py, i, r->py[i]);
  }
  return Py_BuildValue("(NNNNNL)", bytes_of(r->runs.data(), sizeof(RunRec) * r->runs.size()),
                       bytes_of(r->slots.data(), 4 * r->slots.size()),
                       bytes_of(r->summs.data(), sizeof(Summ) * r->summs.size()), chunks, py,
                       static_cast<long long>(r->failures));
}

// tables() -> (run rows, run starts, run ks, raw statistics), bytes: the runs' positions by node in the order they
// ran (int64), where each node's begin (int64, one more than the nodes), each run's index among its node's runs
// (int64), and the kernel's 8 raw statistics of every summary (float64; NaN for Python's): NOTE [Step tables]
PyObject* rec_tables(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  size_t n = r->name.size(), m = r->runs.size();
  std::vector<int64_t> start(n + 1, 0), rows(m), k(m);
  for (const auto& run : r->runs) {
    if (run.node < 0 || static_cast<size_t>(run.node) >= n) {
      PyErr_SetString(PyExc_RuntimeError, "tables(): a run of a node that was not walked");
      return nullptr;
    }
    start[run.node + 1]++;
  }
  for (size_t i = 0; i < n; i++) start[i + 1] += start[i];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (size_t i = 0; i < m; i++) {
    int32_t node = r->runs[i].node;
    k[i] = fill[node] - start[node];
    rows[fill[node]++] = static_cast<int64_t>(i);
  }
  std::vector<double> raw(8 * r->summs.size(), std::numeric_limits<double>::quiet_NaN());
  for (size_t i = 0; i < r->summs.size(); i++) {
    const Summ& s = r->summs[i];
    if (s.plan < 0 || s.chunk < 0 || static_cast<size_t>(s.chunk) >= r->chunks.size()) continue;
    const double* arena = reinterpret_cast<const double*>(PyByteArray_AS_STRING(r->chunks[s.chunk]));
    std::memcpy(raw.data() + 8 * i, arena + s.off, 8 * sizeof(double));
  }
  return Py_BuildValue("(NNNN)", bytes_of(rows.data(), 8 * m), bytes_of(start.data(), 8 * (n + 1)),
                       bytes_of(k.data(), 8 * m), bytes_of(raw.data(), 8 * raw.size()));
}

// sums() -> [tensor or None] the module sums added up in the hooks
PyObject* rec_sums(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(r->sums.size()));
  for (size_t i = 0; i < r->sums.size(); i++) {
    PyObject* t = r->sums[i].defined() ? THPVariable_Wrap(r->sums[i]) : (Py_INCREF(Py_None), Py_None);
    PyList_SET_ITEM(out, i, t);
  }
  return out;
}

// acc_runs(first run) -> [(node id, run)] of the AccumulateGrad runs from `first` on, in the order they ran
PyObject* rec_acc_runs(PyObject* self, PyObject* arg) {
  long first = PyLong_AsLong(arg);
  if (first == -1 && PyErr_Occurred()) return nullptr;
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  PyObject* out = PyList_New(0);
  for (size_t i = first < 0 ? 0 : static_cast<size_t>(first); i < r->runs.size(); i++) {
    if (r->runs[i].gi_n != -1) continue;
    PyObject* item = Py_BuildValue("(ii)", r->runs[i].node, static_cast<int>(i));
    PyList_Append(out, item);
    Py_DECREF(item);
  }
  return out;
}

// arrival_is(run index, tensor) -> True when `tensor` is the very gradient that arrived at that
// AccumulateGrad run (its address and layout): `.grad` is then what the arrival's summary shows
PyObject* rec_arrival_is(PyObject* self, PyObject* args) {
  int run;
  PyObject* obj;
  if (!PyArg_ParseTuple(args, "iO", &run, &obj)) return nullptr;
  if (!THPVariable_Check(obj)) Py_RETURN_FALSE;
  const at::Tensor& t = THPVariable_Unpack(obj);
  Recorder* r = R(self);
  auto it = r->arrival.find(run);
  if (it == r->arrival.end() || !t.defined() || t.layout() != c10::kStrided) Py_RETURN_FALSE;
  if (it->second.first == t.const_data_ptr() && it->second.second == layout_of(t)) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyObject* rec_remove_hooks(PyObject* self, PyObject*) {
  R(self)->remove_hooks();
  Py_RETURN_NONE;
}

PyObject* rec_release(PyObject* self, PyObject*) {
  R(self)->release();
  Py_RETURN_NONE;
}

PyObject* rec_len(PyObject* self, PyObject*) { return PyLong_FromSize_t(R(self)->name.size()); }

PyObject* rec_run_count(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  return PyLong_FromSize_t(r->runs.size());
}

PyMethodDef rec_methods[] = {
    {"configure", rec_configure, METH_VARARGS, "configure(fallback, view name flags, keep values)"},
    {"walk", rec_walk, METH_O, "walk(grad_fn) -> the root's id; new nodes get the next ids"},
    {"id_of", rec_id_of, METH_O, "id_of(grad_fn) -> its id, or -1"},
    {"node", rec_node, METH_O, "node(id) -> the grad_fn object"},
    {"install", rec_install, METH_O, "install(first): a hook on each node from `first` on"},
    {"begin_pass", rec_begin_pass, METH_O, "begin_pass(index) -> runs recorded so far"},
    {"set_sum", rec_set_sum, METH_VARARGS, "set_sum(node, slot, sum)"},
    {"graph", rec_graph, METH_O, "graph(first) -> the nodes' structure, as bytes"},
    {"acc_variables", rec_acc_variables, METH_O, "acc_variables(first) -> [(id, tensor)]"},
    {"records", rec_records, METH_NOARGS, "records() -> what the hooks recorded"},
    {"structure", rec_structure, METH_NOARGS, "structure() -> the walked graph's structure, as bytes"},
    {"rel_seq", rec_rel_seq, METH_O, "rel_seq(seq0) -> creation numbers from seq0, int64 bytes"},
    {"tables", rec_tables, METH_NOARGS, "tables() -> the runs by node and the raw statistics"},
    {"sums", rec_sums, METH_NOARGS, "sums() -> the module sums"},
    {"arrival_is", rec_arrival_is, METH_VARARGS, "arrival_is(run, tensor) -> bool"},
    {"acc_runs", rec_acc_runs, METH_O, "acc_runs(first) -> [(node, run)] of the AccumulateGrad runs"},
    {"remove_hooks", rec_remove_hooks, METH_NOARGS, "take every hook off"},
    {"release", rec_release, METH_NOARGS, "remove the hooks and let go of the graph"},
    {"size", rec_len, METH_NOARGS, "size() -> nodes walked"},
    {"run_count", rec_run_count, METH_NOARGS, "run_count() -> runs recorded"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject RecorderType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// setup(planner, kernel addresses (4 ints), view node names): once per process
PyObject* mod_setup(PyObject*, PyObject* args) {
  PyObject* planner;
  PyObject* views;
  unsigned long long k[4];
  if (!PyArg_ParseTuple(args, "O(KKKK)O", &planner, &k[0], &k[1], &k[2], &k[3], &views)) return nullptr;
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

PyObject* mod_code(PyObject*, PyObject* arg) {
  const char* s = PyUnicode_AsUTF8(arg);
  if (s == nullptr) return nullptr;
  std::lock_guard<std::mutex> g(g_mu);
  return PyLong_FromLong(code_of_name(s));
}

PyMethodDef mod_methods[] = {
    {"setup", mod_setup, METH_VARARGS, "setup(planner, (k_f32, k_bf16, k_f16, k_f64), view names)"},
    {"scalar_code", mod_scalar_code, METH_O, "scalar_code(tensor) -> its dtype's code, as `graph` gives them"},
    {"names", mod_names, METH_NOARGS, "names() -> every node name seen, by code"},
    {"code", mod_code, METH_O, "code(name) -> its code"},
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
  return m;
}
