// bench/light_floor.py's native light step: a block (a context manager) and a wrapper of `Tensor.backward` that,
// inside a block, reads each loss (a plain CPU tensor of one element) and hands the call to the original function.
// It does only what a light step must do on every step, to measure what that costs the loop from C++.
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

namespace py = pybind11;

namespace {

thread_local std::vector<double>* g_losses = nullptr;  // the open block's, on this thread
thread_local bool g_handling = false;                  // a wrapped call is being handed on (nested calls pass)
PyObject* g_original = nullptr;                        // the function the wrapper hands each call to

PyObject* wrapper(PyObject*, PyObject* args, PyObject* kwargs) {
  if (g_losses != nullptr && !g_handling && PyTuple_GET_SIZE(args) >= 1) {
    PyObject* t = PyTuple_GET_ITEM(args, 0);
    if (THPVariable_CheckExact(t)) {
      const at::Tensor& v = THPVariable_Unpack(t);
      if (v.numel() == 1 && v.is_cpu() && v.requires_grad()) {
        g_losses->push_back(v.item<double>());
      }
    }
    g_handling = true;
    PyObject* out = PyObject_Call(g_original, args, kwargs);
    g_handling = false;
    return out;
  }
  return PyObject_Call(g_original, args, kwargs);
}

PyMethodDef g_def = {"backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(wrapper)),
                     METH_VARARGS | METH_KEYWORDS, "Tensor.backward, its loss read inside a Block"};

struct Block {
  std::vector<double> losses;
  void enter() {
    losses.clear();
    g_losses = &losses;
  }
  bool exit(const py::args&) {
    g_losses = nullptr;
    return false;
  }
};

// The wrapper of `original`, bound as a method (an instance method object: a class attribute of Tensor).
py::object make_wrapper(const py::object& original) {
  Py_XDECREF(g_original);
  g_original = original.ptr();
  Py_INCREF(g_original);
  PyObject* f = PyCFunction_New(&g_def, nullptr);
  PyObject* m = PyInstanceMethod_New(f);
  Py_DECREF(f);
  return py::reinterpret_steal<py::object>(m);
}

}  // namespace

PYBIND11_MODULE(light_floor, m) {
  m.def("make_wrapper", &make_wrapper);
  py::class_<Block>(m, "Block")
      .def(py::init<>())
      .def("__enter__", &Block::enter)
      .def("__exit__", &Block::exit)
      .def_readonly("losses", &Block::losses);
}
