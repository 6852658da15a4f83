// gradscape native recorder: a backward call's start and end, as one Python call each (see recorder.h).
//
// NOTE [A backward call's ends in one call]
//     As a backward call starts, the recorder walks the graph from its roots, hooks the nodes it adds, names the
//     parameters among them and keys the call (NOTE [Carried forwards] in tracer/record/carry.py); as it ends, it
//     reads what each parameter's AccumulateGrad node took in, and whether `.grad` is still that very gradient
//     (NOTE [Parameter gradients] in tracer/record/params.py). Made of the extension's small calls (a walk per
//     root, the hooks, the AccumulateGrad variables, the kinds, the call's structure; the runs, then one check per
//     parameter) and Python loops over their lists, with each parameter's `.grad` and version read in Python,
//     that was several percent of the Python a small traced step runs (docs/costs.md, "Counted, not timed"), in a
//     step where every Python call costs several times its warm time (NOTE [Cold steps] in
//     tracer/record/native.py).
//     `start_call` and `end_call` do it in one call each and hand back what Python keeps: at the start, the
//     roots' ids, the kinds and the call's structure, with each new AccumulateGrad node's parameter name (looked
//     up in the model index's dict by the variable's Python object's id, as `ModelIndex.param_of` does) and
//     shape written into the graph's dicts;
//     at the end, each AccumulateGrad node that ran, with its last run, its variable's `.grad` and that
//     gradient's version, and whether it is what arrived.
#pragma once
#include <array>
#include "readout.h"
#include "recorder.h"

