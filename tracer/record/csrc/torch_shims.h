#pragma once
// gradscape: every difference between the torch releases the native recorder builds for, in one place,
// chosen by torch's own version macros (torch/version.h). The rest of csrc/ uses only what is here and
// the parts of torch's autograd headers that are the same on every supported release (2.9 to 2.14:
// tracer/_compat.py's MIN_TORCH and MAX_TESTED). tests/test_torch_shims.py compiles this directory against
// the headers of the floor and the newest release in `make test`.
//
// NOTE [Node ownership across releases]
//     Up to torch 2.12 an autograd node is owned through `std::shared_ptr<Node>` (Node derives from
//     `std::enable_shared_from_this`), and a custom Function's Python object (THPFunction) holds a
//     `std::weak_ptr<PyNode>` to its node. From 2.13 a node is a `c10::intrusive_ptr_target`, owned
//     through `c10::intrusive_ptr<Node>`, and THPFunction holds an owning `intrusive_ptr<Node>`. The
//     recorder keeps every node of a step alive with a NodePtr, reads a THPFunction's node with
//     `function_node`, and hands a node back to Python with `torch::autograd::functionToPyObject`,
//     which takes a NodePtr on every release.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/version.h>

#include <memory>
#include <type_traits>

#define GS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if !GS_TORCH_AT_LEAST(2, 9)
#error "gradscape's native recorder supports torch 2.9 and newer (tracer/_compat.py MIN_TORCH)"
#endif

namespace gs_shim {

#if GS_TORCH_AT_LEAST(2, 13)
using NodePtr = c10::intrusive_ptr<torch::autograd::Node>;

// The node a custom Function's Python object belongs to (null once its graph is gone)
inline NodePtr function_node(THPFunction* f) { return f->cdata; }
#else
using NodePtr = std::shared_ptr<torch::autograd::Node>;

inline NodePtr function_node(THPFunction* f) { return f->cdata.lock(); }
#endif

// The version macros and the headers agree: a release that changed ownership without the cut above
// moving fails here, by name, rather than deep in a template instantiation
static_assert(std::is_same_v<NodePtr, decltype(std::declval<torch::autograd::Node&>().getptr())>,
              "torch_shims.h: this torch owns autograd nodes differently (NOTE [Node ownership across releases])");

}  // namespace gs_shim
