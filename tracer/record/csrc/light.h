#pragma once
// gradscape: the native light step of the every-step monitor (NOTE [Native light steps] in
// tracer/monitor/light_native.py): a block (`LightBlock`, a context manager) that reads each loss of
// `loss.backward()` from C++ (`backward_front`, put in place of `Tensor.backward` in front of its Python
// wrapper) and keeps the step's row, with the quiet bounds of NOTE [Quiet bound] in
// tracer/monitor/light_rows.py, calling into Python only for a batch of rows and for what it cannot read.
// Its Python types are in light_types.h.
//
// Threads. Every function here runs with the GIL held (a Python call, or `Tensor.backward` itself); the open
// block is this thread's (`tl_open`), and the Python state it shares with tracer/record/patched_calls.py
// (`_captures`, `_handling`) is changed only under the GIL, as the Python side changes it.
#include <Python.h>
#include <pythread.h>

#include <ATen/PythonTorchFunctionTLS.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

struct PyLight {
  PyObject_HEAD
  PyObject* side;       // the block's Python side (a LightStep): what a Python wrapper hands a call it cannot read
  PyObject* captures;   // patched_calls._captures: thread id -> the captures open on it, innermost last
  PyObject* handling;   // patched_calls._handling: the threads a wrapped call of which is being handled
  PyObject* owner;      // the Tracer, while the block is open
  PyObject* tid;        // this thread's id, while open
  PyObject* caps;       // this thread's list in `captures`, while open
  PyObject* groups;     // the parameter groups whose learning rates a row holds (a list of dicts)
  int64_t step;
  bool slow;     // the Python side has this step (a loss or call the block could not read)
  bool timed;    // this step's time is kept for the sampler (NOTE [Sampled norms] in sampling.py)
  bool loud;     // the last row kept was not under its quiet bounds
  int64_t batch; // rows that join the history together
  int64_t flush_ns, since_ns, t0_ns, own_ns;
  // the fast path (`fast_open`): light steps the monitor allowed without asking it again, those taken, the
  // sampler's count of steps when it allowed them, one step in `timed_every` timed, the Tracer's `every`
  int64_t fast, fast_taken, fast_steps, timed_every, every;
  std::vector<double>* losses;  // this step's, read so far
  std::vector<int64_t>* row_step;
  std::vector<int64_t>* row_cut;  // each row's end in `row_val`: its losses, then its learning rates
  std::vector<int64_t>* row_nloss;
  std::vector<double>* row_val;
  std::vector<double>* pivots;
  std::vector<std::vector<double>>* ladders;
  std::vector<int64_t>* below;
  std::vector<double>* samples;  // (block seconds, own seconds) of each timed step since the last take
};

thread_local PyLight* tl_open = nullptr;
PyObject* g_active = nullptr;  // "_active"
PyObject* g_lr = nullptr;      // "lr"

int64_t light_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------ the rows and their quiet bounds
// LightRows.add's rule: true when the batch should join now (`loud` when because of this row)
bool light_add(PyLight* b, const std::vector<double>& lr) {
  b->row_step->push_back(b->step);
  b->row_nloss->push_back(static_cast<int64_t>(b->losses->size()));
  b->row_val->insert(b->row_val->end(), b->losses->begin(), b->losses->end());
  b->row_val->insert(b->row_val->end(), lr.begin(), lr.end());
  b->row_cut->push_back(static_cast<int64_t>(b->row_val->size()));
  const double neg = -std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < b->losses->size(); k++) {
    double v = (*b->losses)[k];
    if (k >= b->ladders->size()) return b->loud = true;
    int64_t c = (*b->below)[k];
    const std::vector<double>& ladder = (*b->ladders)[k];
    if (c >= static_cast<int64_t>(ladder.size()) || !(neg < v && v <= ladder[c])) return b->loud = true;
    if (v < (*b->pivots)[k]) (*b->below)[k] = c + 1;
  }
  return static_cast<int64_t>(b->row_step->size()) >= b->batch;
}

// The learning rates of `groups` as floats; false when one is not a float (the Python side reads them then)
bool light_rates(PyLight* b, std::vector<double>& out) {
  if (b->groups == nullptr) return false;
  Py_ssize_t n = PyList_GET_SIZE(b->groups);
  out.reserve(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* g = PyList_GET_ITEM(b->groups, i);
    PyObject* v = PyDict_Check(g) ? PyDict_GetItem(g, g_lr) : nullptr;
    if (v == nullptr || !PyFloat_CheckExact(v)) return false;
    out.push_back(PyFloat_AS_DOUBLE(v));
  }
  return true;
}

