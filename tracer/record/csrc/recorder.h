#pragma once
// gradscape: the native step recorder. The graph walk, one C++ hook per node and the summaries of what
// flows through them, written into flat records that Python reads once the backward is over.
//
// See NOTE [Native recorder] in tracer/record/native.py for what it records and why; this file is built
// against the installed torch by `gradscape build-recorder` (tracer/record/native_build.py; without it
// gradscape records in Python), and loaded only when the torch it was built for is the one imported.
//
// Files: recorder.h (the state), walk.h (the graph walk and the hooks' lifetime), backward_call.h (a
// backward call's start and end, one call each), summaries.h (what a
// hook does), readout.h (what Python reads of a step), light.h (the monitor's light step, NOTE [Native
// light steps] in tracer/monitor/light_native.py) and light_types.h (its Python types), recorder.cpp (the
// Python module). One translation unit: recorder.cpp includes the others.
//
// Threads. `start_call`, `begin_pass` and every export run with the GIL held (they are Python calls).
// The hooks run on the autograd engine's threads without it: they touch only this file's state, under
// `mu_`, and take the GIL only for what Python owns (a summary the kernel cannot make, a new arena chunk,
// a new kernel plan), never while holding `mu_` ... except through `summarise`, where the order is always
// mu_ then GIL: no thread takes the GIL and then mu_ (the Python side never calls into a hook).
#include <Python.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstring>
#include <mutex>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <vector>

#include "node_index.h"
#include "torch_shims.h"

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;
using gs_shim::NodePtr;  // NOTE [Node ownership across releases] in torch_shims.h
using Kernel = int (*)(const void*, const int64_t*, double*);
// _fastsum's gs_summarise_strided: (first element, geometry, [dtype, ndim, sizes, strides], out) -> status
using StridedKernel = int (*)(const void*, const int64_t*, const int64_t*, double*);

constexpr int8_t KIND_OP = 0, KIND_ACC = 1, KIND_COMPILED = 2, KIND_CHECKPOINT = 3, KIND_HOOK = 4,
                 KIND_CUSTOM = 5;
constexpr int64_t FIRST_CHUNK = 1 << 15;  // doubles in the arena's first chunk of a step
constexpr int64_t MAX_CHUNK = 1 << 18;    // and in its largest, unless one summary needs more

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------------------
// Names and kernel plans: per process, shared by every recorder (a model has few node classes and shapes)

std::mutex g_mu;
std::vector<std::string> g_names;                    // name code -> name()
std::unordered_map<std::string, int32_t> g_name_code;
std::unordered_map<std::type_index, int32_t> g_class_code;  // C++ node classes: one name per class
std::vector<char> g_is_view;                   // name code -> a view node (NOTE [Views share a buffer])
std::vector<std::string> g_view_names;          // the names of view nodes (`setup`)

int32_t code_of_name(const std::string& name) {  // g_mu held
  auto it = g_name_code.find(name);
  if (it != g_name_code.end()) return it->second;
  int32_t code = static_cast<int32_t>(g_names.size());
  g_names.push_back(name);
  g_name_code.emplace(name, code);
  g_is_view.push_back(std::find(g_view_names.begin(), g_view_names.end(), name) != g_view_names.end());
  return code;
}

struct Plan {
  int32_t id = -1;  // -1: no kernel call applies to this layout
  Kernel fn = nullptr;
  int64_t geom[7] = {0, 0, 0, 0, 0, 0, 0};
  int64_t words = 0;  // doubles the call writes: 8 statistics, then the float32 thumbnail
  int64_t cells = 0;  // the thumbnail's cells (0: none)
  int64_t stored = 0;  // doubles the arena keeps: 8 statistics, then the thumbnail in bfloat16 (NOTE [Arena thumbnails])
};
std::unordered_map<std::string, Plan> g_plans;  // layout key -> plan (g_mu)
PyObject* g_planner = nullptr;  // Python: (shape, dtype code, transposed) -> (id, kernel, geometry, words, cells) | None
Kernel g_kernels[4] = {nullptr, nullptr, nullptr, nullptr};  // float32, bfloat16, float16, float64
StridedKernel g_strided = nullptr;  // none in a kernel built before it: strided tensors are copied

int dtype_code(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return 0;
    case c10::ScalarType::BFloat16: return 1;
    case c10::ScalarType::Half: return 2;
    case c10::ScalarType::Double: return 3;
    default: return -1;
  }
}

// ---------------------------------------------------------------------------------------------------

struct Summ {  // one summary: the kernel's (plan >= 0) in the arena, or Python's (py >= 0)
  int32_t plan;
  int32_t chunk;
  int64_t off;  // in doubles
  int32_t py;
  int32_t wide;  // bit 0 (WIDE): the thumbnail's cells are float32 (at bfloat16's precision), else bfloat16 (NOTE
                 // [Arena thumbnails]); bit 1 (EVICTED): the budget left its picture out while recording (budget.h)
};
constexpr int32_t WIDE = 1, EVICTED = 2;

struct RunRec {  // one run of a node
  int32_t node;
  int32_t pass;
  double time_us;  // NaN for AccumulateGrad
  int32_t go_off, go_n, gi_off, gi_n;  // into the slots; gi_n = -1: no grad_inputs (AccumulateGrad)
};

struct Handoff {  // what a node's single sender sent to one of its inputs (NOTE [Dedupe])
  const void* ptr = nullptr;
  uint64_t layout = 0;
  int32_t summ = -1;
};

class Recorder;

struct PostHook : torch::autograd::FunctionPostHook {
  Recorder* rec;
  int32_t id;
  PostHook(Recorder* r, int32_t i) : rec(r), id(i) {}
  variable_list operator()(const variable_list& grad_inputs, const variable_list& grad_outputs) override;
};

