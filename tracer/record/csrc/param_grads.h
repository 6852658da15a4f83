// gradscape native recorder: the per-parameter rules of `st.params`, applied to every parameter of a backward
// call's end or an optimizer's step in one call.
//
// NOTE [Parameter rules in one call]
//     tracer/record/params.py keeps, for each parameter of a traced step, what `st.params` will hold (NOTE
//     [Parameter gradients] there) and what was summarised of which tensor (NOTE [Summarised once]); the
//     monitor reads what an optimizer stepped with (tracer/monitor/stepped.py). Each of those rules is a few
//     comparisons for one parameter, run for every parameter at every backward call's end and optimizer step:
//     written as Python loops they were most of what a traced step's Python grows by with the parameters
//     (docs/costs.md, "Counted, not timed"). The functions here apply the same rules to the same Python dicts
//     and tuples, in one call for all the parameters; the dicts stay Python's, owned where they were:
//     - `after_call`: a backward call's end (`ParamGradients.after_pass`, the rules of its general loop);
//     - `unchanged_runs`: whether each `.grad` is still the arrival its entry holds (`arrivals_unchanged`);
//     - `made` and `note_made`: the summaries made of which tensors, at which version (`made`, `note_made`);
//     - `stepped`: an optimizer's parameters that have a gradient, and those gradients (`stepped_grads`);
//     - `resolve_params`: the rows of the arrivals and of what `settle` summarised at the step's end, or their norms
//       where an optimizer's step replaces them (`ParamGradients.resolve`), and `arrival_norms`, the monitor's norms
//       read from the arrivals (arrival_norms.py);
//     - `group_norms`: the problem finder's layer norms from its parameters' (`_norms_of_layers`).
//     An arrival entry is a tuple (run, weak reference to the `.grad`, its version); a made entry is a tuple
//     (weak reference, version, summary). Anything that is not what these expect (a tensor subclass, a
//     parameter the monitor has not indexed) makes the function answer None, and the caller's Python, which
//     handles every case, runs instead.
#pragma once
#include "backward_call.h"

