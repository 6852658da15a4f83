#pragma once
// gradscape: the Python types of the native light step (light.h): the block (`LightBlock`) and the front of
// `Tensor.backward` (`backward_front`), and their registration in the module (`light_ready`). See NOTE [Native
// light steps] in tracer/monitor/light_native.py.
#include "light.h"

namespace {

PyObject* light_step(PyObject* self, void*) { return PyLong_FromLongLong(reinterpret_cast<PyLight*>(self)->step); }

PyObject* light_true(PyObject*, void*) { Py_RETURN_TRUE; }

PyObject* light_none(PyObject*, void*) { Py_RETURN_NONE; }

// (the garbage collector sees the Python side and the owner: a block opened and never entered holds its Tracer)
int light_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* b = reinterpret_cast<PyLight*>(self);
  Py_VISIT(b->side);
  Py_VISIT(b->owner);
  Py_VISIT(b->groups);
  return 0;
}

int light_clear(PyObject* self) {
  auto* b = reinterpret_cast<PyLight*>(self);
  Py_CLEAR(b->side);
  Py_CLEAR(b->owner);
  Py_CLEAR(b->groups);
  return 0;
}

// LightBlock(side, captures, handling, batch, flush seconds, one step in how many timed)
PyObject* light_new(PyTypeObject* type, PyObject* args, PyObject*) {
  PyObject *side, *captures, *handling;
  long long batch, timed_every;
  double flush;
  if (!PyArg_ParseTuple(args, "OO!O!LdL", &side, &PyDict_Type, &captures, &PySet_Type, &handling, &batch, &flush,
                        &timed_every)) {
    return nullptr;
  }
  if (timed_every < 1) {
    PyErr_SetString(PyExc_ValueError, "LightBlock: one step in `timed_every` is timed, at least 1");
    return nullptr;
  }
  auto* b = reinterpret_cast<PyLight*>(type->tp_alloc(type, 0));
  if (b == nullptr) return nullptr;
  Py_INCREF(side);
  Py_INCREF(captures);
  Py_INCREF(handling);
  b->side = side;
  b->captures = captures;
  b->handling = handling;
  b->groups = PyList_New(0);
  b->batch = batch;
  b->timed_every = timed_every;
  b->flush_ns = static_cast<int64_t>(flush * 1e9);
  b->since_ns = light_now();
  b->losses = new std::vector<double>();
  b->row_step = new std::vector<int64_t>();
  b->row_cut = new std::vector<int64_t>();
  b->row_nloss = new std::vector<int64_t>();
  b->row_val = new std::vector<double>();
  b->pivots = new std::vector<double>();
  b->ladders = new std::vector<std::vector<double>>();
  b->below = new std::vector<int64_t>();
  b->samples = new std::vector<double>();
  return reinterpret_cast<PyObject*>(b);
}

void light_dealloc(PyObject* self) {
  auto* b = reinterpret_cast<PyLight*>(self);
  PyObject_GC_UnTrack(self);
  if (tl_open == b) light_release(b);
  Py_CLEAR(b->side);
  Py_CLEAR(b->captures);
  Py_CLEAR(b->handling);
  Py_CLEAR(b->owner);
  Py_CLEAR(b->groups);
  delete b->losses;
  delete b->row_step;
  delete b->row_cut;
  delete b->row_nloss;
  delete b->row_val;
  delete b->pivots;
  delete b->ladders;
  delete b->below;
  delete b->samples;
  Py_TYPE(self)->tp_free(self);
}

