// gradscape native recorder: the graph walk and the hooks' lifetime (see recorder.h).
#pragma once
#include "recorder.h"

namespace {

variable_list PostHook::operator()(const variable_list& grad_inputs, const variable_list& grad_outputs) {
  rec->on_post(id, grad_inputs, grad_outputs);
  return grad_inputs;
}

variable_list PreHook::operator()(const variable_list& grads) {
  rec->on_pre(id, grads);
  return grads;
}

// A node of a custom autograd.Function (torch's PyNode), told by its class: libtorch_python does not export
// PyNode's type information, so no dynamic_cast; its mangled name is the class's own
bool is_py_node(Node* n) { return std::strcmp(typeid(*n).name(), "N5torch8autograd6PyNodeE") == 0; }

const char* const ACCUMULATE = "torch::autograd::AccumulateGrad";

int8_t kind_of(const std::string& nm, bool py_node) {
  if (nm == ACCUMULATE) return KIND_ACC;
  if (nm == "CompiledFunctionBackward") return KIND_COMPILED;
  if (nm == "CheckpointFunctionBackward") return KIND_CHECKPOINT;
  if (nm == "BackwardHookFunctionBackward") return KIND_HOOK;
  return py_node ? KIND_CUSTOM : KIND_OP;
}

// The name code and kind of each C++ node class this thread has met, by its type_info's address, packed as
// code * 16 + kind: found without `g_mu` (which the hooks take on the engine's threads) and without hashing
// the class's mangled name, as std::type_index does
thread_local NodeIndex tl_classes;

// The name code and kind of a node, by its C++ class (a custom Function's node: by its name, every time)
std::pair<int32_t, int8_t> class_of(Node* n) {
  const std::type_info& type = typeid(*n);
  int32_t hit = tl_classes.find(&type);
  if (hit >= 0) return {hit / 16, static_cast<int8_t>(hit % 16)};
  std::unique_lock<std::mutex> g(g_mu);
  auto it = g_class_code.find(std::type_index(type));
  if (it != g_class_code.end()) {
    int8_t k = kind_of(g_names[it->second], false);
    tl_classes.insert(&type, it->second * 16 + k);
    return {it->second, k};
  }
  g.unlock();  // name() of a custom Function's node is Python's (the GIL is held: this is a Python call)
  bool py_node = is_py_node(n);
  std::string nm = n->name();
  g.lock();
  int32_t code = code_of_name(nm);
  if (!py_node) g_class_code.emplace(std::type_index(type), code);
  return {code, kind_of(nm, py_node)};
}

// The size of the last graph this thread walked: a step of a training loop walks the same graph again
thread_local size_t tl_last_nodes = 0;

void Recorder::reserve_like_last() {
  size_t n = tl_last_nodes;
  if (n == 0) return;
  ids.reserve(n);
  nodes.reserve(n);
  name.reserve(n);
  kind.reserve(n);
  seq.reserve(n);
  in_off.reserve(n + 1);
  child_off.reserve(n + 1);
}

// Its forward outputs' shapes and dtypes (what the engine checks arriving gradients against)
void Recorder::add_outputs(Node* n) {
  for (uint32_t i = 0; i < n->num_inputs(); i++) {
    const auto& meta = n->input_metadata(i);
    out_dtype.push_back(static_cast<int8_t>(c10::typeMetaToScalarType(meta.dtype())));
    int32_t ndim = -1;
    if (!meta.is_nested_tensor() && !meta.was_default_constructed()) {
      auto shape = meta.shape_as_dim_vector();
      ndim = static_cast<int32_t>(shape.size());
      for (const auto& d : shape) {
        if (d.is_heap_allocated()) {  // symbolic: no plain shape
          ndim = -1;
          break;
        }
      }
      if (ndim >= 0) {
        for (const auto& d : shape) out_dims.push_back(d.as_int_unchecked());
      }
    }
    out_ndim.push_back(ndim);
  }
}

// Children and senders of the nodes from `first` on (every id is known by then)
void Recorder::link_from(int32_t first) {
  senders.resize(in_off.back(), 0);
  handoff.resize(in_off.back());
  sum_of.resize(nodes.size());
  for (size_t r = first; r < nodes.size(); r++) {
    for (const auto& e : nodes[r]->next_edges()) {
      if (!e.function) {
        child_id.push_back(-1);
        child_nr.push_back(0);
        continue;
      }
      int32_t c = ids.find(e.function.get());
      if (c < 0) throw std::logic_error("gradscape: a child of a walked node was not walked");
      child_id.push_back(c);
      child_nr.push_back(static_cast<int32_t>(e.input_nr));
      senders[in_off[c] + e.input_nr] += 1;
    }
    child_off.push_back(static_cast<int32_t>(child_id.size()));
  }
  is_view.resize(nodes.size(), 0);
  std::lock_guard<std::mutex> g(g_mu);
  for (size_t r = first; r < nodes.size(); r++) is_view[r] = g_is_view[name[r]];
}

// Depth first from `root`, without recursion (a graph of a long loop is deep); new nodes get the next ids
int32_t Recorder::walk_from(const NodePtr& root) {
  int32_t first = static_cast<int32_t>(nodes.size());
  if (first == 0) reserve_like_last();
  std::vector<Node*> stack{root.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n == nullptr || ids.find(n) >= 0) continue;
    auto [code, k] = class_of(n);
    ids.insert(n, static_cast<int32_t>(nodes.size()));
    nodes.push_back(n->getptr());
    name.push_back(code);
    kind.push_back(k);
    seq.push_back(n->sequence_nr());
    in_off.push_back(in_off.back() + static_cast<int32_t>(n->num_inputs()));
    add_outputs(n);
    const auto& edges = n->next_edges();
    for (auto it = edges.rbegin(); it != edges.rend(); ++it) {
      Node* c = it->function.get();
      if (c != nullptr && ids.find(c) < 0) stack.push_back(c);
    }
  }
  link_from(first);
  tl_last_nodes = nodes.size();
  return ids.find(root.get());
}

void Recorder::install(int32_t first) {
  for (size_t r = first; r < nodes.size(); r++) {
    int32_t id = static_cast<int32_t>(r);
    if (kind[r] == KIND_ACC) {
      auto hook = std::make_unique<PreHook>(this, id);
      pre_hooks.emplace_back(id, hook.get());
      nodes[r]->add_pre_hook(std::move(hook));
    } else {
      post_keys.emplace_back(id, nodes[r]->add_post_hook(std::make_unique<PostHook>(this, id)));
    }
  }
}

void Recorder::remove_hooks() {
  for (auto& pk : post_keys) nodes[pk.first]->del_post_hook(pk.second);
  post_keys.clear();
  for (auto& ph : pre_hooks) {
    auto& hooks = nodes[ph.first]->pre_hooks();
    for (auto it = hooks.begin(); it != hooks.end(); ++it) {
      if (static_cast<void*>(it->get()) == ph.second) {
        hooks.erase(it);
        break;
      }
    }
  }
  pre_hooks.clear();
}

// NOTE [Teardown] in tracer/record/walk.py: consumers first, so that no chain of frees runs deep
void Recorder::release() {
  remove_hooks();
  std::vector<int32_t> order(nodes.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [this](int32_t a, int32_t b) { return seq[a] > seq[b]; });
  for (int32_t i : order) nodes[i].reset();
  nodes.clear();
  ids.clear();
  sums.clear();
}

}  // namespace