namespace {

// The object a weak reference points at (borrowed; Py_None once it is gone)
PyObject* referent(PyObject* ref) {
  return PyWeakref_Check(ref) ? PyWeakref_GET_OBJECT(ref) : Py_None;
}

// `o`'s version when it is a tensor with a version counter, else -1
long long version_of_object(PyObject* o) { return THPVariable_Check(o) ? version_of(THPVariable_Unpack(o)) : -1; }

// d[key] = (a, b) or (a, b, c), stealing the new references `a`... (null: an error is set)
bool set_tuple(PyObject* d, PyObject* key, PyObject* t) {
  if (t == nullptr) return false;
  const int rc = PyDict_SetItem(d, key, t);
  Py_DECREF(t);
  return rc == 0;
}

// Whether a parameter has a post-accumulate-grad hook (its `_post_accumulate_grad_hooks` is set); -1 on an error
int has_post_hooks(PyObject* var) {
  PyObject* hooks = PyObject_GetAttrString(var, "_post_accumulate_grad_hooks");
  if (hooks == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    return 0;
  }
  const int out = hooks != Py_None;
  Py_DECREF(hooks);
  return out;
}

// One entry of `end_call` ((node, run, grad or None, arrived, version, variable)) for parameter `name`
bool after_one(PyObject* name, PyObject* e, PyObject* traces, PyObject* pending, bool plain) {
  PyObject *run = PyTuple_GET_ITEM(e, 1), *grad = PyTuple_GET_ITEM(e, 2), *version = PyTuple_GET_ITEM(e, 4);
  if (grad == Py_None) return true;
  PyObject* held = PyDict_GetItemWithError(pending, name);
  if (held == nullptr && PyErr_Occurred()) return false;
  if (held != nullptr && PyTuple_Check(held) && PyTuple_GET_SIZE(held) == 2 && PyTuple_GET_ITEM(held, 0) == grad) {
    // the very `.grad` a call before left, added to in place (gradient accumulation): as of this call's version
    return set_tuple(pending, name, PyTuple_Pack(2, grad, version));
  }
  if (held != nullptr && PyDict_DelItem(pending, name) < 0) return false;
  if (PyTuple_GET_ITEM(e, 3) == Py_True && plain) {
    const int hooked = has_post_hooks(PyTuple_GET_ITEM(e, 5));
    if (hooked < 0) return false;
    if (!hooked) {  // the arrival itself: its summary, once the step's tables are made
      PyObject* ref = PyWeakref_NewRef(grad, nullptr);
      if (ref == nullptr) return false;
      PyObject* t = PyTuple_Pack(3, run, ref, version);
      Py_DECREF(ref);
      return set_tuple(traces, name, t);
    }
  }
  if (PyDict_SetItem(traces, name, Py_None) < 0) return false;  // kept until the step's end (`settle`)
  return set_tuple(pending, name, PyTuple_Pack(2, grad, version));
}

// after_call(entries, params, traces, pending, plain): `ParamGradients.after_pass`'s rules for every entry of
// `end_call` whose node `params` (node -> name) names; the last entry of a name where two nodes have one
PyObject* mod_after_call(PyObject*, PyObject* args) {
  PyObject *entries, *params, *traces, *pending;
  int plain = 0;
  if (!PyArg_ParseTuple(args, "O!O!O!O!p", &PyList_Type, &entries, &PyDict_Type, &params, &PyDict_Type, &traces,
                        &PyDict_Type, &pending, &plain))
    return nullptr;
  PyObject* by_name = PyDict_New();
  if (by_name == nullptr) return nullptr;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(entries); i++) {
    PyObject* e = PyList_GET_ITEM(entries, i);
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 6) {
      PyErr_SetString(PyExc_TypeError, "after_call: each entry must be end_call's 6-tuple");
      ok = false;
      break;
    }
    PyObject* name = PyDict_GetItemWithError(params, PyTuple_GET_ITEM(e, 0));
    if (name == nullptr) {
      ok = !PyErr_Occurred();
      continue;
    }
    ok = PyDict_SetItem(by_name, name, e) == 0;
  }
  PyObject *name, *e;
  for (Py_ssize_t pos = 0; ok && PyDict_Next(by_name, &pos, &name, &e);)
    ok = after_one(name, e, traces, pending, plain != 0);
  Py_DECREF(by_name);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// unchanged_runs(entries, grads) -> [run] or None: each entry (`st.params` to be, as `traces` holds it) an arrival
// whose tensor is still `grads[k]` at the same version; None unless every one is
PyObject* mod_unchanged_runs(PyObject*, PyObject* args) {
  PyObject *entries, *grads;
  if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &entries, &PyList_Type, &grads)) return nullptr;
  const Py_ssize_t n = PyList_GET_SIZE(entries);
  if (PyList_GET_SIZE(grads) != n) Py_RETURN_NONE;
  for (Py_ssize_t k = 0; k < n; k++) {
    PyObject *t = PyList_GET_ITEM(entries, k), *g = PyList_GET_ITEM(grads, k);
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3 || referent(PyTuple_GET_ITEM(t, 1)) != g) Py_RETURN_NONE;
    const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
    if (v == -1 && PyErr_Occurred()) return nullptr;
    if (v < 0 || version_of_object(g) != v) Py_RETURN_NONE;
  }
  PyObject* out = PyList_New(n);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < n; k++) {
    PyObject* run = PyTuple_GET_ITEM(PyList_GET_ITEM(entries, k), 0);
    Py_INCREF(run);
    PyList_SET_ITEM(out, k, run);
  }
  return out;
}

// made(entries, grads) -> [summary or None]: each entry (None, or (weak reference, version, summary)) the summary
// of `grads[k]` itself, unchanged since (the same tensor, the same version, one it has)
PyObject* mod_made(PyObject*, PyObject* args) {
  PyObject *entries, *grads;
  if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &entries, &PyList_Type, &grads)) return nullptr;
  const Py_ssize_t n = std::min(PyList_GET_SIZE(entries), PyList_GET_SIZE(grads));
  PyObject* out = PyList_New(n);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < n; k++) {
    PyObject *t = PyList_GET_ITEM(entries, k), *g = PyList_GET_ITEM(grads, k), *got = Py_None;
    if (PyTuple_CheckExact(t) && PyTuple_GET_SIZE(t) == 3 && referent(PyTuple_GET_ITEM(t, 0)) == g) {
      const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
      if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(out);
        return nullptr;
      }
      if (v >= 0 && version_of_object(g) == v) got = PyTuple_GET_ITEM(t, 2);
    }
    Py_INCREF(got);
    PyList_SET_ITEM(out, k, got);
  }
  return out;
}

