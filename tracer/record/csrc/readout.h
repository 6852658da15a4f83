// gradscape native recorder: what Python reads of a step, as bytes and lists (see recorder.h).
#pragma once
#include "recorder.h"

namespace {

struct PyRecorder {
  PyObject_HEAD Recorder* rec;
};

Recorder* R(PyObject* self) { return reinterpret_cast<PyRecorder*>(self)->rec; }

// What the step recorded, let go once Python has read it (`release`): the records were copied out as bytes, and
// the arena's chunks are held by the step's tables, which may free them long before this recorder is freed
// (NOTE [Arena compaction] in tracer/record/arena_compact.py).
void Recorder::drop_records() {
  for (PyObject* o : py) Py_DECREF(o);
  for (PyObject* o : chunks) Py_DECREF(o);
  std::vector<PyObject*>().swap(py);
  std::vector<PyObject*>().swap(chunks);
  std::vector<int64_t>().swap(chunk_caps);
  std::vector<int32_t>().swap(summ_owner);
  chunk_idx = 0;
  chunk_ptr = nullptr;
  chunk_cap = chunk_used = 0;
  std::vector<RunRec>().swap(runs);
  std::vector<int32_t>().swap(slots);
  std::vector<Summ>().swap(summs);
  std::vector<const void*>().swap(summ_ptr);
  std::vector<const Plan*>().swap(summ_plan);
  std::vector<Handoff>().swap(handoff);
  arrival.clear();
}

PyObject* bytes_of(const void* p, size_t n) {
  return PyBytes_FromStringAndSize(static_cast<const char*>(p), static_cast<Py_ssize_t>(n));
}

// graph(first) -> (name codes int32, kinds int8, seq uint64, child_off int32, child_id int32, child_nr int32,
// out_off int32, out_ndim int32, out_dtype int8, out_dims int64) of the nodes from `first` on (the offsets
// relative to the first of them)
PyObject* rec_graph(PyObject* self, PyObject* arg) {
  long first = PyLong_AsLong(arg);
  if (first == -1 && PyErr_Occurred()) return nullptr;
  Recorder* r = R(self);
  size_t n = r->name.size();
  if (first < 0 || static_cast<size_t>(first) > n) {
    PyErr_SetString(PyExc_IndexError, "graph: bad first node");
    return nullptr;
  }
  size_t c0 = r->child_off[first], c1 = r->child_off[n];
  std::vector<int32_t> off(r->child_off.begin() + first, r->child_off.end());
  for (auto& o : off) o -= static_cast<int32_t>(c0);
  size_t o0 = r->in_off[first], o1 = r->in_off[n];
  std::vector<int32_t> ooff(r->in_off.begin() + first, r->in_off.end());
  for (auto& o : ooff) o -= static_cast<int32_t>(o0);
  size_t d0 = 0, d1 = 0;  // the dims of outputs [o0, o1)
  for (size_t i = 0; i < o0; i++) d0 += r->out_ndim[i] > 0 ? r->out_ndim[i] : 0;
  d1 = d0;
  for (size_t i = o0; i < o1; i++) d1 += r->out_ndim[i] > 0 ? r->out_ndim[i] : 0;
  return Py_BuildValue("(NNNNNNNNNN)", bytes_of(r->name.data() + first, 4 * (n - first)),
                       bytes_of(r->kind.data() + first, n - first), bytes_of(r->seq.data() + first, 8 * (n - first)),
                       bytes_of(off.data(), 4 * off.size()), bytes_of(r->child_id.data() + c0, 4 * (c1 - c0)),
                       bytes_of(r->child_nr.data() + c0, 4 * (c1 - c0)), bytes_of(ooff.data(), 4 * ooff.size()),
                       bytes_of(r->out_ndim.data() + o0, 4 * (o1 - o0)),
                       bytes_of(r->out_dtype.data() + o0, o1 - o0), bytes_of(r->out_dims.data() + d0, 8 * (d1 - d0)));
}

// structure() -> bytes: the node and slot counts, then every node's name code, kind and slot offsets, and every
// slot's child and input number, as walked (what a graph's structure hash is made of)
PyObject* rec_structure(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  int64_t counts[2] = {static_cast<int64_t>(r->name.size()), static_cast<int64_t>(r->child_id.size())};
  std::string out(reinterpret_cast<const char*>(counts), sizeof(counts));
  auto add = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  add(r->name.data(), 4 * r->name.size());
  add(r->kind.data(), r->kind.size());
  add(r->child_off.data(), 4 * r->child_off.size());
  add(r->child_id.data(), 4 * r->child_id.size());
  add(r->child_nr.data(), 4 * r->child_nr.size());
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

// records() -> (runs bytes, slots bytes, summaries bytes, chunks list, python summaries list, failures)
PyObject* rec_records(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  PyObject* chunks = PyList_New(static_cast<Py_ssize_t>(r->chunks.size()));
  for (size_t i = 0; i < r->chunks.size(); i++) {
    Py_INCREF(r->chunks[i]);
    PyList_SET_ITEM(chunks, i, r->chunks[i]);
  }
  PyObject* py = PyList_New(static_cast<Py_ssize_t>(r->py.size()));
  for (size_t i = 0; i < r->py.size(); i++) {
    Py_INCREF(r->py[i]);
    PyList_SET_ITEM(py, i, r->py[i]);
  }
  return Py_BuildValue("(NNNNNL)", bytes_of(r->runs.data(), sizeof(RunRec) * r->runs.size()),
                       bytes_of(r->slots.data(), 4 * r->slots.size()),
                       bytes_of(r->summs.data(), sizeof(Summ) * r->summs.size()), chunks, py,
                       static_cast<long long>(r->failures));
}

// tables() -> (run rows, run starts, run ks, raw statistics, nonfinite): the runs' positions by node in the order
// they ran (int64 bytes), where each node's begin (int64, one more than the nodes), each run's index among its node's
// runs (int64), the kernel's 8 raw statistics of every summary (float64; NaN for Python's), whether one of the
// kernel's summaries counted a NaN or an Inf (NOTE [Step tables]), and the thumbnail cells of the summaries the budget
// left out while recording (NOTE [Budget while recording] in budget.h)
PyObject* rec_tables(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  size_t n = r->name.size(), m = r->runs.size();
  std::vector<int64_t> start(n + 1, 0), rows(m), k(m);
  for (const auto& run : r->runs) {
    if (run.node < 0 || static_cast<size_t>(run.node) >= n) {
      PyErr_SetString(PyExc_RuntimeError, "tables(): a run of a node that was not walked");
      return nullptr;
    }
    start[run.node + 1]++;
  }
  for (size_t i = 0; i < n; i++) start[i + 1] += start[i];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (size_t i = 0; i < m; i++) {
    int32_t node = r->runs[i].node;
    k[i] = fill[node] - start[node];
    rows[fill[node]++] = static_cast<int64_t>(i);
  }
  std::vector<double> raw(8 * r->summs.size(), std::numeric_limits<double>::quiet_NaN());
  bool nonfinite = false;
  long long evicted = 0;
  for (size_t i = 0; i < r->summs.size(); i++) {
    const Summ& s = r->summs[i];
    if (s.plan < 0 || s.chunk < 0 || static_cast<size_t>(s.chunk) >= r->chunks.size()) continue;
    if ((s.wide & EVICTED) != 0 && r->summ_plan[i] != nullptr) evicted += r->summ_plan[i]->cells;
    const double* arena = reinterpret_cast<const double*>(PyByteArray_AS_STRING(r->chunks[s.chunk]));
    std::memcpy(raw.data() + 8 * i, arena + s.off, 8 * sizeof(double));
    nonfinite = nonfinite || arena[s.off + 5] > 0 || arena[s.off + 6] > 0;  // (min, max, sum, sumsq, nonzero, nan, inf, n)
  }
  return Py_BuildValue("(NNNNNL)", bytes_of(rows.data(), 8 * m), bytes_of(start.data(), 8 * (n + 1)),
                       bytes_of(k.data(), 8 * m), bytes_of(raw.data(), 8 * raw.size()), PyBool_FromLong(nonfinite),
                       evicted);
}

// The ints of sequence `arg` into `out`; false with the error set (`what`: the message for a non-sequence)
bool read_longs(PyObject* arg, const char* what, std::vector<long>* out) {
  PyObject* seq = PySequence_Fast(arg, what);
  if (seq == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  out->reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return false;
    }
    out->push_back(v);
  }
  Py_DECREF(seq);
  return true;
}

// The raw statistics (min, max, sum, sumsq, nonzero, nan, inf, n) of kernel summary `row`, or nullptr where the
// kernel did not make it (Python's summary, no row); `r->mu` held
const double* kernel_stats(const Recorder* r, long row) {
  if (row < 0 || static_cast<size_t>(row) >= r->summs.size()) return nullptr;
  const Summ& s = r->summs[row];
  if (s.plan < 0 || s.chunk < 0 || static_cast<size_t>(s.chunk) >= r->chunks.size()) return nullptr;
  return reinterpret_cast<const double*>(PyByteArray_AS_STRING(r->chunks[s.chunk])) + s.off;
}

// The L2 norm of the finite elements, as `stats_from_raw` makes it
double finite_norm(const double* a) { return a[7] <= 0 ? 0.0 : std::sqrt(std::max(a[3], 0.0)); }

// The L2 norm as torch's norm gives it: NaN where the statistics counted a NaN, inf where an Inf and no NaN (the
// kernel's sums leave both out), else the finite elements' norm
double torch_norm(const double* a) { return a[5] > 0 ? std::nan("") : a[6] > 0 ? HUGE_VAL : finite_norm(a); }

// The summary row of what arrived in run `pos`'s slot 0 into `row` (-1: none), and that summary's raw statistics, or
// nullptr where the kernel did not make it; `r->mu` held
const double* arrival_stats(const Recorder* r, long pos, int32_t* row) {
  *row = -1;
  if (pos >= 0 && static_cast<size_t>(pos) < r->runs.size()) {
    const RunRec& run = r->runs[pos];
    if (run.go_n > 0 && static_cast<size_t>(run.go_off) < r->slots.size()) *row = r->slots[run.go_off];
  }
  return kernel_stats(r, *row);
}

PyObject* float_or_none(const double* a, double v) {
  if (a != nullptr) return PyFloat_FromDouble(v);
  Py_INCREF(Py_None);
  return Py_None;
}

// row_norms(rows) -> [norm or None]: each kernel summary's L2 norm as `torch.linalg.vector_norm` gives it (NaN where
// it counted a NaN, inf where an Inf: the kernel's sums leave them out), None for a summary Python made or no row
// (what an optimizer stepped with, on a traced step: NOTE [Stepped norms read from the summaries] in
// tracer/monitor/stepped.py)
PyObject* rec_row_norms(PyObject* self, PyObject* arg) {
  std::vector<long> rows;
  if (!read_longs(arg, "row_norms: expected a sequence of summary rows", &rows)) return nullptr;
  Recorder* r = R(self);
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(rows.size()));
  if (out == nullptr) return nullptr;
  std::lock_guard<std::mutex> g(r->mu);
  for (size_t i = 0; i < rows.size(); i++) {
    const double* a = kernel_stats(r, rows[i]);
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), float_or_none(a, a == nullptr ? 0.0 : torch_norm(a)));
  }
  return out;
}