struct PreHook : torch::autograd::FunctionPreHook {
  Recorder* rec;
  int32_t id;
  PreHook(Recorder* r, int32_t i) : rec(r), id(i) {}
  variable_list operator()(const variable_list& grads) override;
};

uint64_t layout_of(const at::Tensor& t) {  // sizes, strides and dtype, hashed
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(t.scalar_type());
  for (int64_t d = 0; d < t.dim(); d++) {
    h = (h ^ static_cast<uint64_t>(t.size(d))) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(t.stride(d))) * 1099511628211ull;
  }
  return h ^ static_cast<uint64_t>(t.dim());
}

class Recorder {
 public:
  // graph
  std::vector<NodePtr> nodes;
  NodeIndex ids;
  std::vector<int32_t> name, child_off{0}, child_id, child_nr, in_off{0}, senders;
  std::vector<int8_t> kind, is_view, out_dtype;
  std::vector<uint64_t> seq;
  std::vector<int32_t> out_ndim;  // per forward output (in_off's slots): its rank, -1 when it has no plain shape
  std::vector<int64_t> out_dims;
  // hooks
  std::vector<std::pair<int32_t, uintptr_t>> post_keys;  // (node, key)
  std::vector<std::pair<int32_t, void*>> pre_hooks;      // (node, hook)
  // records
  std::mutex mu;
  std::vector<RunRec> runs;
  std::vector<int32_t> slots;
  std::vector<Summ> summs;
  std::vector<const void*> summ_ptr;   // per summary: the address the kernel read (nullptr: not the kernel's)
  std::vector<const Plan*> summ_plan;  // and its plan
  std::unordered_map<int32_t, std::pair<const void*, uint64_t>> arrival;  // AccumulateGrad run -> what arrived
  std::vector<PyObject*> py;      // Python summaries (owned references)
  std::vector<PyObject*> chunks;  // the arena: bytearrays (owned references)
  std::vector<int64_t> chunk_caps;  // their sizes, in doubles
  size_t chunk_idx = 0;  // the chunk being filled
  double* chunk_ptr = nullptr;
  int64_t chunk_cap = 0, chunk_used = 0;
  // NOTE [Budget while recording] (budget.h)
  std::vector<int32_t> summ_owner;  // per summary: the summary whose arena block it reads (itself, or a view's)
  int64_t budget = -1;  // thumbnail cells the step keeps (NOTE [Thumbnail budget]); -1: no limit
  int64_t arena_used = 0;  // doubles of the arena's blocks
  int64_t live_cells = 0;  // thumbnail cells of the summaries that still have a picture
  int64_t evict_at = 0;  // arena_used at which `evict` runs next
  PyObject* past_budget = nullptr;  // Python: (raw statistics, cells, budget) -> the positions past it (budget.h)
  std::vector<Handoff> handoff;  // per input slot
  std::vector<std::vector<std::pair<int32_t, int32_t>>> sum_of;  // per node: (slot, module sum)
  std::vector<at::Tensor> sums;
  PyObject* fallback = nullptr;  // Python: (tensor) -> summary
  int32_t pass = -1;
  int64_t pass_t0 = 0;
  uint64_t generation;
  int32_t thumb = 64;
  int64_t failures = 0;
  // this step's plans by layout (dtype, transposed, rank, sizes; rank <= 4): found without the global lock
  struct LayoutHash {
    size_t operator()(const std::array<int64_t, 5>& k) const {
      uint64_t h = 1469598103934665603ull;
      for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  std::unordered_map<std::array<int64_t, 5>, const Plan*, LayoutHash> step_plans;

  Recorder() {
    static std::atomic<uint64_t> gen{1};
    generation = gen++;
  }
  ~Recorder() { remove_hooks(); }

  // ---- the walk (GIL held)
  int32_t walk_from(const NodePtr& root);
  void reserve_like_last();
  void add_outputs(Node* n);
  void link_from(int32_t first);
  void install(int32_t first);
  void remove_hooks();
  void release();
  void drop_records();

  // ---- the hooks (no GIL)
  void on_post(int32_t id, const variable_list& gi, const variable_list& go);
  void on_pre(int32_t id, const variable_list& go);
  // ---- between passes (GIL held): gradients summarised as a hook would, into the step's summaries
  std::vector<int32_t> summarise_each(const std::vector<at::Tensor>& ts);

 private:
  int32_t summarise(const at::Tensor& t, int32_t stats_of, bool wide = false);
  int32_t arrived(int32_t id, size_t i, const at::Tensor& g);
  int32_t python_summary(const at::Tensor& t, int32_t stats_of);
  const Plan* plan_for(const at::Tensor& t, bool transposed);
  const Plan* shared_plan_for(const at::Tensor& t, bool transposed);
  double* reserve(int64_t words, int32_t* chunk, int64_t* off);
  bool next_chunk(int64_t words);
  void evict();
  std::vector<int64_t> ask_budget(const std::vector<int32_t>& live);
  void pack_arena(int32_t first);
  double time_since_last(int64_t t1);
  void mark_end();
};

thread_local uint64_t tl_generation = 0;
thread_local int64_t tl_last_end = 0;

double Recorder::time_since_last(int64_t t1) {
  int64_t t0 = tl_generation == generation && tl_last_end > pass_t0 ? tl_last_end : pass_t0;
  return static_cast<double>(t1 - t0) / 1e3;
}

void Recorder::mark_end() {
  tl_generation = generation;
  tl_last_end = now_ns();
}

}  // namespace
