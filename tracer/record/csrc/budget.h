// gradscape native recorder: the thumbnail budget applied while the step records (see recorder.h).
//
// NOTE [Budget while recording]
//     The step's thumbnail budget (NOTE [Thumbnail budget] in tracer/summary/budget.py) keeps the pictures of
//     the largest gradients: ordered by NaN or Inf first, then by norm, largest first, ties by position, the
//     longest prefix whose cells fit. A gradient that falls past that prefix stays past it as more gradients
//     arrive (they can only add cells ahead of it), so the kernel's summaries can be cut while the backward
//     runs, long before the step's end applies the budget to everything (Python's summaries and the module
//     sums as well). Without that, a 100k-node step of small ops held 106 MiB of pictures in its arena until
//     its end, to keep 16 MiB of them.
//
//     `evict` runs when the arena has grown by a quarter budget's worth of doubles since it last ran and the
//     summaries that still have a picture hold more cells than the budget. It hands those summaries' raw
//     statistics and cells, in order, to the Python budget (`past_budget_raw`, set by `configure`), so that the
//     order exists in one place, marks the ones past the prefix EVICTED, and `pack_arena` moves the arena's
//     blocks from the first that lost its picture on down, in place: the 8 statistics of every block (the
//     step's tables read them at the end), and the cells of a block some summary still shows. Blocks keep their
//     order and only move towards the front, so one pass of `memmove` does it; the chunks emptied are filled
//     again before a new one is made. The step's end applies the budget exactly as before, over every summary:
//     it finds the evicted ones past the prefix again, and leaves out the same pictures with the same count and
//     largest norm in `st.meta["thumbs_left_out"]`. If the Python call fails, nothing is evicted that time (the
//     arena grows; the step's end still applies the budget). (100k-node loop: 6 runs a step, each ordering about
//     40k summaries in about 1 ms of Python; the traced step's time and peak memory as before.)
#pragma once
#include "recorder.h"

namespace {

// The positions (into `live`) past the budget, from the Python budget; empty if it failed
std::vector<int64_t> Recorder::ask_budget(const std::vector<int32_t>& live) {  // mu held
  std::vector<int64_t> past;
  PyGILState_STATE st = PyGILState_Ensure();
  const Py_ssize_t n = static_cast<Py_ssize_t>(live.size());
  PyObject* raw = PyBytes_FromStringAndSize(nullptr, n * 8 * static_cast<Py_ssize_t>(sizeof(double)));
  PyObject* cells = PyBytes_FromStringAndSize(nullptr, n * static_cast<Py_ssize_t>(sizeof(int64_t)));
  PyObject* res = nullptr;
  if (raw != nullptr && cells != nullptr) {
    double* to = reinterpret_cast<double*>(PyBytes_AS_STRING(raw));
    int64_t* c = reinterpret_cast<int64_t*>(PyBytes_AS_STRING(cells));
    for (Py_ssize_t k = 0; k < n; k++) {
      const Summ& s = summs[live[k]];
      std::memcpy(to + 8 * k, reinterpret_cast<const double*>(PyByteArray_AS_STRING(chunks[s.chunk])) + s.off,
                  8 * sizeof(double));
      c[k] = summ_plan[live[k]]->cells;
    }
    res = PyObject_CallFunction(past_budget, "OOL", raw, cells, static_cast<long long>(budget));
  }
  if (res != nullptr && PyBytes_Check(res)) {
    const int64_t* at = reinterpret_cast<const int64_t*>(PyBytes_AS_STRING(res));
    past.assign(at, at + PyBytes_GET_SIZE(res) / static_cast<Py_ssize_t>(sizeof(int64_t)));
  }
  if (PyErr_Occurred() != nullptr) PyErr_Clear();
  Py_XDECREF(res);
  Py_XDECREF(cells);
  Py_XDECREF(raw);
  PyGILState_Release(st);
  return past;
}

void Recorder::evict() {  // mu held
  const int64_t growth = std::max<int64_t>(budget / 4, MAX_CHUNK);  // doubles: a budget of bfloat16 cells
  evict_at = arena_used + growth;
  if (live_cells <= budget || past_budget == nullptr) return;
  std::vector<int32_t> live;  // the kernel's summaries that still have a picture, in order
  for (size_t i = 0; i < summs.size(); i++) {
    const Summ& s = summs[i];
    const Plan* p = summ_plan[i];
    if (s.plan < 0 || s.chunk < 0 || (s.wide & EVICTED) != 0 || p == nullptr || p->cells == 0) continue;
    live.push_back(static_cast<int32_t>(i));
  }
  int32_t first = static_cast<int32_t>(summs.size());  // the first block that loses its picture
  for (int64_t k : ask_budget(live)) {
    if (k < 0 || k >= static_cast<int64_t>(live.size())) continue;
    const int32_t i = live[static_cast<size_t>(k)];
    summs[i].wide |= EVICTED;
    live_cells -= summ_plan[i]->cells;
    first = std::min(first, summ_owner[i]);
  }
  pack_arena(first);
  evict_at = arena_used + growth;
}

// Move the arena's blocks from that of summary `first` on down to the front, in place: the blocks before it stay
void Recorder::pack_arena(int32_t first) {  // mu held
  if (first >= static_cast<int32_t>(summs.size())) return;
  const size_t n = summs.size() - static_cast<size_t>(first);
  std::vector<char> shown(n, 0);  // by block owner: some summary reading the block keeps its picture
  for (size_t i = first; i < summs.size(); i++) {
    const Summ& s = summs[i];
    if (s.plan >= 0 && s.chunk >= 0 && (s.wide & EVICTED) == 0 && summ_owner[i] >= first) {
      shown[summ_owner[i] - first] = 1;
    }
  }
  std::vector<std::pair<int32_t, int64_t>> moved(n, {-1, 0});  // owner -> (chunk, offset) now
  size_t wc = static_cast<size_t>(summs[first].chunk);
  int64_t wo = summs[first].off;
  for (size_t i = first; i < summs.size(); i++) {  // owners in the order their blocks were made: front to back
    Summ& s = summs[i];
    if (s.plan < 0 || s.chunk < 0 || summ_owner[i] != static_cast<int32_t>(i)) continue;
    const Plan* p = summ_plan[i];
    const int64_t words = !shown[i - first] ? 8 : ((s.wide & WIDE) != 0 ? p->words : p->stored);
    while (chunk_caps[wc] - wo < words) {  // (the block's own chunk has room: this stops there at the latest)
      wc++;
      wo = 0;
    }
    double* to = reinterpret_cast<double*>(PyByteArray_AS_STRING(chunks[wc])) + wo;
    const double* from = reinterpret_cast<const double*>(PyByteArray_AS_STRING(chunks[s.chunk])) + s.off;
    if (to != from) std::memmove(to, from, static_cast<size_t>(words) * sizeof(double));
    moved[i - first] = {static_cast<int32_t>(wc), wo};
    wo += words;
  }
  for (size_t i = first; i < summs.size(); i++) {
    Summ& s = summs[i];
    if (s.plan < 0 || s.chunk < 0 || summ_owner[i] < first) continue;  // (a view of a block that stays)
    const auto& at = moved[summ_owner[i] - first];
    s.chunk = at.first;
    s.off = at.second;
  }
  arena_used = wo;
  for (size_t c = 0; c < wc; c++) arena_used += chunk_caps[c];  // (what a chunk's skipped end wastes counts too)
  chunk_idx = wc;
  chunk_ptr = reinterpret_cast<double*>(PyByteArray_AS_STRING(chunks[wc]));
  chunk_cap = chunk_caps[wc];
  chunk_used = wo;
}

}  // namespace
