// libFuzzer target over the public C ABI: selscan_fwd / selscan_bwd (dense, or with the serving fields: packed
// sequences, a state pool, cache indices with padding, has_initial_state) and their workspace queries, and the
// decode step selscan_state_update.
//
// The input is decoded into a problem (small random dims, dtypes, flags, index contents valid or violating their
// contract), argument structs with every tensor descriptor laid out in one of several legal layouts and then, at
// a fuzzed rate, mutated (dtype, ndim, a size, a stride, presence, alignment, struct_size, exec fields). Every
// tensor the decoder points at is its own heap block of exactly the bytes its descriptor addresses, and the
// argument/exec structs are heap blocks of exactly struct_size bytes, so any read or write outside them is an
// AddressSanitizer report. Beyond "no crash, no sanitizer report" each call must satisfy:
//   - a failing call leaves a message in selscan_last_error() and writes no output and no in-place tensor;
//   - a call is rejected when an output's elements overlap each other, or an output was pointed at another
//     tensor's memory;
//   - a query that fails makes the call itself fail the same way (validation comes before any memory access);
//   - a successful call leaves every input byte and every byte between output elements untouched, writes every
//     output element (when the inputs are finite), writes no pool slot that no sequence names, and gives the same
//     results with another thread count.
// Shapes are capped so that one input runs in milliseconds.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "selscan/selscan.h"

namespace {

// Bt * D * L * (dstate rounded up to 8, the CPU kernels' vector width; complex: twice that). Caps one input's
// four calls at a few milliseconds under ASan; still allows three chunks (L = 6145) for Bt * D = 1 and two
// (L = 2049) for Bt * D <= 3, with dstate <= 8.
constexpr int64_t kMaxWork = 50000;
constexpr int64_t kMaxBytes = int64_t{2} << 20;  // larger descriptors are not backed (see Slot::backed)
constexpr unsigned char kPoison = 0xFF;          // output bytes before a call (NaN in every float format)

[[noreturn]] void die(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz_abi: property violated: %s %s\n", what, detail);
  std::fflush(stderr);
  std::abort();
}

int64_t dtype_bytes(int32_t dt) {  // as the library sizes an element (unknown dtypes: 4)
  if (dt == SELSCAN_DTYPE_FLOAT16 || dt == SELSCAN_DTYPE_BFLOAT16) return 2;
  if (dt == SELSCAN_DTYPE_COMPLEX64 || dt == SELSCAN_DTYPE_INT64) return 8;
  return dt == SELSCAN_DTYPE_BOOL ? 1 : 4;
}

// True one time in `n` (never once the input is used up: FuzzedDataProvider then returns the range's minimum,
// so a short input decodes to a plain valid call).
bool one_in(FuzzedDataProvider& f, int n) { return f.ConsumeIntegralInRange<int>(1, n) == n; }

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A finite value with |v| in [2^-4, 2^2) in the dtype's bits (complex: two floats; index dtypes: random bits).
void tame_element(unsigned char* p, int32_t dt, uint64_t& rng) {
  const uint64_t r = splitmix(rng);
  if (dt == SELSCAN_DTYPE_INT32 || dt == SELSCAN_DTYPE_INT64 || dt == SELSCAN_DTYPE_BOOL) {  // a float as an index
    std::memcpy(p, &r, static_cast<size_t>(dtype_bytes(dt)));
  } else if (dt == SELSCAN_DTYPE_FLOAT16) {
    const uint16_t h = static_cast<uint16_t>(((r & 1) << 15) | ((11 + (r >> 1) % 6) << 10) | ((r >> 8) & 0x3ff));
    std::memcpy(p, &h, 2);
  } else if (dt == SELSCAN_DTYPE_BFLOAT16) {
    const uint16_t h = static_cast<uint16_t>(((r & 1) << 15) | ((123 + (r >> 1) % 6) << 7) | ((r >> 8) & 0x7f));
    std::memcpy(p, &h, 2);
  } else {
    const int n = dt == SELSCAN_DTYPE_COMPLEX64 ? 2 : 1;
    for (int i = 0; i < n; ++i) {
      const uint64_t q = i == 0 ? r : splitmix(rng);
      const uint32_t f = static_cast<uint32_t>(((q & 1) << 31) | ((123 + (q >> 1) % 6) << 23) | ((q >> 8) & 0x7fffff));
      std::memcpy(p + 4 * i, &f, 4);
    }
  }
}

// m * v + a in two's complement (the junk past ndim can be anything).
int64_t wrap(int64_t v, int64_t m, int64_t a) {
  return static_cast<int64_t>(static_cast<uint64_t>(v) * static_cast<uint64_t>(m) + static_cast<uint64_t>(a));
}

bool is_nan_bits(const unsigned char* p, int32_t dt) {
  if (dt == SELSCAN_DTYPE_FLOAT16 || dt == SELSCAN_DTYPE_BFLOAT16) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return dt == SELSCAN_DTYPE_FLOAT16 ? (h & 0x7c00) == 0x7c00 && (h & 0x3ff) : (h & 0x7f80) == 0x7f80 && (h & 0x7f);
  }
  for (int i = 0; i < (dt == SELSCAN_DTYPE_COMPLEX64 ? 2 : 1); ++i) {
    uint32_t f;
    std::memcpy(&f, p + 4 * i, 4);
    if ((f & 0x7f800000u) == 0x7f800000u && (f & 0x7fffffu)) return true;
  }
  return false;
}

enum class Kind { bdl, dn, bc, vec, bdn, x, pool };

// One tensor descriptor of an argument struct and the memory behind it.
struct Slot {
  const char* name = "";
  selscan_tensor_t* t = nullptr;  // inside the caller-side copy of the args struct
  bool output = false;
  bool inout = false;     // read and written in place (a state pool): filled like an input, checked per slot
  bool partial = false;   // an output the call need not write in full (a serving call's unused chunk slots of x)
  bool backed = true;     // its memory covers every element its descriptor addresses
  bool overlaps = false;  // two elements share bytes (outputs: results depend on write order)
  unsigned char* mem = nullptr;
  size_t bytes = 0;
  std::vector<int64_t> elems;  // byte offsets (from data) of every element, C order; empty if not backed
  std::vector<unsigned char> mask;  // 1 for the bytes of mem that belong to an element
  std::vector<unsigned char> snapshot;
  std::vector<int64_t> values;  // index tensors: the entries to store (cycled), instead of random values
  // In-place pools: the index tensor naming each sequence's slot (none: sequence b uses slot b) and its pad value.
  const Slot* index = nullptr;
  int64_t pad = 0;

  bool writes() const { return output || inout; }

  Slot() = default;
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot() { std::free(mem); }
};

struct Dims {
  int64_t Bt, D, L, N, G, nc;
  int64_t seqs;  // rows of the (seqs, D, N) states: Bt, or the number of packed sequences (then Bt = 1)
  int64_t S;     // slots of the state pool
  int32_t itype, wtype;
  bool cplx;
};

// The canonical (valid) form of a descriptor before layout and mutations.
struct Canon {
  std::vector<int64_t> sizes;
  int32_t dtype;
  bool unit_last;  // the last stride must be 1
  bool broadcast;  // an input that may take stride 0
};

class Decoder {
 public:
  Decoder(const uint8_t* data, size_t size) : f_(data, size) {}
  FuzzedDataProvider& fdp() { return f_; }

  // 0: no mutations; 1: rare; 2: frequent.
  void set_chaos(int c) { chaos_ = c; }
  bool mutate() {
    if (chaos_ == 0) return false;
    return one_in(f_, chaos_ == 1 ? 64 : 8);
  }

  // A violation of a contract on the contents of an index tensor (what CPU calls check on the host): 1 in 4 unless
  // the input asked for no mutations.
  bool violate() { return chaos_ != 0 && one_in(f_, 4); }

  int64_t pick(std::initializer_list<int64_t> v) {
    return v.begin()[f_.ConsumeIntegralInRange<size_t>(0, v.size() - 1)];
  }

