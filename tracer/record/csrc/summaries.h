// gradscape native recorder: what a hook does, the summaries of what flows through it (see recorder.h).
#pragma once
#include "recorder.h"

namespace {

// ---- summaries

const Plan* Recorder::plan_for(const at::Tensor& t, bool transposed) {  // mu held
  int dim = static_cast<int>(t.dim());
  if (dim <= 4) {
    std::array<int64_t, 5> layout{static_cast<int64_t>(t.scalar_type()) | (transposed ? 256 : 0) | (dim << 9), 0, 0, 0,
                                  0};
    for (int d = 0; d < dim; d++) layout[d + 1] = t.size(d);
    auto it = step_plans.find(layout);
    if (it != step_plans.end()) return it->second;
    const Plan* plan = shared_plan_for(t, transposed);
    step_plans.emplace(layout, plan);
    return plan;
  }
  return shared_plan_for(t, transposed);
}

// The plan of a layout from the process's plans (made by the planner, in Python, the first time it is met)
const Plan* Recorder::shared_plan_for(const at::Tensor& t, bool transposed) {
  char key[7 + 8 * 16];
  int dim = static_cast<int>(t.dim());
  if (dim > 16) return nullptr;
  key[0] = static_cast<char>(t.scalar_type());
  key[1] = static_cast<char>(transposed);
  key[2] = static_cast<char>(dim);
  std::memcpy(key + 3, &thumb, 4);
  for (int d = 0; d < dim; d++) {
    int64_t s = t.size(d);
    std::memcpy(key + 7 + 8 * d, &s, 8);
  }
  std::string k(key, 7 + 8 * dim);
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_plans.find(k);
    if (it != g_plans.end()) return it->second.id >= 0 ? &it->second : nullptr;
  }
  Plan plan;
  PyGILState_STATE st = PyGILState_Ensure();
  PyObject* shape = PyTuple_New(dim);
  for (int d = 0; d < dim; d++) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(t.size(d)));
  PyObject* res = PyObject_CallFunction(g_planner, "(Niii)", shape, dtype_code(t.scalar_type()),
                                        transposed ? 1 : 0, static_cast<int>(thumb));
  if (res == nullptr) {
    PyErr_Clear();
  } else if (res != Py_None) {
    // (id, kernel index, (geometry x7), words, thumbnail cells)
    PyObject* geom = nullptr;
    int kernel = -1;
    long long words = 0, cells = 0;
    int id = -1;
    if (PyArg_ParseTuple(res, "iiOLL", &id, &kernel, &geom, &words, &cells) && PyTuple_Check(geom) &&
        PyTuple_GET_SIZE(geom) == 7 && kernel >= 0 && kernel < 4 && g_kernels[kernel] != nullptr) {
      plan.id = id;
      plan.fn = g_kernels[kernel];
      plan.words = words;
      plan.cells = cells;
      plan.stored = 8 + (cells + 3) / 4;
      for (int i = 0; i < 7; i++) plan.geom[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(geom, i));
      if (PyErr_Occurred()) {
        PyErr_Clear();
        plan.id = -1;
      }
    } else {
      PyErr_Clear();
    }
  }
  Py_XDECREF(res);
  PyGILState_Release(st);
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_plans.emplace(k, plan).first;
  return it->second.id >= 0 ? &it->second : nullptr;
}

// NOTE [Arena thumbnails] (tracer/summary/bfloat16.py): the kernel writes a thumbnail in float32; the arena keeps
// it in bfloat16, rounded to nearest, ties to even, as torch rounds (every NaN as the quiet NaN 0x7FC0)
// (vectorised: the loops are branch-free, and GCC's -O2 leaves loops of unknown length scalar; on x86-64 each is
// built three times, for the x86-64-v4 (AVX-512) and v3 (AVX2) levels and the baseline, and the loader picks the
// one this CPU runs: measured 3.5x faster than the baseline's four lanes with AVX-512 on a 4,096-cell thumbnail;
// GCC names those levels from release 12)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && defined(__linux__)
#define GS_VECTORISE __attribute__((optimize("O3"), target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__GNUC__) && !defined(__clang__)
#define GS_VECTORISE __attribute__((optimize("O3")))
#else
#define GS_VECTORISE
#endif