// note_made(made_of, names, grads, summaries): made_of[names[k]] = (weak reference to grads[k], its version now,
// summaries[k]); any sequences of the same length
PyObject* mod_note_made(PyObject*, PyObject* args) {
  PyObject *made_of, *names_in, *grads_in, *sums_in;
  if (!PyArg_ParseTuple(args, "O!OOO", &PyDict_Type, &made_of, &names_in, &grads_in, &sums_in)) return nullptr;
  PyObject* names = PySequence_Fast(names_in, "note_made: names must be a sequence");
  PyObject* grads = names == nullptr ? nullptr : PySequence_Fast(grads_in, "note_made: grads must be a sequence");
  PyObject* sums = grads == nullptr ? nullptr : PySequence_Fast(sums_in, "note_made: summaries must be a sequence");
  bool ok = sums != nullptr;
  const Py_ssize_t n = ok ? PySequence_Fast_GET_SIZE(names) : 0;
  if (ok && (PySequence_Fast_GET_SIZE(grads) != n || PySequence_Fast_GET_SIZE(sums) != n)) {
    PyErr_SetString(PyExc_ValueError, "note_made: names, grads and summaries differ in length");
    ok = false;
  }
  for (Py_ssize_t k = 0; ok && k < n; k++) {
    PyObject* g = PySequence_Fast_GET_ITEM(grads, k);
    PyObject* ref = PyWeakref_NewRef(g, nullptr);
    ok = ref != nullptr && set_tuple(made_of, PySequence_Fast_GET_ITEM(names, k),
                                     Py_BuildValue("(NLO)", ref, version_of_object(g), PySequence_Fast_GET_ITEM(sums, k)));
  }
  Py_XDECREF(names);
  Py_XDECREF(grads);
  Py_XDECREF(sums);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// stepped(param_groups, index) -> ([index], [grad]) of an optimizer's parameters that have a gradient, in its order
// (`index`: id of a parameter -> the monitor's index of it); None where one is not a plain tensor or not indexed
PyObject* mod_stepped(PyObject*, PyObject* args) {
  PyObject *groups, *index;
  if (!PyArg_ParseTuple(args, "OO!", &groups, &PyDict_Type, &index)) return nullptr;
  PyObject* seq = PySequence_Fast(groups, "stepped: expected the optimizer's param_groups");
  if (seq == nullptr) return nullptr;
  PyObject *idx = PyList_New(0), *grads = PyList_New(0), *result = nullptr;
  bool ok = idx != nullptr && grads != nullptr, none = false;
  for (Py_ssize_t gi = 0; ok && !none && gi < PySequence_Fast_GET_SIZE(seq); gi++) {
    PyObject* group = PySequence_Fast_GET_ITEM(seq, gi);
    PyObject* ps = PyDict_Check(group) ? PyDict_GetItemString(group, "params") : nullptr;
    if (ps == nullptr || !PyList_Check(ps)) {
      none = true;
      break;
    }
    for (Py_ssize_t k = 0; ok && !none && k < PyList_GET_SIZE(ps); k++) {
      PyObject* p = PyList_GET_ITEM(ps, k);
      if (!THPVariable_CheckExact(p)) {
        none = true;
        break;
      }
      const at::Tensor& g = THPVariable_Unpack(p).grad();
      if (!g.defined()) continue;
      PyObject* key = PyLong_FromVoidPtr(p);
      PyObject* i = key == nullptr ? nullptr : PyDict_GetItemWithError(index, key);
      Py_XDECREF(key);
      if (i == nullptr) {
        ok = !PyErr_Occurred();
        none = true;
        break;
      }
      PyObject* t = THPVariable_Wrap(g);
      ok = t != nullptr && PyList_Append(idx, i) == 0 && PyList_Append(grads, t) == 0;
      Py_XDECREF(t);
    }
  }
  Py_DECREF(seq);
  if (ok && !none) result = Py_BuildValue("(OO)", idx, grads);
  else if (ok) result = Py_NewRef(Py_None);
  Py_XDECREF(idx);
  Py_XDECREF(grads);
  return result;
}

// What is read of each entry of a step's `traces` that `resolve_params` resolves: an arrival (a (run, reference,
// version) tuple: `arrival_stats` of its run) or a row `settle` made (an int: `kernel_stats` of it), read under the
// recorder's lock once, Python's objects touched outside it
struct EntryRead {
  PyObject* name;  // borrowed from `traces`
  long at;  // the arrival's run, or the row
  bool arrival;
  int32_t row = -1;
  bool kernel = false, nonfinite = false;  // the kernel made its summary; it counted a NaN or an Inf
  double norm = 0.0;  // its finite elements' norm
};

bool read_entries(Recorder* r, PyObject* traces, std::vector<EntryRead>* out) {
  PyObject *name, *v;
  for (Py_ssize_t at = 0; PyDict_Next(traces, &at, &name, &v);) {
    const bool arrival = PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) == 3;
    if (!arrival && !PyLong_CheckExact(v)) continue;
    const long k = PyLong_AsLong(arrival ? PyTuple_GET_ITEM(v, 0) : v);
    if (k == -1 && PyErr_Occurred()) return false;
    out->push_back({name, k, arrival});
  }
  std::lock_guard<std::mutex> g(r->mu);
  for (auto& e : *out) {
    const double* s = e.arrival ? arrival_stats(r, e.at, &e.row) : kernel_stats(r, e.row = static_cast<int32_t>(e.at));
    if (s == nullptr) continue;
    e.kernel = true;
    e.nonfinite = s[5] > 0 || s[6] > 0;
    e.norm = finite_norm(s);
  }
  return true;
}