void light_call(PyLight* b, const char* name) {  // the Python side's `name()` (it logs its own errors)
  if (b->side == nullptr) return;
  PyObject* out = PyObject_CallMethod(b->side, name, nullptr);
  if (out == nullptr) PyErr_WriteUnraisable(b->side);
  Py_XDECREF(out);
}

// ------------------------------------------------------------------ the block
void light_release(PyLight* b) {  // off this thread's captures (patched_calls.uninstall's rule), the owner let go
  tl_open = nullptr;
  PyObject* caps = b->caps;
  Py_ssize_t n = caps ? PyList_GET_SIZE(caps) : 0;
  for (Py_ssize_t i = n - 1; i >= 0; i--) {
    if (PyList_GET_ITEM(caps, i) == b->side && b->side != nullptr) {
      PyList_SetSlice(caps, i, i + 1, nullptr);
      break;
    }
  }
  if (caps != nullptr && PyList_GET_SIZE(caps) == 0 && PyDict_GetItem(b->captures, b->tid) == caps) {
    PyDict_DelItem(b->captures, b->tid);
  }
  Py_CLEAR(b->caps);
  Py_CLEAR(b->tid);
  if (b->owner != nullptr && PyObject_SetAttr(b->owner, g_active, Py_False) < 0) PyErr_WriteUnraisable(b->owner);
  Py_CLEAR(b->owner);
}

PyObject* light_enter_failed(PyLight* b) {  // the block let go as if closed, the error raised to the `with`
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  light_release(b);
  PyErr_Restore(et, ev, tb);
  return nullptr;
}

PyObject* light_enter(PyObject* self, PyObject*) {
  auto* b = reinterpret_cast<PyLight*>(self);
  int64_t t0 = light_now();
  if (b->owner == nullptr || b->side == nullptr || tl_open != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "LightBlock: entered without `open`, or inside another open block");
    return nullptr;
  }
  if (PyObject_SetAttr(b->owner, g_active, Py_True) < 0) {
    Py_CLEAR(b->owner);  // (not marked busy: nothing else to undo)
    return nullptr;
  }
  b->tid = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
  PyObject* caps = b->tid ? PyDict_GetItemWithError(b->captures, b->tid) : nullptr;
  if (caps == nullptr) {
    if (PyErr_Occurred() || (caps = PyList_New(0)) == nullptr) return light_enter_failed(b);
    int bad = PyDict_SetItem(b->captures, b->tid, caps);
    Py_DECREF(caps);
    if (bad < 0) return light_enter_failed(b);
  }
  Py_INCREF(caps);
  b->caps = caps;
  if (PyList_Append(caps, b->side) < 0) return light_enter_failed(b);
  b->losses->clear();
  b->slow = false;
  tl_open = b;
  b->t0_ns = t0;
  b->own_ns = b->timed ? light_now() - t0 : 0;
  Py_RETURN_NONE;
}

PyObject* light_exit(PyObject* self, PyObject*) {
  auto* b = reinterpret_cast<PyLight*>(self);
  int64_t t1 = light_now();
  PyObject *et, *ev, *tb;  // (the loop's exception, if any, goes on as it was)
  PyErr_Fetch(&et, &ev, &tb);
  light_release(b);
  std::vector<double> lr;
  if (b->slow || !light_rates(b, lr)) {
    b->fast = 0;  // (a row kept in Python: the monitor opens the next step, NOTE [Native light steps])
    light_call(b, "exit_slow");  // (the Python side reads the rates, and the losses the block read)
  } else {
    bool join = light_add(b, lr) || light_now() - b->since_ns >= b->flush_ns;
    if (b->timed) {
      int64_t t2 = light_now();
      b->samples->push_back(1e-9 * static_cast<double>(t2 - b->t0_ns));
      b->samples->push_back(1e-9 * static_cast<double>(b->own_ns + (t2 - t1)));
    }
    if (join) light_call(b, "drain");
  }
  PyErr_Restore(et, ev, tb);
  Py_RETURN_FALSE;
}

PyObject* light_hand_out(PyLight* b, PyObject* owner, int64_t step, bool timed) {
  Py_INCREF(owner);
  b->owner = owner;
  b->step = step;
  b->timed = timed;
  Py_INCREF(b);
  return reinterpret_cast<PyObject*>(b);
}