  // A descriptor of canonical form `c` in one of the layouts, then mutations.
  void describe(selscan_tensor_t& t, const Canon& c, bool present) {
    t = selscan_tensor_t{};
    const std::vector<int64_t>& s = c.sizes;
    const int32_t dt = c.dtype;
    t.dtype = dt;
    t.ndim = static_cast<int32_t>(s.size());
    for (size_t i = 0; i < s.size(); ++i) t.sizes[i] = s[i];
    layout(t, c.unit_last, c.broadcast);
    // Sizes and strides past ndim are ignored by the library: fill them with junk.
    for (int i = t.ndim; i < SELSCAN_MAX_NDIM; ++i) {
      t.sizes[i] = static_cast<int64_t>(splitmix(junk_));
      t.strides[i] = static_cast<int64_t>(splitmix(junk_));
    }
    t.data = present ? reinterpret_cast<void*>(uintptr_t{1}) : nullptr;  // real memory comes in back()
    if (mutate()) t.data = t.data ? nullptr : reinterpret_cast<void*>(uintptr_t{1});
    if (mutate()) t.dtype = static_cast<int32_t>(pick({0, 1, 2, 3, 4, 5, 6, -1, 7, 1 << 30, INT32_MIN}));
    if (mutate()) t.ndim = static_cast<int32_t>(pick({0, 1, 2, 3, 4, 5, -1, 64, INT32_MAX, INT32_MIN}));
    if (mutate()) {
      const int i = f_.ConsumeIntegralInRange<int>(0, SELSCAN_MAX_NDIM - 1);
      t.sizes[i] = pick({0, -1, wrap(t.sizes[i], 1, 1), wrap(t.sizes[i], 1, -1), wrap(t.sizes[i], 2, 0), INT64_MAX, INT64_MIN,
                         int64_t{1} << 31, (int64_t{1} << 32) + 1, int64_t{1} << 62});
    }
    if (mutate()) {
      const int i = f_.ConsumeIntegralInRange<int>(0, SELSCAN_MAX_NDIM - 1);
      t.strides[i] = pick({0, 1, -1, wrap(t.strides[i], -1, 0), wrap(t.strides[i], 1, 1), INT64_MAX, INT64_MIN, int64_t{1} << 62,
                           (int64_t{1} << 61) + 3, int64_t{1} << 31});
    }
    misalign_ = mutate() ? static_cast<int>(f_.ConsumeIntegralInRange<int>(1, 7)) : 0;
  }
  int misalign() const { return misalign_; }

 private:
  void layout(selscan_tensor_t& t, bool unit_last, bool allow_broadcast) {
    const int n = t.ndim;
    const int mode = f_.ConsumeIntegralInRange<int>(0, 7);
    std::vector<int> order(static_cast<size_t>(n));  // innermost first
    for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = n - 1 - i;
    std::vector<int64_t> pad(static_cast<size_t>(n), 0);
    if (mode == 4 || mode == 5) {
      // A permutation of the dims (the last stays innermost where it must) with padding after each.
      const int first = unit_last ? 1 : 0;
      for (int i = n - 1; i > first; --i)
        std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(f_.ConsumeIntegralInRange<int>(first, i))]);
      for (auto& p : pad) p = f_.ConsumeIntegralInRange<int64_t>(0, 3);
    }
    int64_t next = 1;
    for (int k = 0; k < n; ++k) {
      const int dim = order[static_cast<size_t>(k)];
      t.strides[dim] = next;
      next = next * t.sizes[dim] + pad[static_cast<size_t>(k)];
    }
    if (mode == 5 && allow_broadcast && n > 1) {
      // An input broadcast along one dim (stride 0), as a torch expand() gives.
      t.strides[f_.ConsumeIntegralInRange<int>(0, unit_last ? n - 2 : n - 1)] = 0;
    } else if (mode == 6) {
      // Arbitrary small strides (an output whose elements overlap must be rejected; next is 0 for a zero size).
      for (int i = 0; i < n; ++i)
        if (!(unit_last && i == n - 1)) t.strides[i] = f_.ConsumeIntegralInRange<int64_t>(allow_broadcast ? 0 : 1, std::max<int64_t>(1, 3 * next));
    } else if (mode == 7) {
      // Any stride on a dim of size 1 (its stride is never used).
      for (int i = 0; i < n; ++i)
        if (t.sizes[i] == 1) t.strides[i] = f_.ConsumeIntegral<int64_t>() & ((int64_t{1} << 40) - 1);
    }
  }

  FuzzedDataProvider f_;
  uint64_t junk_ = 0x5e15ca9;  // values the library must ignore (not worth input bytes)
  int chaos_ = 0;
  int misalign_ = 0;
};

// Gives `s` memory of exactly the bytes its descriptor addresses (plus a misalignment offset) and records the
// element offsets. Descriptors that are malformed (ndim outside [1, 4], a size < 1, a negative stride) or too
// large to back get a small block instead: the library must reject those before touching memory.
void back(Slot& s, int misalign, uint64_t& rng, bool tame) {
  selscan_tensor_t& t = *s.t;
  if (t.data == nullptr) return;
  const int64_t es = dtype_bytes(t.dtype);
  bool ok = t.ndim >= 1 && t.ndim <= SELSCAN_MAX_NDIM;
  __int128 span = 0, numel = 1;
  for (int i = 0; ok && i < t.ndim; ++i) {
    ok = t.sizes[i] >= 1 && t.strides[i] >= 0;
    if (!ok) break;
    span += static_cast<__int128>(t.sizes[i] - 1) * t.strides[i];
    numel *= t.sizes[i];
    ok = span < kMaxBytes && numel < kMaxBytes;
  }
  size_t bytes = 16;
  if (ok) bytes = static_cast<size_t>((span + 1) * es);
  s.backed = ok;
  s.bytes = bytes + static_cast<size_t>(misalign);
  s.mem = static_cast<unsigned char*>(std::malloc(s.bytes));
  if (s.mem == nullptr) die("malloc failed");
  t.data = s.mem + misalign;
  if (ok) {
    const int n = t.ndim;
    std::vector<int64_t> idx(static_cast<size_t>(n), 0);
    for (int64_t k = 0; k < static_cast<int64_t>(numel); ++k) {
      int64_t off = 0;
      for (int i = 0; i < n; ++i) off += idx[static_cast<size_t>(i)] * t.strides[i];
      s.elems.push_back(off * es);
      for (int i = n - 1; i >= 0; --i) {
        if (++idx[static_cast<size_t>(i)] < t.sizes[i]) break;
        idx[static_cast<size_t>(i)] = 0;
      }
    }
    // Which bytes of the block are element bytes (and whether two elements share one).
    s.mask.assign(bytes + static_cast<size_t>(misalign), 0);
    for (int64_t off : s.elems)
      for (int64_t b = 0; b < es; ++b) {
        unsigned char& m = s.mask[static_cast<size_t>(misalign + off + b)];
        s.overlaps = s.overlaps || m != 0;
        m = 1;
      }
  }
  unsigned char* base = s.mem + misalign;
  std::memset(s.mem, 0, static_cast<size_t>(misalign));
  if (s.output) {
    std::memset(s.mem, kPoison, s.bytes);
  } else if (ok && !s.values.empty()) {
    // Index entries in the descriptor's element width (a stride-0 view keeps the last one written).
    for (size_t i = 0; i < bytes; ++i) base[i] = static_cast<unsigned char>(splitmix(rng));
    for (size_t k = 0; k < s.elems.size(); ++k) {
      const int64_t v = s.values[k % s.values.size()];
      const int32_t v32 = static_cast<int32_t>(v);
      const int16_t v16 = static_cast<int16_t>(v);
      const uint8_t v8 = static_cast<uint8_t>(v);
      const void* src = es == 8 ? static_cast<const void*>(&v) : es == 4 ? static_cast<const void*>(&v32)
                      : es == 2 ? static_cast<const void*>(&v16) : static_cast<const void*>(&v8);
      std::memcpy(base + s.elems[k], src, static_cast<size_t>(es));
    }
  } else if (tame && ok) {
    for (size_t i = 0; i + static_cast<size_t>(es) <= bytes; i += static_cast<size_t>(es)) tame_element(base + i, t.dtype, rng);
  } else {
    for (size_t i = 0; i < s.bytes; ++i) s.mem[i] = static_cast<unsigned char>(splitmix(rng));
  }
}