PyMethodDef light_methods[] = {
    {"open", light_open, METH_VARARGS, "open(step, owner, timed) -> the block, ready to enter (None: not closed)"},
    {"fast_open", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(light_fast_open)), METH_FASTCALL,
     "fast_open(i, owner) -> the block for step i, or None (NOTE [Native light steps])"},
    {"take_fast", light_take_fast, METH_NOARGS, "take_fast() -> the steps fast_open handed out; none more"},
    {"__enter__", light_enter, METH_NOARGS, nullptr},
    {"__exit__", light_exit, METH_VARARGS, nullptr},
    {"go_slow", light_go_slow, METH_NOARGS, "go_slow() -> the losses read; the rest of the step is Python's"},
    {"take", light_take, METH_O,
     "take(rates) -> (steps, losses a row, losses, rates, loud, timed samples, losses by position); the rows gone"},
    {"bound", light_bound, METH_VARARGS, "bound(pivots, ladders, groups)"},
    {"size", light_size, METH_NOARGS, "size() -> rows kept"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef light_getset[] = {{"step", light_step, nullptr, "the step open (or last opened)", nullptr},
                              {"light", light_true, nullptr, "a light step (what `Tracer.step` asks)", nullptr},
                              {"traced", light_none, nullptr, "no trace", nullptr},
                              {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject LightType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ------------------------------------------------------------------ the front of Tensor.backward
// A loss the block reads: a plain CPU tensor of one floating element that requires grad, no torch-function mode
bool light_read(PyObject* t, double* out) {
  if (!THPVariable_CheckExact(t)) return false;
  const at::Tensor& v = THPVariable_Unpack(t);
  if (!v.defined() || !v.is_cpu() || v.layout() != at::kStrided || !v.requires_grad() || v.numel() != 1 ||
      !at::isFloatingType(v.scalar_type()) || at::impl::torch_function_mode_enabled()) {
    return false;
  }
  try {
    if (v.scalar_type() == at::kFloat && !v.is_neg()) {
      *out = *v.const_data_ptr<float>();
    } else if (v.scalar_type() == at::kDouble && !v.is_neg()) {
      *out = *v.const_data_ptr<double>();
    } else {
      *out = v.item<double>();
    }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The front of a backward function (`backward_front`): a callable that binds as a method, whose attributes
// (`__name__`, `__doc__`, `__wrapped__`) are its Python wrapper's
struct PyFront {
  PyObject_HEAD
  PyObject* wrapper;   // the Python wrapper (tracer/record/patched_calls.py), which it hands every other call
  PyObject* original;  // the function behind both
  PyObject* captures;  // patched_calls._captures: thread id -> the captures open on it
  PyObject* handling;  // patched_calls._handling: the threads a call of which is being handled
  int reads;           // `Tensor.backward`'s: reads a light step's loss
};

// The Python wrapper would hand the call straight to the original: no capture open on any thread, none on this
// one, or a call of this thread being handled (the wrapper's own first test, but for dynamo's, which it keeps)
bool front_passes(PyFront* f) {
  if (PyDict_GET_SIZE(f->captures) == 0) return true;
  PyObject* tid = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
  if (tid == nullptr) return false;
  PyObject* caps = PyDict_GetItemWithError(f->captures, tid);  // (borrowed)
  bool pass = caps == nullptr ? PyErr_Occurred() == nullptr
                              : (PyList_Check(caps) && PyList_GET_SIZE(caps) == 0) || PySet_Contains(f->handling, tid) == 1;
  Py_DECREF(tid);
  return pass;
}

// Inside an open block, on its thread, a loss it reads is kept and the call handed to the original as handled
// (its nested calls pass: patched_calls._handling); a call the Python wrapper would pass goes to the original;
// anything else goes to the Python wrapper, which hands it to the block's Python side
PyObject* front_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* f = reinterpret_cast<PyFront*>(self);
  PyLight* b = f->reads ? tl_open : nullptr;
  double x;
  if (b != nullptr && !b->slow && PyTuple_GET_SIZE(args) >= 1 && PyList_GET_SIZE(b->caps) > 0 &&
      PyList_GET_ITEM(b->caps, PyList_GET_SIZE(b->caps) - 1) == b->side &&
      PySet_Contains(b->handling, b->tid) == 0 && light_read(PyTuple_GET_ITEM(args, 0), &x)) {
    int64_t t0 = b->timed ? light_now() : 0;
    b->losses->push_back(x);
    PyObject* handling = b->handling;
    PyObject* tid = b->tid;
    Py_INCREF(handling);
    Py_INCREF(tid);
    if (b->timed) b->own_ns += light_now() - t0;
    PyObject* out = PySet_Add(handling, tid) < 0 ? nullptr : PyObject_Call(f->original, args, kwargs);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PySet_Discard(handling, tid);
    PyErr_Restore(et, ev, tb);
    Py_DECREF(handling);
    Py_DECREF(tid);
    return out;
  }
  if (PyErr_Occurred()) PyErr_Clear();  // (PySet_Contains failing: the Python wrapper decides)
  bool pass = front_passes(f);
  if (PyErr_Occurred()) PyErr_Clear();
  return PyObject_Call(pass ? f->original : f->wrapper, args, kwargs);
}

PyObject* front_get(PyObject* self, PyObject* obj, PyObject*) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

PyObject* front_getattr(PyObject* self, PyObject* name) {
  // (the type's own `__doc__` and `__module__` are not the function's: `help(torch.Tensor.backward)` reads these)
  if (PyUnicode_CompareWithASCIIString(name, "__doc__") == 0 ||
      PyUnicode_CompareWithASCIIString(name, "__module__") == 0) {
    return PyObject_GetAttr(reinterpret_cast<PyFront*>(self)->wrapper, name);
  }
  PyObject* out = PyObject_GenericGetAttr(self, name);
  if (out != nullptr || !PyErr_ExceptionMatches(PyExc_AttributeError)) return out;
  PyErr_Clear();
  return PyObject_GetAttr(reinterpret_cast<PyFront*>(self)->wrapper, name);
}

void front_dealloc(PyObject* self) {
  auto* f = reinterpret_cast<PyFront*>(self);
  Py_CLEAR(f->wrapper);
  Py_CLEAR(f->original);
  Py_CLEAR(f->captures);
  Py_CLEAR(f->handling);
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject FrontType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// backward_front(python wrapper, original, captures, handling, reads) -> the front, to be the backward function
PyObject* mod_backward_front(PyObject*, PyObject* args) {
  PyObject *wrapper, *original, *captures, *handling;
  int reads;
  if (!PyArg_ParseTuple(args, "OOO!O!p", &wrapper, &original, &PyDict_Type, &captures, &PySet_Type, &handling,
                        &reads)) {
    return nullptr;
  }
  auto* f = PyObject_New(PyFront, &FrontType);
  if (f == nullptr) return nullptr;
  Py_INCREF(wrapper);
  Py_INCREF(original);
  Py_INCREF(captures);
  Py_INCREF(handling);
  f->wrapper = wrapper;
  f->original = original;
  f->captures = captures;
  f->handling = handling;
  f->reads = reads;
  return reinterpret_cast<PyObject*>(f);
}

int light_ready(PyObject* m) {
  g_active = PyUnicode_InternFromString("_active");
  g_lr = PyUnicode_InternFromString("lr");
  LightType.tp_name = "gradscape._recorder.LightBlock";
  LightType.tp_basicsize = sizeof(PyLight);
  LightType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  LightType.tp_traverse = light_traverse;
  LightType.tp_clear = light_clear;
  LightType.tp_new = light_new;
  LightType.tp_dealloc = light_dealloc;
  LightType.tp_methods = light_methods;
  LightType.tp_getset = light_getset;
  FrontType.tp_name = "gradscape._recorder.BackwardFront";
  FrontType.tp_basicsize = sizeof(PyFront);
  FrontType.tp_flags = Py_TPFLAGS_DEFAULT;
  FrontType.tp_call = front_call;
  FrontType.tp_descr_get = front_get;
  FrontType.tp_getattro = front_getattr;
  FrontType.tp_dealloc = front_dealloc;
  if (g_active == nullptr || g_lr == nullptr || PyType_Ready(&LightType) < 0 || PyType_Ready(&FrontType) < 0) {
    return -1;
  }
  Py_INCREF(&LightType);
  return PyModule_AddObject(m, "LightBlock", reinterpret_cast<PyObject*>(&LightType));
}

}  // namespace
