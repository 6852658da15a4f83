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
//     `evict` runs when the arena has grown by a budget's worth of bfloat16 cells since it last ran and the
//     summaries that still have a picture hold more cells than the budget: it marks those past the prefix
//     EVICTED, then `pack_arena` moves every arena block down, in place, to the front of the chunks: the 8
//     statistics of every block (the step's tables read them at the end), and the cells of a block some summary
//     still shows. Blocks keep their order, and a block only moves towards the front, so one pass of `memmove`
//     does it; the chunks emptied are filled again before a new one is made. The step's end applies the budget
//     exactly as before, over every summary: it finds the evicted ones past the prefix again, and leaves out
//     the same pictures with the same count and largest norm in `st.meta["thumbs_left_out"]`.
#pragma once
#include "recorder.h"

namespace {

// a summary's place in the budget's order: (NaN or Inf first, then norm, largest first; ties by position)
struct BudgetKey {
  bool flagged;
  double norm;  // -1 for NaN, as the Python budget reads it (`TensorTable.norms`)
  int32_t idx;
};

BudgetKey budget_key(const double* raw, int32_t idx) {  // raw: min, max, sum, sum of squares, nonzero, nan, inf, n
  double norm = 0.0;
  if (raw[7] > 0) norm = std::isnan(raw[3]) ? -1.0 : std::sqrt(raw[3] < 0.0 ? 0.0 : raw[3]);
  return BudgetKey{raw[5] + raw[6] > 0, norm, idx};
}

void Recorder::evict() {  // mu held
  const int64_t growth = std::max<int64_t>(budget / 4, MAX_CHUNK);  // doubles: a budget of bfloat16 cells
  evict_at = arena_used + growth;
  if (live_cells <= budget) return;
  std::vector<BudgetKey> live;
  for (size_t i = 0; i < summs.size(); i++) {
    const Summ& s = summs[i];
    const Plan* p = summ_plan[i];
    if (s.plan < 0 || s.chunk < 0 || (s.wide & EVICTED) != 0 || p == nullptr || p->cells == 0) continue;
    const double* raw = reinterpret_cast<const double*>(PyByteArray_AS_STRING(chunks[s.chunk])) + s.off;
    live.push_back(budget_key(raw, static_cast<int32_t>(i)));
  }
  std::sort(live.begin(), live.end(), [](const BudgetKey& a, const BudgetKey& b) {
    if (a.flagged != b.flagged) return a.flagged;
    if (a.norm != b.norm) return a.norm > b.norm;
    return a.idx < b.idx;
  });
  int64_t total = 0;
  bool past = false;
  for (const BudgetKey& k : live) {
    const int64_t cells = summ_plan[k.idx]->cells;
    past = past || total + cells > budget;
    if (past) {
      summs[k.idx].wide |= EVICTED;
      live_cells -= cells;
    } else {
      total += cells;
    }
  }
  pack_arena();
  evict_at = arena_used + growth;
}

void Recorder::pack_arena() {  // mu held
  std::vector<char> shown(summs.size(), 0);  // by block owner: some summary reading the block keeps its picture
  for (size_t i = 0; i < summs.size(); i++) {
    if (summs[i].plan >= 0 && summs[i].chunk >= 0 && (summs[i].wide & EVICTED) == 0) shown[summ_owner[i]] = 1;
  }
  std::vector<std::pair<int32_t, int64_t>> moved(summs.size(), {-1, 0});  // owner -> (chunk, offset) now
  size_t wc = 0;
  int64_t wo = 0;
  for (size_t i = 0; i < summs.size(); i++) {  // owners in the order their blocks were made: front to back
    Summ& s = summs[i];
    if (s.plan < 0 || s.chunk < 0 || summ_owner[i] != static_cast<int32_t>(i)) continue;
    const Plan* p = summ_plan[i];
    const int64_t words = !shown[i] ? 8 : ((s.wide & WIDE) != 0 ? p->words : p->stored);
    while (chunk_caps[wc] - wo < words) {  // (the block's own chunk has room: this stops there at the latest)
      wc++;
      wo = 0;
    }
    double* to = reinterpret_cast<double*>(PyByteArray_AS_STRING(chunks[wc])) + wo;
    const double* from = reinterpret_cast<const double*>(PyByteArray_AS_STRING(chunks[s.chunk])) + s.off;
    if (to != from) std::memmove(to, from, static_cast<size_t>(words) * sizeof(double));
    moved[i] = {static_cast<int32_t>(wc), wo};
    wo += words;
  }
  arena_used = 0;
  for (size_t c = 0; c < wc; c++) arena_used += chunk_caps[c];  // (what a chunk's skipped end wastes counts too)
  arena_used += wo;
  for (size_t i = 0; i < summs.size(); i++) {
    Summ& s = summs[i];
    if (s.plan < 0 || s.chunk < 0) continue;
    const auto& at = moved[summ_owner[i]];
    s.chunk = at.first;
    s.off = at.second;
  }
  chunk_idx = wc;
  chunk_ptr = reinterpret_cast<double*>(PyByteArray_AS_STRING(chunks[wc]));
  chunk_cap = chunk_caps[wc];
  chunk_used = wo;
}

}  // namespace