// Caller memory holding a struct: exactly `struct_size` bytes (at least the struct_size field; at most the
// struct plus 64 bytes of a newer caller's fields, junk or zero; a huge struct_size gets just the struct, which
// is all the library may read before rejecting it).
template <class T>
struct Boxed {
  unsigned char* mem = nullptr;
  explicit Boxed(const T& v, uint64_t& rng, bool zero_tail) {
    const size_t ss = v.struct_size;
    size_t bytes = ss < sizeof(size_t) ? sizeof(size_t) : ss > sizeof(T) + 64 ? sizeof(T) : ss;
    mem = static_cast<unsigned char*>(std::malloc(bytes));
    if (mem == nullptr) die("malloc failed");
    std::memcpy(mem, &v, std::min(bytes, sizeof(T)));  // below sizeof(T): the tail does not exist for this caller
    for (size_t i = sizeof(T); i < bytes; ++i) mem[i] = zero_tail ? 0 : static_cast<unsigned char>(splitmix(rng));
  }
  ~Boxed() { std::free(mem); }
  const T* get() const { return reinterpret_cast<const T*>(mem); }
};

// The real size, or (mutated) sizes of older or newer callers and garbage. For the backward, real - 8 is the
// 0.1 struct (without flags and reserved).
size_t fuzz_struct_size(Decoder& dec, size_t real) {
  if (!dec.mutate()) return real;
  return static_cast<size_t>(dec.pick({0, 1, 7, 8, static_cast<int64_t>(real) - 8, static_cast<int64_t>(real) - 1,
                                       static_cast<int64_t>(real) + 1, static_cast<int64_t>(real) + 8,
                                       static_cast<int64_t>(real) + 64, (int64_t{1} << 16) + 1, -1}));
}

bool is_validation_status(selscan_status_t s) {
  return s != SELSCAN_STATUS_SUCCESS && s != SELSCAN_STATUS_INTERNAL && s != SELSCAN_STATUS_OUT_OF_MEMORY;
}

void check_failure(selscan_status_t s, const char* call) {
  if (s < SELSCAN_STATUS_SUCCESS || s >= SELSCAN_STATUS_COUNT) die(call, "returned a status outside the enum");
  if (s == SELSCAN_STATUS_INTERNAL) die(call, selscan_last_error());
  if (s != SELSCAN_STATUS_SUCCESS && selscan_last_error()[0] == '\0') die(call, "failed without a message");
}

void snapshot_inputs(std::vector<Slot*>& slots) {
  for (Slot* s : slots)
    if (!s->output && s->mem) s->snapshot.assign(s->mem, s->mem + s->bytes);
}

// How many entries of a successful call's index tensor name each slot of the pool `s`: every slot once without
// an index tensor (the pool then has one slot per sequence), else the entries of the (sequences,) cache indices or
// the (sequences, blocks) block table that are neither the pad value nor outside [0, S). A block table names the
// slots a call may read or write; which of them it writes depends on the context lengths.
std::vector<int> slot_uses(const Slot& s) {
  const int64_t S = s.t->sizes[0];
  std::vector<int> uses(static_cast<size_t>(S), s.index && s.index->t->data ? 0 : 1);
  if (!s.index || !s.index->t->data) return uses;
  const selscan_tensor_t& ix = *s.index->t;
  const int64_t cols = ix.ndim == 2 ? ix.sizes[1] : 1, col_stride = ix.ndim == 2 ? ix.strides[1] : 0;
  for (int64_t k = 0; k < ix.sizes[0] * cols; ++k) {
    const int64_t off = (k / cols) * ix.strides[0] + (k % cols) * col_stride;
    const unsigned char* e = static_cast<const unsigned char*>(ix.data) + off * dtype_bytes(ix.dtype);
    int64_t v;
    if (ix.dtype == SELSCAN_DTYPE_INT64) {
      std::memcpy(&v, e, 8);
    } else {
      int32_t v32;
      std::memcpy(&v32, e, 4);
      v = v32;
    }
    if (v != s.pad && v >= 0 && v < S) uses[static_cast<size_t>(v)]++;
  }
  return uses;
}

// After a call: inputs untouched; on failure outputs and in-place tensors untouched; on success every byte between
// output elements untouched, (with `check_written`) every element written, and of an in-place pool only the slots
// some sequence names written.
void check_memory(const std::vector<Slot*>& slots, bool success, bool check_written, const char* call) {
  for (const Slot* s : slots) {
    if (!s->mem) continue;
    if (!s->writes() || (s->inout && !success)) {
      if (std::memcmp(s->mem, s->snapshot.data(), s->bytes) != 0)
        die(s->inout ? "a failed call wrote an in-place tensor:" : "an input was modified:", s->name);
      continue;
    }
    if (!success) {
      for (size_t i = 0; i < s->bytes; ++i)
        if (s->mem[i] != kPoison) die("a failed call wrote an output:", s->name);
      continue;
    }
    if (!s->backed) die("a call succeeded on an unbacked descriptor:", s->name);
    if (s->overlaps) die("a call succeeded with an output whose elements overlap:", s->name);
    const int64_t es = dtype_bytes(s->t->dtype);
    const unsigned char* base = static_cast<const unsigned char*>(s->t->data);
    if (s->inout) {
      const std::vector<int> uses = slot_uses(*s);
      const size_t per_slot = s->elems.size() / uses.size();
      const unsigned char* before = s->snapshot.data() + (base - s->mem);
      for (size_t k = 0; k < s->elems.size(); ++k)
        if (uses[k / per_slot] == 0 && std::memcmp(base + s->elems[k], before + s->elems[k], static_cast<size_t>(es)))
          die("a pool slot no sequence names was written:", s->name);
      for (size_t i = 0; i < s->bytes; ++i)
        if (!s->mask[i] && s->mem[i] != s->snapshot[i]) die("a byte between pool elements was written:", s->name);
      continue;
    }
    if (check_written && !s->partial)
      for (int64_t off : s->elems) {
        bool all_poison = true;
        for (int64_t b = 0; b < es; ++b) all_poison = all_poison && base[off + b] == kPoison;
        if (all_poison) die("an output element was not written:", s->name);
      }
    for (size_t i = 0; i < s->bytes; ++i)
      if (!s->mask[i] && s->mem[i] != kPoison) die("a byte between output elements was written:", s->name);
  }
}

std::vector<std::vector<unsigned char>> output_elements(const std::vector<Slot*>& slots) {
  std::vector<std::vector<unsigned char>> r;
  for (const Slot* s : slots) {
    if (!s->writes() || !s->mem) continue;
    const int64_t es = dtype_bytes(s->t->dtype);
    const unsigned char* base = static_cast<const unsigned char*>(s->t->data);
    std::vector<unsigned char> v;
    for (int64_t off : s->elems) v.insert(v.end(), base + off, base + off + es);
    r.push_back(std::move(v));
  }
  return r;
}

// Outputs back to the poison, in-place tensors back to their contents before the call.
void repoison(const std::vector<Slot*>& slots) {
  for (const Slot* s : slots) {
    if (s->output && s->mem) std::memset(s->mem, kPoison, s->bytes);
    if (s->inout && s->mem) std::memcpy(s->mem, s->snapshot.data(), s->bytes);
  }
}

// Results of two runs agree element by element (any NaN equals any NaN).
void compare_runs(const std::vector<Slot*>& slots, const std::vector<std::vector<unsigned char>>& a,
                  const std::vector<std::vector<unsigned char>>& b, const char* call) {
  size_t k = 0;
  for (const Slot* s : slots) {
    if (!s->writes() || !s->mem) continue;
    const int32_t dt = s->t->dtype;
    const size_t es = static_cast<size_t>(dtype_bytes(dt));
    for (size_t i = 0; i + es <= a[k].size(); i += es) {
      const unsigned char *x = a[k].data() + i, *y = b[k].data() + i;
      if (std::memcmp(x, y, es) != 0 && !(is_nan_bits(x, dt) && is_nan_bits(y, dt)))
        die(call, s->name);  // differs with another thread count
    }
    ++k;
  }
}