// first_slots(name codes) -> [(node, sent row, came row)]: for each node that ran whose name code is one of
// `codes`, in id order, the summary rows of its first run's grad_inputs[0] and grad_outputs[0], when it has both
PyObject* rec_first_slots(PyObject* self, PyObject* arg) {
  std::vector<long> codes;
  if (!read_longs(arg, "first_slots: expected a sequence of name codes", &codes)) return nullptr;
  Recorder* r = R(self);
  std::lock_guard<std::mutex> g(r->mu);
  size_t n = r->name.size();
  std::vector<int32_t> first(n, -1);
  for (size_t i = r->runs.size(); i-- > 0;) {  // from the last run back: each node ends at its first
    int32_t node = r->runs[i].node;
    if (node >= 0 && static_cast<size_t>(node) < n) first[node] = static_cast<int32_t>(i);
  }
  PyObject* out = PyList_New(0);
  for (size_t id = 0; id < n; id++) {
    if (first[id] < 0 || std::find(codes.begin(), codes.end(), r->name[id]) == codes.end()) continue;
    const RunRec& run = r->runs[first[id]];
    if (run.gi_n <= 0 || run.go_n <= 0) continue;
    int32_t s = r->slots[run.gi_off], c = r->slots[run.go_off];
    if (s < 0 || c < 0) continue;
    PyObject* item = Py_BuildValue("(iii)", static_cast<int>(id), s, c);
    PyList_Append(out, item);
    Py_DECREF(item);
  }
  return out;
}

// sums() -> [tensor or None] the module sums added up in the hooks
PyObject* rec_sums(PyObject* self, PyObject*) {
  Recorder* r = R(self);
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(r->sums.size()));
  for (size_t i = 0; i < r->sums.size(); i++) {
    PyObject* t = r->sums[i].defined() ? THPVariable_Wrap(r->sums[i]) : (Py_INCREF(Py_None), Py_None);
    PyList_SET_ITEM(out, i, t);
  }
  return out;
}

}  // namespace
