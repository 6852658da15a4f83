// gradscape native recorder: the walk's index of the nodes it has seen (see recorder.h).
#pragma once
#include <cstdint>
#include <vector>

namespace {

// Node address -> its id in the step, by open addressing (linear probing, a power-of-two table at most half
// full). The walk asks it three or four times a node; std::unordered_map allocated a list node for each
// insert and hashed through it, a sizable share of the walk of a graph of small ops.
class NodeIndex {
 public:
  int32_t find(const void* key) const {
    if (keys_.empty()) return -1;
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return vals_[i];
      if (keys_[i] == nullptr) return -1;
    }
  }

  // `key` must not be in the index yet (the walk asks `find` first)
  void insert(const void* key, int32_t id) {
    if (2 * (size_ + 1) > keys_.size()) grow(keys_.empty() ? 64 : 2 * keys_.size());
    place(key, id);
    size_++;
  }

  // room for `n` keys without growing
  void reserve(size_t n) {
    size_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    if (cap > keys_.size()) grow(cap);
  }

  void clear() {
    std::vector<const void*>().swap(keys_);
    std::vector<int32_t>().swap(vals_);
    size_ = 0;
    mask_ = 0;
    shift_ = 64;
  }

 private:
  std::vector<const void*> keys_;
  std::vector<int32_t> vals_;
  size_t size_ = 0, mask_ = 0;
  int shift_ = 64;

  size_t slot_of(const void* key) const {
    // Fibonacci hashing of the address: the product's top bits (its low bits are the allocator's alignment)
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(key) * 11400714819323198485ull) >> shift_);
  }

  void place(const void* key, int32_t id) {
    size_t i = slot_of(key);
    while (keys_[i] != nullptr) i = (i + 1) & mask_;
    keys_[i] = key;
    vals_[i] = id;
  }

  void grow(size_t cap) {
    std::vector<const void*> keys(cap, nullptr);
    std::vector<int32_t> vals(cap, -1);
    keys.swap(keys_);
    vals.swap(vals_);
    mask_ = cap - 1;
    shift_ = 64;
    for (size_t c = cap; c > 1; c >>= 1) shift_--;
    for (size_t i = 0; i < keys.size(); i++) {
      if (keys[i] != nullptr) place(keys[i], vals[i]);
    }
  }
};

}  // namespace