// Slot indices for `n` sequences of a pool of `S` slots: distinct slots, some sequences padding; then, at the
// input's rate of contract violations, one entry made a duplicate, out of range, or the pad value.
std::vector<int64_t> decode_slots(Decoder& dec, int64_t n, int64_t S, int64_t pad) {
  FuzzedDataProvider& f = dec.fdp();
  std::vector<int64_t> free_slots;
  for (int64_t i = 0; i < S; ++i) free_slots.push_back(i);
  std::vector<int64_t> v;
  for (int64_t b = 0; b < n; ++b) {
    if (free_slots.empty() || one_in(f, 4)) {
      v.push_back(pad);
      continue;
    }
    const size_t k = f.ConsumeIntegralInRange<size_t>(0, free_slots.size() - 1);
    v.push_back(free_slots[k]);
    free_slots.erase(free_slots.begin() + static_cast<std::ptrdiff_t>(k));
  }
  if (dec.violate()) {
    const size_t i = f.ConsumeIntegralInRange<size_t>(0, v.size() - 1), j = f.ConsumeIntegralInRange<size_t>(0, v.size() - 1);
    switch (f.ConsumeIntegralInRange<int>(0, 2)) {
      case 0: v[i] = v[j]; break;  // a duplicate (when i != j and not padding)
      case 1: v[i] = dec.pick({S, S + 1, -1, -2, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, int64_t{1} << 32}); break;
      default: v[i] = pad; break;
    }
  }
  return v;
}

// The serving fields of a forward/backward problem (docs/serving.md).
struct Serving {
  bool on = false, varlen = false, pool = false, has_idx = false, has_init = false, bwd_h0 = false;
  int32_t cu_dtype = SELSCAN_DTYPE_INT32, idx_dtype = SELSCAN_DTYPE_INT32, init_dtype = SELSCAN_DTYPE_BOOL;
  std::vector<int64_t> cu, idx, init;
  int64_t pad = 0;
  // Block-wise state caching: K tokens per block, a (sequences, M) block table, context lengths.
  bool blocks = false, has_ctx = false;
  int64_t K = 0, M = 1;
  int32_t table_dtype = SELSCAN_DTYPE_INT32, ctx_dtype = SELSCAN_DTYPE_INT32;
  std::vector<int64_t> table, ctx;
};

struct Problem {
  Dims d{};
  bool var_B = true, var_C = true, bc3d_B = false, bc3d_C = false;
  bool has_D = true, has_z = false, has_bias = false, has_h0 = false, with_x = true, with_last = false;
  bool want_dh0 = false, want_out_z = false;
  int32_t softplus = 0, flags = 0, deterministic = 1;
  int32_t bwd_flags = 0, bwd_reserved = 0;
  Serving sv;
};

// Packed sequences: lengths (some empty, some across the chunk edge) capped at `max_total` in all, and
// cu_seqlens, valid or (at the input's rate of contract violations) non-monotone, with a wrong first or last
// entry, or holding a huge value.
void decode_varlen(Decoder& dec, Problem& p, int64_t per_l) {
  FuzzedDataProvider& f = dec.fdp();
  Dims& d = p.d;
  const int64_t n = f.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t cap = std::max<int64_t>(1, kMaxWork / per_l) / n;
  std::vector<int64_t>& cu = p.sv.cu;
  cu.assign(1, 0);
  for (int64_t b = 0; b < n; ++b) {
    int64_t len = one_in(f, 4) ? 0 : f.ConsumeIntegralInRange<int64_t>(1, 40);
    if (one_in(f, 8)) len = dec.pick({2047, 2048, 2049, 4097});
    cu.push_back(cu.back() + std::min(len, cap));
  }
  d.seqs = n;
  d.Bt = 1;
  d.L = cu.back();  // 0 when every sequence is empty: u then has a zero size and is rejected
  d.nc = d.L / SELSCAN_CHUNK + n;
  p.sv.cu_dtype = f.ConsumeBool() ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
  if (dec.violate()) {
    const size_t i = f.ConsumeIntegralInRange<size_t>(0, cu.size() - 1);
    switch (f.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: cu[i] = (i + 1 < cu.size() ? cu[i + 1] : cu[i]) + 1; break;  // above its successor
      case 1: cu.back() += dec.pick({1, -1}); break;
      case 2: cu[0] = dec.pick({1, -1}); break;
      default:
        cu[i] = dec.pick({INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, int64_t{1} << 31, int64_t{1} << 32, -1});
    }
  }
}

// Block-wise state caching (since 0.4): block size K, context lengths (0–23, or a violation: negative, huge), and
// a block table of distinct slots covering every sequence's blocks (some entries padding; violations: too few
// columns, a duplicate, an entry outside the pool, the pad value), the pool sized to hold them.
void decode_blocks(Decoder& dec, Problem& p) {
  FuzzedDataProvider& f = dec.fdp();
  Serving& sv = p.sv;
  Dims& d = p.d;
  sv.K = dec.pick({1, 3, 4, 16, 2048});
  sv.has_ctx = f.ConsumeBool();
  sv.ctx.clear();
  int64_t M = 1;
  for (int64_t b = 0; b < d.seqs; ++b) {
    const int64_t c = sv.has_ctx && !one_in(f, 3) ? f.ConsumeIntegralInRange<int64_t>(0, 23) : 0;
    // (cu_seqlens may already hold a violation: its difference is taken without overflow and clamped.)
    const int64_t len = sv.varlen ? std::clamp<int64_t>(wrap(sv.cu[static_cast<size_t>(b)], -1, sv.cu[static_cast<size_t>(b + 1)]), 0, d.L) : d.L;
    sv.ctx.push_back(c);
    if (len > 0) M = std::max(M, (c + len - 1) / sv.K + 1);
  }
  if (M * d.seqs > 48) {  // keep the pool small: fewer, larger blocks
    sv.K = 2048;
    M = 1;
    for (int64_t b = 0; b < d.seqs; ++b) M = std::max(M, (sv.ctx[static_cast<size_t>(b)] + std::min<int64_t>(d.L, 6145)) / sv.K + 1);
  }
  if (dec.violate() && M > 1) M -= 1;
  sv.M = M;
  d.S = std::min<int64_t>(48, d.seqs * M + f.ConsumeIntegralInRange<int64_t>(0, 2));
  sv.pad = dec.pick({-1, -1, 0, d.S, INT64_MIN});
  sv.table_dtype = f.ConsumeBool() ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
  sv.ctx_dtype = f.ConsumeBool() ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
  sv.table = decode_slots(dec, d.seqs * M, d.S, sv.pad);
  if (sv.has_ctx && dec.violate())
    sv.ctx[f.ConsumeIntegralInRange<size_t>(0, sv.ctx.size() - 1)] = dec.pick({-1, INT32_MAX, INT64_MAX, INT64_MIN});
}

// The serving fields beyond cu_seqlens: a state pool with or without cache indices, padding entries,
// has_initial_state.
void decode_pool(Decoder& dec, Problem& p) {
  FuzzedDataProvider& f = dec.fdp();
  Serving& sv = p.sv;
  Dims& d = p.d;
  sv.pool = f.ConsumeBool();
  sv.blocks = sv.pool && one_in(f, 3);
  sv.has_idx = sv.blocks ? dec.mutate() : sv.pool ? !one_in(f, 4) : f.ConsumeBool();
  d.S = sv.has_idx ? f.ConsumeIntegralInRange<int64_t>(1, 6) : d.seqs;
  if (sv.blocks) decode_blocks(dec, p);
  if (sv.pool) {
    p.has_h0 = dec.mutate();
    p.with_last = dec.mutate();
  }
  if (sv.has_idx) {
    sv.pad = dec.pick({-1, -1, 0, d.S, 3, INT64_MIN, int64_t{1} << 32});
    sv.idx_dtype = f.ConsumeBool() ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
    sv.idx = decode_slots(dec, d.seqs, sv.pool ? d.S : 8, sv.pad);
  } else if (sv.blocks) {
    // decode_blocks chose it
  } else if (dec.mutate()) {
    sv.pad = -1;  // only allowed with cache_indices or block_table
  }
  sv.has_init = (p.has_h0 || sv.pool) ? f.ConsumeBool() : dec.mutate();
  sv.init_dtype = f.ConsumeBool() ? SELSCAN_DTYPE_INT32 : SELSCAN_DTYPE_BOOL;
  for (int64_t b = 0; b < d.seqs; ++b) sv.init.push_back(f.ConsumeBool() ? (one_in(f, 8) ? dec.pick({2, 255, -1}) : 1) : 0);
  // The backward of a pool call takes the states the sequences started from as h0.
  sv.bwd_h0 = sv.pool && !one_in(f, 4);
}