static inline uint32_t bf16_bits(uint32_t b) {  // a float32's bits → the bfloat16's, in the low 16 bits
  return (b & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}

GS_VECTORISE static void to_bf16(const float* __restrict src, int64_t n, uint16_t* __restrict dst) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t b;
    std::memcpy(&b, src + i, 4);
    dst[i] = static_cast<uint16_t>(bf16_bits(b));
  }
}

// A float32 cell rounded to bfloat16's precision, kept in float32 (a `wide` summary's thumbnail)
GS_VECTORISE static void round_bf16(float* cells, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t b;
    std::memcpy(&b, cells + i, 4);
    b = bf16_bits(b) << 16;
    std::memcpy(cells + i, &b, 4);
  }
}

// A buffer of `words` doubles for the kernel's output before the thumbnail is narrowed (one per thread)
static double* scratch_for(int64_t words) {
  thread_local std::vector<double> buf;
  if (static_cast<int64_t>(buf.size()) < words) buf.resize(static_cast<size_t>(words));
  return buf.data();
}

double* Recorder::reserve(int64_t words, int32_t* chunk, int64_t* off) {
  if (chunk_ptr == nullptr || chunk_used + words > chunk_cap) {
    if (budget >= 0 && arena_used >= evict_at) evict();  // NOTE [Budget while recording]: may free room
    if ((chunk_ptr == nullptr || chunk_used + words > chunk_cap) && !next_chunk(words)) return nullptr;
  }
  *chunk = static_cast<int32_t>(chunk_idx);
  *off = chunk_used;
  double* out = chunk_ptr + chunk_used;
  chunk_used += words;
  arena_used += words;
  return out;
}

// The next chunk with room for `words` doubles: one `evict` emptied, else a new one
bool Recorder::next_chunk(int64_t words) {
  size_t next = chunk_ptr == nullptr ? 0 : chunk_idx + 1;
  while (next < chunks.size() && chunk_caps[next] < words) next++;
  if (next >= chunks.size()) {
    int64_t cap = chunks.empty() ? FIRST_CHUNK : std::min<int64_t>(2 * chunk_caps.back(), MAX_CHUNK);
    cap = std::max(cap, words);
    PyGILState_STATE st = PyGILState_Ensure();
    PyObject* buf = PyByteArray_FromStringAndSize(nullptr, cap * 8);
    PyGILState_Release(st);
    if (buf == nullptr) return false;
    chunks.push_back(buf);
    chunk_caps.push_back(cap);
    next = chunks.size() - 1;
  }
  chunk_idx = next;
  chunk_ptr = reinterpret_cast<double*>(PyByteArray_AS_STRING(chunks[next]));
  chunk_cap = chunk_caps[next];
  chunk_used = 0;
  return true;
}

// `stats_of`: what arrived at a view node, whose statistics its output shares (NOTE [Views share a buffer]), as
// the Python recorder shares them; only a summary Python made has a trace to share here
int32_t Recorder::python_summary(const at::Tensor& t, int32_t stats_of) {
  PyGILState_STATE st = PyGILState_Ensure();
  PyObject* wrapped = THPVariable_Wrap(t);
  PyObject* of = stats_of >= 0 && summs[stats_of].py >= 0 ? py[summs[stats_of].py] : Py_None;
  PyObject* res = wrapped == nullptr ? nullptr : PyObject_CallFunctionObjArgs(fallback, wrapped, of, nullptr);
  Py_XDECREF(wrapped);
  if (res == nullptr) {
    PyErr_Clear();
    failures++;
    PyGILState_Release(st);
    return -1;
  }
  PyGILState_Release(st);
  int32_t idx = static_cast<int32_t>(summs.size());
  summs.push_back(Summ{-1, -1, 0, static_cast<int32_t>(py.size()), 0});
  summ_owner.push_back(idx);
  summ_ptr.push_back(nullptr);
  summ_plan.push_back(nullptr);
  py.push_back(res);
  return idx;
}

// `wide`: the thumbnail kept in float32 cells, each at bfloat16's precision: what an optimizer stepped with, and
// a thumbnail of at most WIDE_CELLS cells (a loss's gradient, the root of every backward): summaries that the step's
// end always makes into `TensorTrace`s, read as they are there rather than widened one by one (NOTE [Cold steps])
constexpr int64_t WIDE_CELLS = 16;