// resolve_params(traces, replaced, unmade[, held]) -> (resolved, [name]): `ParamGradients.resolve`'s rule for each
// arrival and each row `settle` made in `traces`: left out where no summary was made of it; where the kernel made it
// and `replaced` holds its name, its (norm, counted a NaN or an Inf) put in `unmade` and left out; else its row, its
// name listed, and where the kernel made it, its (norm, counted a NaN or an Inf) put in `held` (when given: the
// problem finder reads them without a `TensorTrace` made). `resolved` is `traces` so, in its order, with every other
// entry as it was.
PyObject* rec_resolve_params(PyObject* self, PyObject* args) {
  PyObject *traces, *replaced, *unmade, *held = nullptr;
  if (!PyArg_ParseTuple(args, "O!OO!|O!", &PyDict_Type, &traces, &replaced, &PyDict_Type, &unmade, &PyDict_Type,
                        &held))
    return nullptr;
  std::vector<EntryRead> reads;
  if (!read_entries(R(self), traces, &reads)) return nullptr;
  PyObject* resolved = PyDict_New();
  PyObject* kept = PyList_New(0);
  bool ok = resolved != nullptr && kept != nullptr;
  size_t k = 0;  // the next of `reads`, met in the same order
  PyObject *name, *v;
  for (Py_ssize_t at = 0; ok && PyDict_Next(traces, &at, &name, &v);) {
    if (k >= reads.size() || reads[k].name != name) {
      ok = PyDict_SetItem(resolved, name, v) == 0;
      continue;
    }
    const EntryRead& e = reads[k++];
    if (e.row < 0) continue;  // no summary was made of it: the parameter is left out, as on the Python path
    if (e.kernel) {
      const int in = PySequence_Contains(replaced, name);
      if (in < 0) ok = false;
      if (in != 0) {  // replaced by what an optimizer stepped with: its numbers only, for the problem finder
        ok = ok && set_tuple(unmade, name, Py_BuildValue("(dO)", e.norm, e.nonfinite ? Py_True : Py_False));
        continue;
      }
    }
    PyObject* row = PyLong_FromLong(e.row);
    ok = row != nullptr && PyDict_SetItem(resolved, name, row) == 0 && PyList_Append(kept, name) == 0;
    Py_XDECREF(row);
    if (ok && e.kernel && held != nullptr)
      ok = set_tuple(held, name, Py_BuildValue("(dO)", e.norm, e.nonfinite ? Py_True : Py_False));
  }
  if (!ok) {
    Py_XDECREF(resolved);
    Py_XDECREF(kept);
    return nullptr;
  }
  return Py_BuildValue("(NN)", resolved, kept);
}