Problem decode_problem(Decoder& dec, bool serving) {
  FuzzedDataProvider& f = dec.fdp();
  Problem p;
  Dims& d = p.d;
  d.Bt = f.ConsumeIntegralInRange<int64_t>(1, 3);
  d.D = dec.pick({1, 2, 4, 3, 5, 6, 8, 12, 16});
  d.N = f.ConsumeBool() ? f.ConsumeIntegralInRange<int64_t>(1, 16) : dec.pick({1, 8, 16, 17, 31, 32, 33, 64, 256});
  d.L = !one_in(f, 4) ? f.ConsumeIntegralInRange<int64_t>(1, 64)
                        : dec.pick({1, 2, 3, 15, 16, 17, 100, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1000, 1024,
                                    1025, 2047, 2048, 2049, 4095, 4096, 4097, 6145});
  d.cplx = serving ? dec.mutate() : one_in(f, 4);  // serving calls take real weights
  d.itype = static_cast<int32_t>(f.ConsumeIntegralInRange<int>(0, 2));
  d.wtype = d.cplx ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const int64_t per_l = d.Bt * d.D * ((d.N + 7) / 8 * 8) * (d.cplx ? 2 : 1);
  if (per_l * d.L > kMaxWork) d.L = std::max<int64_t>(1, kMaxWork / per_l);
  d.nc = (d.L + SELSCAN_CHUNK - 1) / SELSCAN_CHUNK;
  d.seqs = d.S = d.Bt;
  p.sv.on = serving;
  p.sv.varlen = serving && f.ConsumeBool();
  if (p.sv.varlen) decode_varlen(dec, p, d.D * ((d.N + 7) / 8 * 8) * (d.cplx ? 2 : 1));
  // Groups: usually a divisor of D (tried largest first), sometimes anything.
  const int64_t gpick = f.ConsumeIntegralInRange<int64_t>(1, 16);
  d.G = 1;
  for (int64_t g = gpick; g >= 1; --g)
    if (d.D % g == 0) {
      d.G = g;
      break;
    }
  if (dec.mutate()) d.G = gpick;
  p.var_B = f.ConsumeBool();
  p.var_C = f.ConsumeBool();
  p.bc3d_B = p.var_B && d.G == 1 && one_in(f, 4);
  p.bc3d_C = p.var_C && d.G == 1 && one_in(f, 4);
  p.has_D = f.ConsumeBool();
  p.has_z = f.ConsumeBool();
  p.has_bias = f.ConsumeBool();
  p.has_h0 = one_in(f, 4);
  const bool multi = p.sv.varlen ? d.L > SELSCAN_CHUNK : d.nc > 1;
  p.with_x = multi ? !dec.mutate() : f.ConsumeBool();
  p.with_last = f.ConsumeBool();
  if (serving) decode_pool(dec, p);
  p.want_dh0 = (p.sv.pool ? p.sv.bwd_h0 : p.has_h0) && f.ConsumeBool();
  p.want_out_z = p.has_z && f.ConsumeBool();
  p.softplus = f.ConsumeBool() ? 1 : 0;
  if (dec.mutate()) p.softplus = static_cast<int32_t>(dec.pick({2, -1, INT32_MAX}));
  if (dec.mutate()) p.flags = static_cast<int32_t>(dec.pick({1, -1, 1 << 20}));
  if (dec.mutate()) p.deterministic = static_cast<int32_t>(dec.pick({0, 2, -1}));
  if (dec.mutate()) p.bwd_flags = static_cast<int32_t>(dec.pick({1, -1, 1 << 20}));
  if (dec.mutate()) p.bwd_reserved = static_cast<int32_t>(dec.pick({1, -1}));
  return p;
}

selscan_exec_t decode_exec(Decoder& dec) {
  FuzzedDataProvider& f = dec.fdp();
  selscan_exec_t e = SELSCAN_EXEC_INIT;
  e.num_threads = static_cast<int32_t>(dec.pick({1, 2, 1, 2, 0, 3}));
  if (dec.mutate()) e.num_threads = static_cast<int32_t>(dec.pick({-1, INT32_MIN, 64, INT32_MAX}));
  if (dec.mutate()) e.device_kind = static_cast<int32_t>(dec.pick({1, 2, -1}));
  if (dec.mutate()) e.device_index = static_cast<int32_t>(dec.pick({1, -1, INT32_MAX}));
  if (one_in(f, 16)) {
    // Ignored on the CPU: must not be dereferenced.
    e.stream = reinterpret_cast<void*>(uintptr_t{0xdead0000});
    e.workspace = reinterpret_cast<void*>(uintptr_t{0xbeef0000} + (f.ConsumeBool() ? 0 : 8));  // 8: misaligned
    e.workspace_bytes = f.ConsumeIntegral<size_t>();
  }
  e.reserved = dec.mutate() ? f.ConsumeIntegral<int32_t>() : 0;
  e.struct_size = fuzz_struct_size(dec, sizeof(selscan_exec_t));
  return e;
}

// Another thread count for the determinism re-run of a valid CPU call.
bool rerun_exec(const selscan_exec_t* e, size_t ss, selscan_exec_t* out) {
  if (e == nullptr || ss < sizeof(selscan_exec_t) || e->device_kind != SELSCAN_DEVICE_CPU || e->num_threads < 0)
    return false;
  *out = *e;
  out->struct_size = sizeof(selscan_exec_t);
  out->num_threads = e->num_threads == 1 ? 3 : 1;
  return true;
}

// With SELSCAN_FUZZ_STATS set: how the calls ended, printed at every power-of-two input count (so a run shows
// how much of the fuzzing reached the CPU kernels rather than stopping in validation).
enum Call { kFwd, kBwd, kServingFwd, kServingBwd, kStateUpdate, kCalls };
const char* const kCallNames[kCalls] = {"fwd", "bwd", "fwd (serving)", "bwd (serving)", "state_update"};
struct Stats {
  bool on = std::getenv("SELSCAN_FUZZ_STATS") != nullptr;
  uint64_t inputs = 0, status[kCalls][16] = {}, rerun[kCalls] = {};
  void report(bool force = false) {
    if (!on || (!force && (inputs < 1024 || (inputs & (inputs - 1)) != 0))) return;
    for (int k = 0; k < kCalls; ++k) {
      std::fprintf(stderr, "fuzz_abi stats: %" PRIu64 " inputs, %s:", inputs, kCallNames[k]);
      for (int i = 0; i < 16; ++i)
        if (status[k][i]) std::fprintf(stderr, " %s=%" PRIu64, selscan_status_string(static_cast<selscan_status_t>(i)), status[k][i]);
      std::fprintf(stderr, " (re-run with another thread count: %" PRIu64 ")\n", rerun[k]);
    }
  }
};
Stats& stats() {
  static Stats s;
  static const bool at_exit = std::atexit([] { stats().report(true); }) == 0;
  (void)at_exit;
  return s;
}

// A valid CUDA exec: in this CPU-only build a call with it runs every argument check and then returns
// CUDA_NOT_BUILT, reading no tensor memory (the CPU path reads the serving index tensors on the host).
selscan_exec_t cuda_probe_exec() {
  selscan_exec_t e = SELSCAN_EXEC_INIT;
  e.device_kind = SELSCAN_DEVICE_CUDA;
  return e;
}