// NOTE [Strided gradients]
// A gradient that is neither contiguous nor a 2-D transpose (attention's permuted query, key and value gradients,
// an expanded one, a slice) is read where it lies: the kernel gathers each chunk of its elements, in the order a
// contiguous copy would hold them, into a buffer on its stack (_fastsum.c's gs_summarise_strided), so the summary
// is the copy's, bitwise, without the copy's allocation, its pass over memory and its fresh pages (a tiny Llama's
// step copied 88 such gradients, 18% of the elements it summarised). float64, more than kStridedDims dimensions,
// and a kernel built before it take the copy.
constexpr int kStridedDims = 8;

// `lay` = [dtype code, ndim, sizes..., strides...] of `t` when the kernel can read it in place; else false
bool strided_layout(const at::Tensor& t, int64_t* lay) {
  int code = dtype_code(t.scalar_type());
  int64_t nd = t.dim();
  if (g_strided == nullptr || code < 0 || code > 2 || nd < 1 || nd > kStridedDims) return false;
  lay[0] = code;
  lay[1] = nd;
  for (int64_t d = 0; d < nd; d++) {
    lay[2 + d] = t.size(d);
    lay[2 + nd + d] = t.stride(d);
  }
  return true;
}

int32_t Recorder::summarise(const at::Tensor& t, int32_t stats_of, bool wide) {  // mu held
  if (!t.defined()) return -1;
  if (t.unsafeGetTensorImpl()->is_python_dispatch() || t.layout() != c10::kStrided || !t.device().is_cpu() ||
      t.is_nested() || t.is_conj() ||
      t.is_neg() || dtype_code(t.scalar_type()) < 0 || t.numel() == 0) {
    return python_summary(t, stats_of);
  }
  bool transposed = false;
  int64_t lay[3 + 2 * kStridedDims] = {-1};  // a strided layout the kernel reads in place (NOTE [Strided gradients])
  at::Tensor copy;  // else a contiguous copy, as the Python summariser makes, rather than going through Python
  if (!t.is_contiguous()) {
    if (t.dim() == 2 && t.stride(0) == 1 && t.stride(1) == t.size(0)) {
      transposed = true;
    } else if (!strided_layout(t, lay)) {
      copy = t.contiguous();
    }
  }
  const at::Tensor& src = copy.defined() ? copy : t;
  const Plan* plan = plan_for(src, transposed);  // (a plan is of the shape alone: the same for a strided view)
  if (plan == nullptr) return python_summary(t, stats_of);
  const void* data = src.const_data_ptr();
  // a copy's memory is no gradient's, and a strided view's is laid out unlike the contiguous tensor a summary at the
  // same address would be of: neither is ever shared
  const void* ptr = copy.defined() || lay[0] >= 0 ? nullptr : data;
  if (stats_of >= 0 && ptr != nullptr && summ_ptr[stats_of] == ptr) {
    // NOTE [Views share a buffer] in tracer/summary/summariser.py: the very same kernel call on the very
    // same memory (a plan and its transposed twin share their geometry) gives the very same buffer
    const Plan* q = summ_plan[stats_of];
    if (q != nullptr && q->fn == plan->fn && std::memcmp(q->geom, plan->geom, sizeof(plan->geom)) == 0) {
      const Summ& s = summs[stats_of];
      int32_t idx = static_cast<int32_t>(summs.size());
      summs.push_back(Summ{plan->id, s.chunk, s.off, -1, s.wide});
      summ_owner.push_back(summ_owner[stats_of]);
      if ((s.wide & EVICTED) == 0) live_cells += plan->cells;
      summ_ptr.push_back(ptr);
      summ_plan.push_back(plan);
      return idx;
    }
  }
  int32_t chunk;
  int64_t off;
  wide = wide || plan->cells <= WIDE_CELLS;
  const int64_t words = wide ? plan->words : plan->stored;
  double* out = reserve(words, &chunk, &off);
  if (out == nullptr) return python_summary(t, stats_of);
  double* into = plan->cells > 0 && !wide ? scratch_for(plan->words) : out;
  int status = into == nullptr ? 2 : lay[0] >= 0 ? g_strided(data, plan->geom, lay, into) : plan->fn(data, plan->geom, into);
  if (status != 0) {
    chunk_used -= words;  // a float32 partial sum overflowed: torch recomputes in float64
    arena_used -= words;
    return python_summary(t, stats_of);
  }
  if (wide) {
    round_bf16(reinterpret_cast<float*>(out + 8), plan->cells);
  } else if (plan->cells > 0) {
    std::memcpy(out, into, 8 * sizeof(double));
    to_bf16(reinterpret_cast<const float*>(into + 8), plan->cells, reinterpret_cast<uint16_t*>(out + 8));
  }
  int32_t idx = static_cast<int32_t>(summs.size());
  summs.push_back(Summ{plan->id, chunk, off, -1, wide ? WIDE : 0});
  summ_owner.push_back(idx);
  live_cells += plan->cells;
  summ_ptr.push_back(ptr);
  summ_plan.push_back(plan);
  return idx;
}

