#pragma once
// gradscape native recorder: the summary arena's chunks, kept out of the C heap and reused.
//
// NOTE [Arena chunks]
//   A step's summaries live in chunks of doubles (256 KB, then doubling to 2 MB) that the step's tables
//   and thumbnails keep views of, so a chunk lives as long as the steps the sinks hold. Made as bytearrays,
//   they came from glibc's heap, among the training step's own activations, and were freed a few steps
//   later; with blocks of that size coming and going, glibc moved its mmap and trim thresholds and gave
//   the heap's top back to the system, and the next step's activations landed on new pages. A traced LeNet
//   step (W2) paid 1,634 page faults a step in some processes (1.93x a plain step against 1.32-1.37x with
//   glibc's heap held steady; bench/memory.py). So a chunk is its own mapping (mmap), and when the last view
//   of it goes, its memory waits in a pool for the next step's chunk of the same size: a training loop's
//   steps reuse the same pages and the C heap never sees them. The pool holds at most POOL_CAP bytes and
//   is touched only with the GIL held (a chunk is made and freed only with it). A chunk's memory is not
//   cleared: the kernel writes every double the tables read, as it did into a new bytearray.
#include <Python.h>

#include <cstddef>
#include <cstdlib>
#include <utility>
#include <vector>

#ifndef _WIN32
#include <sys/mman.h>
#endif

namespace {

constexpr size_t POOL_CAP = size_t{64} << 20;

struct ChunkObject {
  PyObject_HEAD
  char* data;
  Py_ssize_t size;
};

std::vector<std::pair<size_t, char*>> g_pool;  // (bytes, memory) of chunks no view holds; the GIL guards it
size_t g_pool_bytes = 0;

char* map_bytes(size_t n) {
#ifdef _WIN32
  return static_cast<char*>(std::malloc(n));
#else
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
#endif
}

void unmap_bytes(char* p, size_t n) {
#ifdef _WIN32
  (void)n;
  std::free(p);
#else
  munmap(p, n);
#endif
}

void chunk_dealloc(PyObject* obj) {
  ChunkObject* c = reinterpret_cast<ChunkObject*>(obj);
  size_t n = static_cast<size_t>(c->size);
  if (c->data != nullptr) {
    if (g_pool_bytes + n <= POOL_CAP) {
      g_pool.emplace_back(n, c->data);
      g_pool_bytes += n;
    } else {
      unmap_bytes(c->data, n);
    }
  }
  Py_TYPE(obj)->tp_free(obj);
}

int chunk_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
  ChunkObject* c = reinterpret_cast<ChunkObject*>(obj);
  return PyBuffer_FillInfo(view, obj, c->data, c->size, 0, flags);
}

PyBufferProcs chunk_buffer = {chunk_getbuffer, nullptr};

PyTypeObject ChunkType = {PyVarObject_HEAD_INIT(nullptr, 0)};

int chunk_type_ready() {
  ChunkType.tp_name = "gradscape._recorder.Chunk";
  ChunkType.tp_basicsize = sizeof(ChunkObject);
  ChunkType.tp_flags = Py_TPFLAGS_DEFAULT;
  ChunkType.tp_dealloc = chunk_dealloc;
  ChunkType.tp_as_buffer = &chunk_buffer;
  ChunkType.tp_doc = "one chunk of the summary arena (NOTE [Arena chunks]): a writable buffer";
  return PyType_Ready(&ChunkType);
}

// A chunk of `n` bytes, from the pool when one of that size waits there; nullptr (a Python error set) when
// no memory could be had. The GIL must be held.
PyObject* new_chunk(size_t n) {
  char* data = nullptr;
  for (size_t i = g_pool.size(); i-- > 0;) {  // the most recently freed first: its pages are the warmest
    if (g_pool[i].first == n) {
      data = g_pool[i].second;
      g_pool_bytes -= n;
      g_pool.erase(g_pool.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  if (data == nullptr && (data = map_bytes(n)) == nullptr) {
    PyErr_NoMemory();
    return nullptr;
  }
  ChunkObject* c = PyObject_New(ChunkObject, &ChunkType);
  if (c == nullptr) {
    unmap_bytes(data, n);
    return nullptr;
  }
  c->data = data;
  c->size = static_cast<Py_ssize_t>(n);
  return reinterpret_cast<PyObject*>(c);
}

char* chunk_data(PyObject* obj) { return reinterpret_cast<ChunkObject*>(obj)->data; }

// chunk(nbytes) -> a Chunk (the Python summariser's arena takes its chunks here too)
PyObject* mod_chunk(PyObject*, PyObject* arg) {
  Py_ssize_t n = PyLong_AsSsize_t(arg);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  if (n <= 0) {
    PyErr_Format(PyExc_ValueError, "chunk: nbytes must be positive, got %zd", n);
    return nullptr;
  }
  return new_chunk(static_cast<size_t>(n));
}

// pool() -> (chunks waiting, their bytes): for tests and benchmarks
PyObject* mod_pool(PyObject*, PyObject*) {
  return Py_BuildValue("(nn)", static_cast<Py_ssize_t>(g_pool.size()), static_cast<Py_ssize_t>(g_pool_bytes));
}

}  // namespace