// `query` validates (and may read index tensors on the host); `probe` only validates, CUDA_NOT_BUILT meaning the
// arguments passed. The probe replaces the query when a descriptor is not backed by real memory.
template <class Args, class Query, class Probe, class Run>
void exercise(Call which, Decoder& dec, Args& args, const selscan_exec_t& exec, std::vector<Slot*>& slots,
              bool tame, uint64_t& rng, Query query, Probe probe, Run call, bool compare_threads) {
  const char* name = kCallNames[which];
  FuzzedDataProvider& f = dec.fdp();
  snapshot_inputs(slots);
  bool all_backed = true;
  for (const Slot* s : slots) all_backed = all_backed && (s->t->data == nullptr || s->backed);
  const bool null_args = one_in(f, 64), null_exec = one_in(f, 64);
  const bool null_bytes = all_backed && one_in(f, 64);
  // Sometimes an output is pointed at another tensor's memory: the call must then be rejected. The
  // descriptor is restored on return (the backward reuses the forward's).
  struct Alias {
    selscan_tensor_t* t = nullptr;
    void* data = nullptr;
    ~Alias() {
      if (t) t->data = data;
    }
  } alias;
  if (dec.mutate()) {
    std::vector<Slot*> present;
    for (Slot* s : slots)
      if (s->t->data) present.push_back(s);
    Slot* o = present.empty() ? nullptr : present[f.ConsumeIntegralInRange<size_t>(0, present.size() - 1)];
    Slot* other = present.empty() ? nullptr : present[f.ConsumeIntegralInRange<size_t>(0, present.size() - 1)];
    if (o && o->writes() && other != o && other->t->data != o->t->data) {
      alias.t = o->t;
      alias.data = o->t->data;
      o->t->data = other->t->data;
    }
  }
  Boxed<Args> a(args, rng, splitmix(rng) & 1);
  Boxed<selscan_exec_t> e(exec, rng, splitmix(rng) & 1);
  const Args* ap = null_args ? nullptr : a.get();
  const selscan_exec_t* ep = null_exec ? nullptr : e.get();

  size_t bytes = 12345;
  selscan_status_t sq;
  if (all_backed) {
    sq = query(ap, ep, null_bytes ? nullptr : &bytes);
    if (sq == SELSCAN_STATUS_SUCCESS && !null_bytes && bytes != 0) die(name, "CPU workspace is not 0");
  } else {
    const selscan_exec_t cuda = cuda_probe_exec();
    sq = probe(ap, &cuda);
    if (sq == SELSCAN_STATUS_CUDA_NOT_BUILT) sq = SELSCAN_STATUS_SUCCESS;
  }
  check_failure(sq, name);
  if (alias.t && sq == SELSCAN_STATUS_SUCCESS) die(name, "accepted an output that aliases another tensor");
  check_memory(slots, false, false, name);  // a query writes no tensor
  if (!all_backed && sq == SELSCAN_STATUS_SUCCESS) return;  // would run over unbacked memory

  const selscan_status_t s = call(ap, ep);
  check_failure(s, name);
  stats().status[which][static_cast<int>(s) & 15]++;
  if (stats().on && s != SELSCAN_STATUS_SUCCESS && std::getenv("SELSCAN_FUZZ_ERRORS"))
    std::fprintf(stderr, "fuzz_abi: %s: %s\n", name, selscan_last_error());
  if (sq != SELSCAN_STATUS_SUCCESS && !null_bytes && s != sq) die(name, "query and call disagree");
  if (alias.t && s == SELSCAN_STATUS_SUCCESS) die(name, "accepted an output that aliases another tensor");
  if (s != SELSCAN_STATUS_SUCCESS) {
    if (is_validation_status(s)) check_memory(slots, false, false, name);
    return;
  }
  check_memory(slots, true, tame, name);
  selscan_exec_t other;
  if (!compare_threads || !rerun_exec(ep, exec.struct_size, &other)) return;
  for (const Slot* sl : slots) {
    if (sl->output && sl->overlaps) return;
    if (sl->inout && sl->mem) {  // two sequences on one slot: its final value is undefined
      const std::vector<int> uses = slot_uses(*sl);
      if (std::any_of(uses.begin(), uses.end(), [](int u) { return u > 1; })) return;
    }
  }
  const auto first = output_elements(slots);
  repoison(slots);
  stats().rerun[which]++;
  const selscan_status_t s2 = call(ap, &other);
  if (s2 != SELSCAN_STATUS_SUCCESS) die(name, "failed with another thread count");
  compare_runs(slots, first, output_elements(slots), name);
}

// One tensor of a call: its canonical form and presence, described into `t` and backed.
struct Spec {
  Slot* s;
  const char* name;
  selscan_tensor_t* t;
  Canon c;
  bool output, present;
};

void build(Decoder& dec, const std::vector<Spec>& specs, std::vector<Slot*>& slots, uint64_t& rng, bool tame) {
  for (const Spec& sp : specs) {
    sp.s->name = sp.name;
    sp.s->t = sp.t;
    sp.s->output = sp.output;
    dec.describe(*sp.t, sp.c, sp.present);
    back(*sp.s, dec.misalign(), rng, tame);
    slots.push_back(sp.s);
  }
}

// The canonical forms of the scan's tensors (docs: selscan.h section 5).
Canon canon(Kind kind, const Dims& d, bool var_bc = false, bool bc_3d = false, bool output = false) {
  std::vector<int64_t> s;
  int32_t dt = d.itype;
  bool unit_last = true;
  switch (kind) {
    case Kind::bdl: s = {d.Bt, d.D, d.L}; break;
    case Kind::dn: s = {d.D, d.N}; dt = d.wtype; unit_last = false; break;
    case Kind::bc:
      if (var_bc) {
        const int64_t Lbc = d.cplx ? 2 * d.L : d.L;
        s = bc_3d ? std::vector<int64_t>{d.Bt, d.N, Lbc} : std::vector<int64_t>{d.Bt, d.G, d.N, Lbc};
      } else {
        s = {d.D, d.N};
        dt = d.wtype;
        unit_last = false;
      }
      break;
    case Kind::vec: s = {d.D}; dt = SELSCAN_DTYPE_FLOAT32; unit_last = false; break;
    case Kind::bdn: s = {d.seqs, d.D, d.N}; dt = d.wtype; unit_last = false; break;
    case Kind::x: s = {d.Bt, d.D, d.nc, 2 * d.N}; dt = d.wtype; break;
    case Kind::pool: s = {d.S, d.D, d.N}; dt = d.wtype; unit_last = false; break;
  }
  return Canon{s, dt, unit_last, !output && kind != Kind::x};
}

Canon index_canon(int64_t n, int32_t dtype) { return Canon{{n}, dtype, false, true}; }