// open(step, owner, timed, fast, steps, every) -> the block, ready to enter (None: handed out, not closed yet),
// and the next `fast` steps allowed by `fast_open` (the sampler at `steps`, the Tracer's `every`)
PyObject* light_open(PyObject* self, PyObject* args) {
  auto* b = reinterpret_cast<PyLight*>(self);
  long long step, fast, steps, every;
  PyObject* owner;
  int timed;
  if (!PyArg_ParseTuple(args, "LOpLLL", &step, &owner, &timed, &fast, &steps, &every)) return nullptr;
  if (b->owner != nullptr) Py_RETURN_NONE;  // (the monitor makes a Python light step)
  b->fast = fast;
  b->fast_taken = 0;
  b->fast_steps = steps;
  b->every = every;
  return light_hand_out(b, owner, step, timed != 0);
}

// fast_open(i, owner) -> the block for step `i`, or None: `Tracer.step`'s path while the monitor allows it (the
// step not scheduled, the block closed, the Tracer not in another block); see NOTE [Native light steps]
PyObject* light_fast_open(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  auto* b = reinterpret_cast<PyLight*>(self);
  if (n != 2 || b->fast <= 0 || b->owner != nullptr || tl_open != nullptr || !PyLong_CheckExact(args[0])) {
    Py_RETURN_NONE;
  }
  int overflow = 0;
  long long i = PyLong_AsLongLongAndOverflow(args[0], &overflow);
  if (overflow != 0 || (i == -1 && PyErr_Occurred()) || b->every <= 0 || i % b->every == 0) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  PyObject* active = PyObject_GetAttr(args[1], g_active);
  bool busy = active != Py_False;
  Py_XDECREF(active);
  if (busy) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  b->fast--;
  b->fast_taken++;
  return light_hand_out(b, args[1], i, (b->fast_steps + b->fast_taken) % b->timed_every == 0);
}

// take_fast() -> the steps taken by `fast_open` since `open`; none allowed from now until the next `open`
PyObject* light_take_fast(PyObject* self, PyObject*) {
  auto* b = reinterpret_cast<PyLight*>(self);
  int64_t taken = b->fast_taken;
  b->fast = 0;
  b->fast_taken = 0;
  return PyLong_FromLongLong(taken);
}

PyObject* light_go_slow(PyObject* self, PyObject*) {  // the losses read so far, and the rest of the step is Python's
  auto* b = reinterpret_cast<PyLight*>(self);
  b->slow = true;
  b->fast = 0;
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(b->losses->size()));
  for (size_t i = 0; out != nullptr && i < b->losses->size(); i++) {
    PyList_SET_ITEM(out, i, PyFloat_FromDouble((*b->losses)[i]));
  }
  b->losses->clear();
  return out;
}

PyObject* light_floats(const double* v, int64_t n) {
  PyObject* out = PyList_New(n);
  for (int64_t i = 0; out != nullptr && i < n; i++) PyList_SET_ITEM(out, i, PyFloat_FromDouble(v[i]));
  return out;
}

// The learning rates' dict of a row whose raw rates are `v[0..n)`: the last row's (`*last`), when its raw rates are
// the same, else `rates(list of floats)`, which becomes `*last` (a new reference)
PyObject* light_lr(PyObject* rates, const double* v, int64_t n, std::vector<double>& raw, PyObject** last) {
  if (*last != nullptr && static_cast<int64_t>(raw.size()) == n && std::equal(raw.begin(), raw.end(), v)) {
    Py_INCREF(*last);
    return *last;
  }
  PyObject* list = light_floats(v, n);
  PyObject* lr = list ? PyObject_CallOneArg(rates, list) : nullptr;
  Py_XDECREF(list);
  if (lr == nullptr) return nullptr;
  raw.assign(v, v + n);
  Py_XSETREF(*last, lr);
  Py_INCREF(lr);
  return lr;
}

// The bytes of `v`'s elements (a `take`'s compact columns)
template <typename T>
PyObject* light_bytes(const std::vector<T>& v) {
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(v.data()),
                                   static_cast<Py_ssize_t>(v.size() * sizeof(T)));
}