std::vector<int32_t> Recorder::summarise_each(const std::vector<at::Tensor>& ts) {
  std::vector<int32_t> out(ts.size(), -1);
  at::NoGradGuard no_grad;
  std::lock_guard<std::mutex> g(mu);
  for (size_t i = 0; i < ts.size(); i++) {
    try {
      out[i] = summarise(ts[i], -1, true);
    } catch (...) {
      out[i] = -1;  // the caller summarises it in Python
    }
  }
  return out;
}

int32_t Recorder::arrived(int32_t id, size_t i, const at::Tensor& g) {  // mu held
  if (!g.defined()) return -1;
  size_t slot = static_cast<size_t>(in_off[id]) + i;
  if (slot < handoff.size()) {
    Handoff& h = handoff[slot];
    if (h.summ >= 0) {
      int32_t s = h.summ;
      h.summ = -1;  // it lived only while the tensor waited in the engine's input buffer
      if (h.ptr == g.const_data_ptr() && h.layout == layout_of(g)) return s;
    }
  }
  return summarise(g, -1);
}

void Recorder::on_post(int32_t id, const variable_list& gi, const variable_list& go) {
  int64_t t1 = now_ns();
  try {
    at::NoGradGuard no_grad;
    std::lock_guard<std::mutex> g(mu);
    RunRec run{id, pass, time_since_last(t1), static_cast<int32_t>(slots.size()), static_cast<int32_t>(go.size()),
               0, 0};
    for (size_t i = 0; i < go.size(); i++) slots.push_back(arrived(id, i, go[i]));
    run.gi_off = static_cast<int32_t>(slots.size());
    run.gi_n = static_cast<int32_t>(gi.size());
    int32_t first = child_off[id];
    int32_t n_children = child_off[id + 1] - first;
    // a view node sends on the memory that arrived, in another shape (NOTE [Views share a buffer])
    int32_t view_of = is_view[id] && !go.empty() ? slots[run.go_off] : -1;
    for (size_t j = 0; j < gi.size(); j++) {
      const at::Tensor& t = gi[j];
      int32_t s = summarise(t, j == 0 ? view_of : -1);
      slots.push_back(s);
      if (s < 0 || static_cast<int32_t>(j) >= n_children) continue;
      int32_t c = child_id[first + j];
      if (c >= 0) {
        size_t slot = static_cast<size_t>(in_off[c]) + static_cast<size_t>(child_nr[first + j]);
        if (senders[slot] == 1 && t.layout() == c10::kStrided) {
          handoff[slot] = Handoff{t.const_data_ptr(), layout_of(t), s};
        }
      }
      for (auto& so : sum_of[id]) {
        if (so.first == static_cast<int32_t>(j)) {
          at::Tensor& acc = sums[so.second];  // (our own copy: added to in place, bitwise `acc + t`)
          if (acc.defined()) {
            acc.add_(t.detach());
          } else {
            acc = t.detach().clone();
          }
        }
      }
    }
    runs.push_back(run);
  } catch (...) {
    std::lock_guard<std::mutex> g(mu);
    failures++;
  }
  mark_end();
}

void Recorder::on_pre(int32_t id, const variable_list& go) {
  try {
    at::NoGradGuard no_grad;
    std::lock_guard<std::mutex> g(mu);
    RunRec run{id, pass, std::numeric_limits<double>::quiet_NaN(), static_cast<int32_t>(slots.size()),
               static_cast<int32_t>(go.size()), 0, -1};
    for (size_t i = 0; i < go.size(); i++) slots.push_back(arrived(id, i, go[i]));
    if (!go.empty() && go[0].defined() && go[0].layout() == c10::kStrided) {
      arrival[static_cast<int32_t>(runs.size())] = {go[0].const_data_ptr(), layout_of(go[0])};
    }
    runs.push_back(run);
  } catch (...) {
    std::lock_guard<std::mutex> g(mu);
    failures++;
  }
  mark_end();
}

}  // namespace