// ------------------------------------------------------------------------------------------ forward, backward
void run_scan(Decoder& dec, uint64_t& rng, bool tame, bool serving) {
  FuzzedDataProvider& f = dec.fdp();
  const Problem p = decode_problem(dec, serving);
  const Dims& d = p.d;
  const Serving& sv = p.sv;

  selscan_fwd_args_t fa{};
  fa.struct_size = fuzz_struct_size(dec, sizeof(fa));
  Slot u, delta, A, B, C, Dv, z, bias, h0, out, out_z, x, last, cu, pool, idx, init, table, ctx;
  cu.values = sv.cu;
  idx.values = sv.idx;
  init.values = sv.init;
  table.values = sv.table;
  ctx.values = sv.ctx;
  pool.inout = true;
  pool.index = sv.blocks ? &table : &idx;
  pool.pad = sv.pad;
  x.partial = serving;  // chunk slots of empty or padding sequences are not written
  const std::vector<Spec> fwd_specs = {
      {&u, "u", &fa.u, canon(Kind::bdl, d), false, true},
      {&delta, "delta", &fa.delta, canon(Kind::bdl, d), false, true},
      {&A, "A", &fa.A, canon(Kind::dn, d), false, true},
      {&B, "B", &fa.B, canon(Kind::bc, d, p.var_B, p.bc3d_B), false, true},
      {&C, "C", &fa.C, canon(Kind::bc, d, p.var_C, p.bc3d_C), false, true},
      {&Dv, "D", &fa.D, canon(Kind::vec, d), false, p.has_D},
      {&z, "z", &fa.z, canon(Kind::bdl, d), false, p.has_z},
      {&bias, "delta_bias", &fa.delta_bias, canon(Kind::vec, d), false, p.has_bias},
      {&h0, "h0", &fa.h0, canon(Kind::bdn, d), false, p.has_h0},
      {&out, "out", &fa.out, canon(Kind::bdl, d, false, false, true), true, true},
      {&out_z, "out_z", &fa.out_z, canon(Kind::bdl, d, false, false, true), true, p.has_z},
      {&x, "x", &fa.x, canon(Kind::x, d, false, false, true), true, p.with_x},
      {&last, "last_state", &fa.last_state, canon(Kind::bdn, d, false, false, true), true, p.with_last},
      {&cu, "cu_seqlens", &fa.cu_seqlens, index_canon(d.seqs + 1, sv.cu_dtype), false, sv.varlen},
      {&idx, "cache_indices", &fa.cache_indices, index_canon(d.seqs, sv.idx_dtype), false, sv.has_idx},
      {&init, "has_initial_state", &fa.has_initial_state, index_canon(d.seqs, sv.init_dtype), false, sv.has_init},
      {&pool, "ssm_states", &fa.ssm_states, canon(Kind::pool, d), false, sv.pool},
      {&table, "block_table", &fa.block_table, Canon{{d.seqs, sv.M}, sv.table_dtype, false, true}, false, sv.blocks},
      {&ctx, "context_lens", &fa.context_lens, index_canon(d.seqs, sv.ctx_dtype), false, sv.blocks && sv.has_ctx},
  };
  std::vector<Slot*> fwd_slots;
  build(dec, fwd_specs, fwd_slots, rng, tame);
  fa.delta_softplus = p.softplus;
  fa.flags = p.flags;
  fa.pad_slot_id = sv.pad;
  fa.state_block_size = sv.blocks ? sv.K : 0;
  if (dec.mutate()) fa.state_block_size = dec.pick({0, 1, -1, INT64_MIN, INT64_MAX});
  const selscan_exec_t exec = decode_exec(dec);

  exercise(serving ? kServingFwd : kFwd, dec, fa, exec, fwd_slots, tame, rng, selscan_fwd_workspace_size,
           [](const selscan_fwd_args_t* a, const selscan_exec_t* e) {
             size_t b;
             return selscan_fwd_workspace_size(a, e, &b);
           },
           selscan_fwd, true);
  // Whether the forward's outputs now hold computed values (the backward reads out and x).
  bool fwd_ok = true;
  for (const Slot* s : {&out, &x})
    if (s->mem && s->backed && !s->partial) {
      const unsigned char* b = static_cast<const unsigned char*>(s->t->data);
      for (int64_t off : s->elems) fwd_ok = fwd_ok && !(b[off] == kPoison && b[off + 1] == kPoison);
    }
  // x is partial, so the loop above cannot see it: a block-table sequence whose final state's entry is pad_slot_id
  // is padding, the forward writes its out as zeros and none of its x, and the backward (which takes h0, no block
  // table) computes that sequence from the unwritten x (poison in, NaN of the poison's bits out).
  if (sv.blocks)
    for (int64_t b = 0; b < d.seqs && fwd_ok; ++b) {
      const int64_t len = sv.varlen ? std::clamp<int64_t>(wrap(sv.cu[static_cast<size_t>(b)], -1,
                                                              sv.cu[static_cast<size_t>(b + 1)]), 0, d.L)
                                    : d.L;
      const int64_t j = len > 0 ? (sv.ctx[static_cast<size_t>(b)] + len - 1) / sv.K : -1;
      if (j >= 0 && j < sv.M && sv.table[static_cast<size_t>(b * sv.M + j)] == sv.pad) fwd_ok = false;
    }

  // The forward's tensors are the backward's inputs again (same descriptors and memory), out and x now as
  // inputs; a pool call's backward takes the states its sequences started from as h0.
  selscan_bwd_args_t ba{};
  ba.struct_size = fuzz_struct_size(dec, sizeof(ba));
  ba.u = fa.u, ba.delta = fa.delta, ba.A = fa.A, ba.B = fa.B, ba.C = fa.C, ba.D = fa.D, ba.z = fa.z;
  ba.delta_bias = fa.delta_bias, ba.h0 = fa.h0, ba.x = fa.x;
  ba.out = p.has_z || one_in(f, 8) ? fa.out : selscan_tensor_t{};
  ba.cu_seqlens = fa.cu_seqlens, ba.cache_indices = fa.cache_indices, ba.has_initial_state = fa.has_initial_state;
  ba.pad_slot_id = sv.blocks && !sv.has_idx ? 0 : sv.pad;  // the block table's padding is not a backward field
  ba.delta_softplus = p.softplus;
  ba.deterministic = p.deterministic;
  ba.flags = p.bwd_flags;
  ba.reserved = p.bwd_reserved;
  Slot dout, du, ddelta, dA, dB, dC, dD, dz, dbias, dh0, out_z2, h0b;
  std::vector<Spec> bwd_specs = {
      {&dout, "dout", &ba.dout, canon(Kind::bdl, d), false, true},
      {&du, "du", &ba.du, canon(Kind::bdl, d, false, false, true), true, true},
      {&ddelta, "ddelta", &ba.ddelta, canon(Kind::bdl, d, false, false, true), true, true},
      {&dA, "dA", &ba.dA, canon(Kind::dn, d, false, false, true), true, true},
      {&dB, "dB", &ba.dB, canon(Kind::bc, d, p.var_B, p.bc3d_B, true), true, true},
      {&dC, "dC", &ba.dC, canon(Kind::bc, d, p.var_C, p.bc3d_C, true), true, true},
      {&dD, "dD", &ba.dD, canon(Kind::vec, d, false, false, true), true, p.has_D},
      {&dz, "dz", &ba.dz, canon(Kind::bdl, d, false, false, true), true, p.has_z},
      {&dbias, "ddelta_bias", &ba.ddelta_bias, canon(Kind::vec, d, false, false, true), true, p.has_bias},
      {&dh0, "dh0", &ba.dh0, canon(Kind::bdn, d, false, false, true), true, p.want_dh0},
      {&out_z2, "out_z(bwd)", &ba.out_z, canon(Kind::bdl, d, false, false, true), true, p.want_out_z},
  };
  if (sv.pool) bwd_specs.push_back({&h0b, "h0(bwd)", &ba.h0, canon(Kind::bdn, d), false, sv.bwd_h0});
  // The shared input slots, re-pointed at the backward's copies of their descriptors.
  Slot* shared[] = {&u, &delta, &A, &B, &C, &Dv, &z, &bias, &h0, &x, &out, &cu, &idx, &init};
  selscan_tensor_t* shared_t[] = {&ba.u, &ba.delta, &ba.A, &ba.B, &ba.C, &ba.D, &ba.z, &ba.delta_bias, &ba.h0,
                                  &ba.x, &ba.out, &ba.cu_seqlens, &ba.cache_indices, &ba.has_initial_state};
  std::vector<Slot*> bwd_slots;
  for (size_t i = 0; i < sizeof(shared) / sizeof(shared[0]); ++i) {
    shared[i]->t = shared_t[i];
    shared[i]->output = false;
    if (shared_t[i]->data == nullptr || (sv.pool && shared[i] == &h0)) continue;
    bwd_slots.push_back(shared[i]);
  }
  build(dec, bwd_specs, bwd_slots, rng, tame);
  const selscan_exec_t exec2 = decode_exec(dec);
  exercise(serving ? kServingBwd : kBwd, dec, ba, exec2, bwd_slots, tame && fwd_ok, rng, selscan_bwd_workspace_size,
           [](const selscan_bwd_args_t* a, const selscan_exec_t* e) {
             size_t b;
             return selscan_bwd_workspace_size(a, e, &b);
           },
           selscan_bwd, ba.deterministic == 1);
}