namespace {

// The node a Python grad_fn object stands for (a C++ node's wrapper, or a custom Function's context)
bool node_of(PyObject* obj, NodePtr* out) {
  if (torch::autograd::THPCppFunction_Check(obj)) {
    *out = reinterpret_cast<torch::autograd::THPCppFunction*>(obj)->cdata;
    return true;
  }
  if (THPFunction_Check(obj)) {
    *out = gs_shim::function_node(reinterpret_cast<THPFunction*>(obj));
    return static_cast<bool>(*out);
  }
  return false;
}

// The structure of the nodes from `first` on, as `structure` gives the whole graph's (their first id, count, slot
// offsets and slots, each node's name code and kind), and each one's creation number counted from `seq0` (int64;
// -1 for an AccumulateGrad node, whose creation number is the all-ones maximum): what a backward call's key is
// made of (NOTE [Carried forwards] in tracer/record/carry.py)
std::string call_structure(const Recorder* r, size_t first, uint64_t seq0) {
  const size_t n = r->name.size();
  first = std::min(first, n);
  const size_t c0 = static_cast<size_t>(r->child_off[first]), c1 = r->child_id.size();
  int64_t counts[4] = {static_cast<int64_t>(first), static_cast<int64_t>(n), static_cast<int64_t>(c0),
                       static_cast<int64_t>(c1)};
  std::string out(reinterpret_cast<const char*>(counts), sizeof(counts));
  auto add = [&out](const void* p, size_t bytes) { out.append(static_cast<const char*>(p), bytes); };
  add(r->name.data() + first, 4 * (n - first));
  add(r->kind.data() + first, n - first);
  add(r->child_off.data() + first, 4 * (n - first + 1));
  add(r->child_id.data() + c0, 4 * (c1 - c0));
  add(r->child_nr.data() + c0, 4 * (c1 - c0));
  for (size_t i = first; i < n; i++) {
    const uint64_t s = r->seq[i];
    const int64_t rel = s == std::numeric_limits<uint64_t>::max() ? -1 : static_cast<int64_t>(s - seq0);
    add(&rel, sizeof(rel));
  }
  return out;
}

// The AccumulateGrad nodes from `first` on whose variable is defined, into the graph's dicts (`NativeGraph`): each
// one's shape into `shapes` (id -> shape), and its parameter's name into `params` (id -> name), looked up by the
// id of the variable's Python object in `by_id`, else by the object in `unsharded` (FSDP2's copies: NOTE
// [Unsharded parameters] in tracer/record/model_index.py), or its shape into `leaves` for any other leaf; and to
// `call_key`, each one's id with its parameter's name (UTF-8, then a zero byte) or its shape, for the call's key.
// Returns the greatest id named, or -1; -2 with a Python error set.
long fill_accs(const Recorder* r, size_t first, PyObject* by_id, PyObject* unsharded, PyObject* shapes,
               PyObject* params, PyObject* leaves, std::string* call_key) {
  long last = -1;
  for (size_t i = first; i < r->nodes.size(); i++) {
    if (r->kind[i] != KIND_ACC || !r->nodes[i]) continue;
    auto* acc = static_cast<torch::autograd::AccumulateGrad*>(r->nodes[i].get());  // by its name (kind_of)
    if (!acc->variable.defined()) continue;
    PyObject* var = THPVariable_Wrap(acc->variable);
    PyObject* key = var == nullptr ? nullptr : PyLong_FromVoidPtr(var);
    PyObject* id = PyLong_FromSize_t(i);
    const auto sizes = acc->variable.sizes();
    PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
    for (size_t d = 0; shape != nullptr && d < sizes.size(); d++) {
      PyTuple_SET_ITEM(shape, static_cast<Py_ssize_t>(d), PyLong_FromLongLong(sizes[d]));
    }
    bool ok = key != nullptr && id != nullptr && shape != nullptr && PyDict_SetItem(shapes, id, shape) == 0;
    PyObject* name = ok ? PyDict_GetItemWithError(by_id, key) : nullptr;  // (borrowed)
    if (ok && name == nullptr && !PyErr_Occurred() && PyDict_GET_SIZE(unsharded) > 0) {
      name = PyDict_GetItemWithError(unsharded, var);
    }
    ok = ok && !PyErr_Occurred();
    const int64_t at = static_cast<int64_t>(i);
    call_key->append(reinterpret_cast<const char*>(&at), sizeof(at));
    if (ok && name != nullptr) {
      ok = PyDict_SetItem(params, id, name) == 0;
      last = static_cast<long>(i);
      Py_ssize_t len = 0;
      const char* utf8 = ok ? PyUnicode_AsUTF8AndSize(name, &len) : nullptr;
      ok = utf8 != nullptr;
      if (ok) call_key->append(utf8, static_cast<size_t>(len) + 1);  // (its zero byte too)
    } else if (ok) {
      ok = PyDict_SetItem(leaves, id, shape) == 0;
      const int64_t ndim = -1 - static_cast<int64_t>(sizes.size());  // (negative: no name's first byte)
      call_key->append(reinterpret_cast<const char*>(&ndim), sizeof(ndim));
      call_key->append(reinterpret_cast<const char*>(sizes.data()), sizeof(int64_t) * sizes.size());
    }
    Py_XDECREF(var);
    Py_XDECREF(key);
    Py_XDECREF(id);
    Py_XDECREF(shape);
    if (!ok) return -2;
  }
  return last;
}

// start_call(roots, seq0, (by_id, unsharded, shapes, params, leaves)) -> (root ids, kinds bytes, the greatest
// parameter node id this call added or -1, the call's key bytes: its nodes' structure, and its AccumulateGrad
// nodes' parameters and leaves' shapes): NOTE [A backward call's ends in one call]
PyObject* rec_start_call(PyObject* self, PyObject* args) {
  PyObject* roots;
  unsigned long long seq0;
  PyObject *by_id, *unsharded, *shapes, *params, *leaves;
  if (!PyArg_ParseTuple(args, "OK(O!O!O!O!O!)", &roots, &seq0, &PyDict_Type, &by_id, &PyDict_Type, &unsharded,
                        &PyDict_Type, &shapes, &PyDict_Type, &params, &PyDict_Type, &leaves)) {
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(roots, "start_call: expected a sequence of graph nodes (grad_fn)");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  std::vector<NodePtr> nodes(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* obj = PySequence_Fast_GET_ITEM(seq, i);
    if (!node_of(obj, &nodes[static_cast<size_t>(i)])) {
      PyErr_Format(PyExc_TypeError, "start_call: root %zd is a %s, not a graph node (grad_fn)", i,
                   Py_TYPE(obj)->tp_name);
      Py_DECREF(seq);
      return nullptr;
    }
  }
  Py_DECREF(seq);
  Recorder* r = R(self);
  const size_t first = r->nodes.size();
  std::vector<int32_t> ids(static_cast<size_t>(n));
  try {
    for (size_t i = 0; i < ids.size(); i++) ids[i] = r->walk_from(nodes[i]);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  r->install(static_cast<int32_t>(first));
  std::string key = call_structure(r, first, seq0);
  const long last = fill_accs(r, first, by_id, unsharded, shapes, params, leaves, &key);
  if (last == -2) return nullptr;
  PyObject* id_list = PyList_New(n);
  if (id_list == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(id_list, i, PyLong_FromLong(ids[static_cast<size_t>(i)]));
  return Py_BuildValue("(NNlN)", id_list, bytes_of(r->kind.data(), r->kind.size()), last,
                       bytes_of(key.data(), key.size()));
}

// A tensor's version (-1 for one without a version counter: an inference tensor)
long long version_of(const at::Tensor& t) { return t.is_inference() ? -1 : static_cast<long long>(t._version()); }

// end_call(first run) -> (runs recorded, [(node, run, grad or None, arrived, version, variable)]): each AccumulateGrad
// node that ran from run `first run` on, in the order its first run there came, with its last run, the `.grad` its
// variable holds now, whether that is the very gradient that arrived then (its address and layout), that
// gradient's version, and the variable: NOTE [A backward call's ends in one call]
PyObject* rec_end_call(PyObject* self, PyObject* arg) {
  long first = PyLong_AsLong(arg);
  if (first == -1 && PyErr_Occurred()) return nullptr;
  Recorder* r = R(self);
  struct Last {
    int32_t node, run;
    bool arrived;  // a gradient arrived in that run (`came`: its address and layout)
    std::pair<const void*, uint64_t> came;
  };
  std::vector<Last> last;  // in the order of the nodes' first runs
  size_t count = 0;
  {
    std::lock_guard<std::mutex> g(r->mu);
    count = r->runs.size();
    std::unordered_map<int32_t, size_t> at;
    for (size_t i = first < 0 ? 0 : static_cast<size_t>(first); i < count; i++) {
      if (r->runs[i].gi_n != -1) continue;  // (not an AccumulateGrad run)
      auto [it, fresh] = at.emplace(r->runs[i].node, last.size());
      if (fresh) last.push_back({r->runs[i].node, static_cast<int32_t>(i), false, {}});
      else last[it->second].run = static_cast<int32_t>(i);
    }
    for (auto& l : last) {
      auto it = r->arrival.find(l.run);
      if (it != r->arrival.end()) {
        l.arrived = true;
        l.came = it->second;
      }
    }
  }
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (const auto& l : last) {
    if (l.node < 0 || static_cast<size_t>(l.node) >= r->nodes.size() || !r->nodes[l.node]) continue;
    const auto& var = static_cast<torch::autograd::AccumulateGrad*>(r->nodes[l.node].get())->variable;
    if (!var.defined()) continue;
    const at::Tensor& grad = var.grad();
    const bool defined = grad.defined();
    const bool same = defined && l.arrived && grad.layout() == c10::kStrided &&
                      l.came.first == grad.const_data_ptr() && l.came.second == layout_of(grad);
    PyObject* item = Py_BuildValue("(iiNOLN)", l.node, l.run, THPVariable_Wrap(grad), same ? Py_True : Py_False,
                                   defined ? version_of(grad) : -1LL, THPVariable_Wrap(var));
    if (item == nullptr || PyList_Append(out, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return Py_BuildValue("(nN)", static_cast<Py_ssize_t>(count), out);
}

// root_rows([(node, output nr, pass, first run)]) -> [row or None]: for each backward call's root, the summary row of
// the gradient its node's first run in that call (from run `first run` on) got in output slot `output nr` (None: the
// node did not run in the call, has no such slot, or its gradient was not summarised): `BackwardPass.root_grads`
PyObject* rec_root_rows(PyObject* self, PyObject* arg) {
  PyObject* seq = PySequence_Fast(arg, "root_rows: expected a sequence of (node, nr, pass, first run)");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  std::vector<std::array<long, 4>> specs(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* t = PySequence_Fast_GET_ITEM(seq, i);
    auto& s = specs[static_cast<size_t>(i)];
    if (!PyArg_ParseTuple(t, "llll", &s[0], &s[1], &s[2], &s[3])) {
      Py_DECREF(seq);
      return nullptr;
    }
  }
  Py_DECREF(seq);
  std::vector<int32_t> rows(specs.size(), -1);
  {
    Recorder* r = R(self);
    std::lock_guard<std::mutex> g(r->mu);
    for (size_t k = 0; k < specs.size(); k++) {
      const auto& [node, nr, pass, first] = specs[k];
      for (size_t i = first < 0 ? 0 : static_cast<size_t>(first); i < r->runs.size(); i++) {
        const RunRec& run = r->runs[i];
        if (run.node != node || run.pass != pass) continue;
        if (nr >= 0 && nr < run.go_n && static_cast<size_t>(run.go_off + nr) < r->slots.size())
          rows[k] = r->slots[static_cast<size_t>(run.go_off + nr)];
        break;
      }
    }
  }
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(rows.size()));
  if (out == nullptr) return nullptr;
  for (size_t k = 0; k < rows.size(); k++)
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(k), rows[k] < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(rows[k]));
  return out;
}

}  // namespace