// take(rates) -> (steps, losses a row, losses, rates, loud, [block seconds, own seconds, ...], losses by position); the
// rows gone. The rows stay compact (NOTE [Kept rows] in tracer/monitor/kept_rows.py): their steps and numbers of
// losses as the bytes of int64 columns, every loss in one list, and each row's learning rates (`rates(raw)`, asked
// once for each run of rows with the same raw rates); the same loss objects by their place in the row are what the
// loss rules' windows take (`TriggerState.add_quiet`)
PyObject* light_take(PyObject* self, PyObject* rates) {
  auto* b = reinterpret_cast<PyLight*>(self);
  Py_ssize_t n = static_cast<Py_ssize_t>(b->row_step->size());
  PyObject* lrs = PyList_New(n);
  PyObject* losses = PyList_New(0);
  PyObject* by_pos = PyList_New(0);
  bool ok = lrs != nullptr && losses != nullptr && by_pos != nullptr;
  PyObject* last = nullptr;
  std::vector<double> raw;
  int64_t at = 0;
  const double* v = b->row_val->data();
  for (Py_ssize_t i = 0; ok && i < n; i++) {
    int64_t nl = (*b->row_nloss)[i], end = (*b->row_cut)[i];
    PyObject* lr = light_lr(rates, v + at + nl, end - at - nl, raw, &last);
    ok = lr != nullptr;
    if (ok) PyList_SET_ITEM(lrs, i, lr);
    for (int64_t k = 0; ok && k < nl; k++) {
      if (k >= PyList_GET_SIZE(by_pos)) {
        PyObject* fresh = PyList_New(0);
        ok = fresh != nullptr && PyList_Append(by_pos, fresh) == 0;
        Py_XDECREF(fresh);
      }
      PyObject* x = ok ? PyFloat_FromDouble(v[at + k]) : nullptr;
      ok = x != nullptr && PyList_Append(losses, x) == 0 && PyList_Append(PyList_GET_ITEM(by_pos, k), x) == 0;
      Py_XDECREF(x);
    }
    at = end;
  }
  Py_XDECREF(last);
  PyObject* steps = ok ? light_bytes(*b->row_step) : nullptr;
  PyObject* nloss = ok ? light_bytes(*b->row_nloss) : nullptr;
  PyObject* samples = ok ? light_floats(b->samples->data(), static_cast<int64_t>(b->samples->size())) : nullptr;
  PyObject* out = steps && nloss && samples ? Py_BuildValue("(OOOOOOO)", steps, nloss, losses, lrs,
                                                            b->loud ? Py_True : Py_False, samples, by_pos)
                                            : nullptr;
  Py_XDECREF(lrs);
  Py_XDECREF(losses);
  Py_XDECREF(by_pos);
  Py_XDECREF(steps);
  Py_XDECREF(nloss);
  Py_XDECREF(samples);
  if (out == nullptr) return nullptr;  // (the rows stay: a later take has them)
  b->row_step->clear();
  b->row_nloss->clear();
  b->row_cut->clear();
  b->row_val->clear();
  b->samples->clear();
  b->loud = false;
  b->since_ns = light_now();
  return out;
}

// bound(pivots, ladders, groups): the next batch's quiet bounds (LightRows.bound) and parameter groups
PyObject* light_bound(PyObject* self, PyObject* args) {
  auto* b = reinterpret_cast<PyLight*>(self);
  PyObject *pivots, *ladders, *groups;
  if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &pivots, &PyTuple_Type, &ladders, &PyList_Type, &groups)) {
    return nullptr;
  }
  std::vector<double> p;
  std::vector<std::vector<double>> l;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(pivots) && k < PyTuple_GET_SIZE(ladders); k++) {
    p.push_back(PyFloat_AsDouble(PyTuple_GET_ITEM(pivots, k)));
    PyObject* seq = PySequence_Fast(PyTuple_GET_ITEM(ladders, k), "bound: a ladder is a sequence of floats");
    if (seq == nullptr) return nullptr;
    std::vector<double> steps;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
      steps.push_back(PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, j)));
    }
    Py_DECREF(seq);
    l.push_back(std::move(steps));
  }
  if (PyErr_Occurred()) return nullptr;
  *b->pivots = std::move(p);
  *b->ladders = std::move(l);
  b->below->assign(b->pivots->size(), 0);
  Py_INCREF(groups);
  Py_XSETREF(b->groups, groups);
  Py_RETURN_NONE;
}

PyObject* light_size(PyObject* self, PyObject*) {
  return PyLong_FromSize_t(reinterpret_cast<PyLight*>(self)->row_step->size());
}

}  // namespace