// arrival_norms(runs) -> [norm] of what arrived in each run (its finite elements'), or None unless the kernel
// summarised every one and none counted a NaN or an Inf (the monitor's norms after a backward: NOTE [Norms after a
// backward from the arrivals] in tracer/monitor/arrival_norms.py)
PyObject* rec_arrival_norms(PyObject* self, PyObject* arg) {
  std::vector<long> positions;
  if (!read_longs(arg, "arrival_norms: expected a sequence of run positions", &positions)) return nullptr;
  Recorder* r = R(self);
  std::vector<double> norms;
  norms.reserve(positions.size());
  {
    std::lock_guard<std::mutex> g(r->mu);
    for (long pos : positions) {
      int32_t row = -1;
      const double* a = arrival_stats(r, pos, &row);
      if (a == nullptr || a[5] > 0 || a[6] > 0) Py_RETURN_NONE;
      norms.push_back(finite_norm(a));
    }
  }
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(norms.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < norms.size(); i++) PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), PyFloat_FromDouble(norms[i]));
  return out;
}

// group_norms(values, groups, n) -> [norm or None] of n groups: each group's sqrt of the sum of its values' squares,
// in order, over those values (None, or (norm, counted a NaN or an Inf)) that are a finite norm of a finite
// gradient; None for a group with none (the problem finder's layer norms: `_norms_of_layers` in
// tracer/record/debug/step_checks.py)
PyObject* mod_group_norms(PyObject*, PyObject* args) {
  PyObject *values_in, *groups_in;
  Py_ssize_t n = 0;
  if (!PyArg_ParseTuple(args, "OOn", &values_in, &groups_in, &n)) return nullptr;
  std::vector<long> groups;
  if (!read_longs(groups_in, "group_norms: expected a sequence of group indices", &groups)) return nullptr;
  PyObject* values = PySequence_Fast(values_in, "group_norms: expected a sequence of values");
  if (values == nullptr) return nullptr;
  std::vector<double> sq(static_cast<size_t>(std::max<Py_ssize_t>(n, 0)), 0.0);
  std::vector<char> seen(sq.size(), 0);
  bool ok = static_cast<size_t>(PySequence_Fast_GET_SIZE(values)) == groups.size();
  if (!ok) PyErr_SetString(PyExc_ValueError, "group_norms: values and groups differ in length");
  for (size_t k = 0; ok && k < groups.size(); k++) {
    PyObject* v = PySequence_Fast_GET_ITEM(values, static_cast<Py_ssize_t>(k));
    if (v == Py_None) continue;
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2 || groups[k] < 0 || groups[k] >= n) {
      PyErr_SetString(PyExc_ValueError, "group_norms: a value must be None or (norm, nonfinite), in a group below n");
      ok = false;
      break;
    }
    const double x = PyFloat_AsDouble(PyTuple_GET_ITEM(v, 0));
    const int bad = PyObject_IsTrue(PyTuple_GET_ITEM(v, 1));
    if ((x == -1.0 && PyErr_Occurred()) || bad < 0) ok = false;
    else if (x == x && x != HUGE_VAL && !bad) {  // a finite norm of a finite gradient
      sq[static_cast<size_t>(groups[k])] += x * x;
      seen[static_cast<size_t>(groups[k])] = 1;
    }
  }
  Py_DECREF(values);
  if (!ok) return nullptr;
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(sq.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < sq.size(); i++) {
    PyObject* item = seen[i] ? PyFloat_FromDouble(std::sqrt(sq[i])) : Py_NewRef(Py_None);
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), item);
  }
  return out;
}

}  // namespace
