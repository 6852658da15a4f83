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
//     summaries that still have a picture hold more cells than the budget. Each summary's place in the order
//     is taken as the kernel writes its statistics (`summ_keys`); `evict` sorts the summaries made since it
//     last ran, merges them with those it kept then (in order already), marks those past the prefix EVICTED,
//     and `pack_arena` moves the arena's blocks from the first that lost its picture on down, in place: the 8
//     statistics of every block (the step's tables read them at the end), and the cells of a block some
//     summary still shows. Blocks keep their order and only move towards the front, so one pass of `memmove`
//     does it; the chunks emptied are filled again before a new one is made. The step's end applies the budget
//     exactly as before, over every summary: it finds the evicted ones past the prefix again, and leaves out
//     the same pictures with the same count and largest norm in `st.meta["thumbs_left_out"]`.
//     (100k-node loop: 7 runs of `evict`, about 40 ms of a 1.4 s step; the arena peaks near 43 MiB.)
#pragma once
#include "recorder.h"

namespace {

bool budget_before(const BudgetKey& a, const BudgetKey& b) {
  if (a.flagged != b.flagged) return a.flagged;
  if (a.norm != b.norm) return a.norm > b.norm;
  return a.idx < b.idx;
}

void Recorder::evict() {  // mu held
  const int64_t growth = std::max<int64_t>(budget / 4, MAX_CHUNK);  // doubles: a budget of bfloat16 cells
  evict_at = arena_used + growth;
  if (live_cells <= budget) return;
  // the summaries made since the last time, in the budget's order, merged with those shown then (in order)
  std::vector<BudgetKey> fresh;
  for (size_t i = budget_scanned; i < summs.size(); i++) {
    const Summ& s = summs[i];
    const Plan* p = summ_plan[i];
    if (s.plan < 0 || s.chunk < 0 || (s.wide & EVICTED) != 0 || p == nullptr || p->cells == 0) continue;
    fresh.push_back(summ_keys[i]);
  }
  budget_scanned = summs.size();
  std::sort(fresh.begin(), fresh.end(), budget_before);
  std::vector<BudgetKey> all;
  all.reserve(budget_shown.size() + fresh.size());
  std::merge(budget_shown.begin(), budget_shown.end(), fresh.begin(), fresh.end(), std::back_inserter(all),
             budget_before);
  budget_shown.clear();
  int64_t total = 0;
  bool past = false;  // the first that does not fit, and every one after it
  int32_t first = static_cast<int32_t>(summs.size());  // the first block that loses its picture
  for (const BudgetKey& k : all) {
    const int64_t cells = summ_plan[k.idx]->cells;
    past = past || total + cells > budget;
    if (!past) {
      total += cells;
      budget_shown.push_back(k);
    } else {
      summs[k.idx].wide |= EVICTED;
      live_cells -= cells;
      first = std::min(first, summ_owner[k.idx]);
    }
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