// ------------------------------------------------------------------------------------------ decode step
// selscan_state_update (selscan.h section 5b): the Mamba-1 form or the heads form, T tokens or no tokens dim,
// groups, each optional tensor present or not, dt/z/B/C/state in float32 or x's dtype, stride-0 broadcasts
// (Mamba-2's A (H, P, N) with strides (1, 0, 0)), C a view of B's memory, slot indices with padding, duplicates
// and entries outside the pool (which the call cannot reject: out is NaN there and no slot is touched).
void run_state_update(Decoder& dec, uint64_t& rng, bool tame) {
  FuzzedDataProvider& f = dec.fdp();
  const bool heads = f.ConsumeBool(), has_t = f.ConsumeBool();
  const int64_t Bt = f.ConsumeIntegralInRange<int64_t>(1, 4), T = has_t ? f.ConsumeIntegralInRange<int64_t>(1, 4) : 1;
  const int64_t H = dec.pick({1, 2, 3, 4, 6, 8}), P = heads ? dec.pick({1, 2, 3, 4}) : 1;
  int64_t N = f.ConsumeBool() ? f.ConsumeIntegralInRange<int64_t>(1, 16) : dec.pick({1, 8, 16, 17, 32, 64, 128, 256});
  if (Bt * T * H * P * N > kMaxWork) N = std::max<int64_t>(1, kMaxWork / (Bt * T * H * P));
  const int64_t gpick = f.ConsumeIntegralInRange<int64_t>(1, 8);
  int64_t G = 1;
  for (int64_t g = gpick; g >= 1; --g)
    if (H % g == 0) {
      G = g;
      break;
    }
  if (dec.mutate()) G = gpick;
  const bool grouped = G > 1 || f.ConsumeBool();
  const int32_t it = static_cast<int32_t>(f.ConsumeIntegralInRange<int>(0, 2));
  auto ftype = [&] { return f.ConsumeBool() ? SELSCAN_DTYPE_FLOAT32 : it; };
  const int32_t dt_t = ftype(), z_t = ftype(), B_t = ftype(), C_t = ftype(), st_t = ftype();
  const bool has_idx = f.ConsumeBool(), has_D = f.ConsumeBool(), has_z = f.ConsumeBool(), has_bias = f.ConsumeBool();
  const int64_t S = has_idx ? f.ConsumeIntegralInRange<int64_t>(1, 6) : Bt;

  selscan_state_update_args_t a = SELSCAN_STATE_UPDATE_ARGS_INIT;
  a.struct_size = fuzz_struct_size(dec, sizeof(a));
  a.pad_slot_id = has_idx ? dec.pick({-1, -1, 0, S, 2, INT64_MIN, int64_t{1} << 32}) : dec.pick({-1, 0, 5});
  a.dt_softplus = f.ConsumeBool() ? 1 : 0;
  if (dec.mutate()) a.dt_softplus = static_cast<int32_t>(dec.pick({2, -1, INT32_MAX}));
  if (dec.mutate()) a.flags = static_cast<int32_t>(dec.pick({1, -1, 1 << 20}));

  std::vector<int64_t> xs = has_t ? std::vector<int64_t>{Bt, T} : std::vector<int64_t>{Bt};
  std::vector<int64_t> ch = heads ? std::vector<int64_t>{H, P} : std::vector<int64_t>{H};
  std::vector<int64_t> bc = xs;
  if (grouped) bc.push_back(G);
  bc.push_back(N);
  xs.insert(xs.end(), ch.begin(), ch.end());
  std::vector<int64_t> st = {S}, wa = ch;
  st.insert(st.end(), ch.begin(), ch.end());
  st.push_back(N);
  wa.push_back(N);
  auto in = [](std::vector<int64_t> s, int32_t dt) { return Canon{std::move(s), dt, false, true}; };

  Slot x, dt, A, B, C, Dv, z, bias, idx, state, out;
  idx.values = has_idx ? decode_slots(dec, Bt, S, a.pad_slot_id) : std::vector<int64_t>{};
  state.inout = true;
  state.index = &idx;
  state.pad = a.pad_slot_id;
  const bool c_views_b = C_t == B_t && one_in(f, 8);
  const std::vector<Spec> specs = {
      {&x, "x", &a.x, in(xs, it), false, true},
      {&dt, "dt", &a.dt, in(xs, dt_t), false, true},
      {&A, "A", &a.A, in(wa, SELSCAN_DTYPE_FLOAT32), false, true},
      {&B, "B", &a.B, in(bc, B_t), false, true},
      {&C, "C", &a.C, in(bc, C_t), false, !c_views_b},
      {&Dv, "D", &a.D, in(ch, SELSCAN_DTYPE_FLOAT32), false, has_D},
      {&z, "z", &a.z, in(xs, z_t), false, has_z},
      {&bias, "dt_bias", &a.dt_bias, in(ch, SELSCAN_DTYPE_FLOAT32), false, has_bias},
      {&idx, "state_batch_indices", &a.state_batch_indices, index_canon(Bt, f.ConsumeBool() ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32), false, has_idx},
      {&state, "state", &a.state, Canon{st, st_t, false, false}, false, true},
      {&out, "out", &a.out, Canon{xs, it, false, false}, true, true},
  };
  std::vector<Slot*> slots;
  for (const Spec& sp : specs) {
    sp.s->name = sp.name;
    sp.s->t = sp.t;
    sp.s->output = sp.output;
    dec.describe(*sp.t, sp.c, sp.present);
    if (sp.s == &A && heads && A.t->ndim == 3 && one_in(f, 4)) {
      // Mamba-2: one A value per head, expanded over (P, N).
      A.t->strides[0] = 1, A.t->strides[1] = 0, A.t->strides[2] = 0;
    }
    back(*sp.s, dec.misalign(), rng, tame);
    if (sp.s == &C && c_views_b) {  // B and C as views of one tensor: C reads B's memory
      a.C = a.B;
      C.backed = B.backed;
    }
    slots.push_back(sp.s);
  }
  const selscan_exec_t exec = decode_exec(dec);
  auto probe = [](const selscan_state_update_args_t* args, const selscan_exec_t* e) {
    return selscan_state_update(args, e);
  };
  auto query = [](const selscan_state_update_args_t* args, const selscan_exec_t*, size_t* bytes) {
    if (bytes) *bytes = 0;
    const selscan_exec_t cuda = cuda_probe_exec();
    const selscan_status_t s = selscan_state_update(args, &cuda);
    return s == SELSCAN_STATUS_CUDA_NOT_BUILT ? SELSCAN_STATUS_SUCCESS : s;
  };
  exercise(kStateUpdate, dec, a, exec, slots, tame, rng, query, probe, selscan_state_update, true);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Decoder dec(data, size);
  FuzzedDataProvider& f = dec.fdp();
  const int chaos = f.ConsumeIntegralInRange<int>(0, 2);
  const bool tame = !one_in(f, 8);
  uint64_t rng = f.ConsumeIntegral<uint64_t>();
  dec.set_chaos(chaos);
  // 0, 1: a dense forward and backward; 2: the same with serving fields; 3: a decode step.
  const int path = f.ConsumeIntegralInRange<int>(0, 3);

  // Cheap entry points with fuzzed arguments.
  // (0..15: the values a C++ caller can hold in the enum; 14 and 15 are not statuses.)
  if (selscan_status_string(static_cast<selscan_status_t>(f.ConsumeIntegralInRange<int>(0, 15))) == nullptr)
    die("selscan_status_string", "returned NULL");
  (void)selscan_version();
  (void)selscan_version_string();
  (void)selscan_build_info();
  int32_t count = -1;
  if (selscan_cuda_device_count(f.ConsumeBool() ? &count : nullptr) == SELSCAN_STATUS_SUCCESS && count != 0)
    die("selscan_cuda_device_count", "a CPU-only build reports devices");
  check_failure(selscan_check_device(f.ConsumeIntegral<int32_t>()), "selscan_check_device");

  if (path == 3)
    run_state_update(dec, rng, tame);
  else
    run_scan(dec, rng, tame, path == 2);
  stats().inputs++;
  stats().report();
  return 0;
}
