// The field model of the ConnectX programming interface (PRM).
//
// Every PRM structure is a big-endian bit string: bit 0 is the most significant bit of byte 0, so
// dword N holds bits 32N..32N+31 and a field at bit offset `off` of width `w` sits in dword off/32
// at shift 32 - off%32 - w. This is the numbering the PRM tables and the kernel's mlx5_ifc.h use.
//
// A structure is described once, as data: a Layout is a name, a size in bits and a table of Fields
// (name, bit offset, bit width). get_bits()/set_bits() are the one accessor every encoder and
// decoder goes through. Typed views (View<S>) sit on top so that a field of one structure cannot be
// written into a buffer of another.
//
// Freestanding: no exceptions, no RTTI, no C++ library, no allocation.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

namespace melon::mlx5::prm {

struct Layout;

struct Field {
  const char* name;
  uint32_t bit_off;
  uint32_t bit_width;  // 0 for a flexible array (its length comes from elsewhere)
  const Layout* sub;  // the embedded structure's layout, or nullptr
  uint32_t elem_bits;  // element size of a flexible array, else 0

  constexpr uint32_t byte_off() const { return bit_off / 8; }
  constexpr uint32_t byte_len() const { return bit_width / 8; }
  constexpr bool flexible() const { return bit_width == 0; }
};

struct Layout {
  const char* name;
  uint32_t size_bits;
  const Field* fields;
  uint32_t count;

  constexpr uint32_t size_bytes() const { return size_bits / 8; }
  constexpr uint32_t size_dw() const { return size_bits / 32; }
};

// A named value of a field (an opcode, a status, a state). Sets of them are X-macros too, so the
// enumerators and the name table come from one list.
struct Constant {
  const char* name;
  uint32_t value;
};

struct ConstantSet {
  const char* name;
  const Constant* items;
  uint32_t count;
};

// The name of `value` in `set`, or nullptr. The first entry wins when two names share a value.
inline const char* constant_name(const ConstantSet& set, uint32_t value) {
  for (uint32_t i = 0; i < set.count; ++i)
    if (set.items[i].value == value) return set.items[i].name;
  return nullptr;
}

// ---- the one accessor ---------------------------------------------------------------------------

// Reads `width` (1..64) bits at big-endian bit offset `off`.
inline uint64_t get_bits(const void* buf, uint32_t off, uint32_t width) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  uint32_t first = off / 8;
  uint32_t last = (off + width - 1) / 8;
  uint32_t lead = off % 8;  // bits of the first byte above the field
  uint32_t trail = 7 - (off + width - 1) % 8;  // bits of the last byte below the field
  // At most 9 bytes; keep the top byte apart so 64-bit fields at odd offsets do not overflow.
  uint64_t v = p[first] & (0xffu >> lead);
  if (first == last) return v >> trail;
  for (uint32_t i = first + 1; i < last; ++i) v = (v << 8) | p[i];
  // Now add the last byte's bits that belong to the field.
  uint32_t keep = 8 - trail;
  v = (v << keep) | (uint64_t(p[last]) >> trail);
  return v;
}

// Writes the low `width` (1..64) bits of `value` at big-endian bit offset `off`; bits of `value`
// above `width` are ignored, neighbouring fields are untouched.
inline void set_bits(void* buf, uint32_t off, uint32_t width, uint64_t value) {
  uint8_t* p = static_cast<uint8_t*>(buf);
  if (width < 64) value &= (uint64_t(1) << width) - 1;
  uint32_t end = off + width;  // one past the field's last bit
  uint32_t bit = end;
  // Walk from the least significant end, one byte (or part of one) at a time.
  while (bit > off) {
    uint32_t byte = (bit - 1) / 8;
    uint32_t byte_start = byte * 8;
    uint32_t lo = bit;  // one past the last field bit in this byte
    uint32_t hi = off > byte_start ? off : byte_start;  // first field bit in this byte
    uint32_t n = lo - hi;
    uint32_t shift = byte_start + 8 - lo;
    uint8_t mask = static_cast<uint8_t>(((1u << n) - 1) << shift);
    p[byte] = static_cast<uint8_t>((p[byte] & ~mask) | ((uint32_t(value) << shift) & mask));
    value = n < 64 ? value >> n : 0;
    bit = hi;
  }
}

inline uint64_t get(const void* buf, const Field& f) { return get_bits(buf, f.bit_off, f.bit_width); }
inline void set(void* buf, const Field& f, uint64_t v) { set_bits(buf, f.bit_off, f.bit_width, v); }

// A byte-aligned field (GID, MAC, embedded structure, flexible array) as a byte range.
inline uint8_t* addr(void* buf, const Field& f) { return static_cast<uint8_t*>(buf) + f.byte_off(); }
inline const uint8_t* addr(const void* buf, const Field& f) { return static_cast<const uint8_t*>(buf) + f.byte_off(); }

// ---- compile-time checks on a table -------------------------------------------------------------

// Fields lie inside the structure, come in offset order, and scalar fields do not overlap one
// another (embedded unions are described as several Layouts, never as overlapping fields).
constexpr bool layout_ok(const Field* f, uint32_t n, uint32_t size_bits) {
  if (size_bits == 0 || size_bits % 32 != 0) return false;
  uint32_t next = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (f[i].bit_off < next) return false;
    if (f[i].bit_off + f[i].bit_width > size_bits) return false;
    if (f[i].sub && f[i].sub->size_bits != f[i].bit_width) return false;
    if (f[i].bit_width == 0) {
      if (f[i].elem_bits == 0 || f[i].bit_off % 8 != 0) return false;
    } else if (f[i].bit_width > 64 && (f[i].bit_off % 8 != 0 || f[i].bit_width % 8 != 0)) {
      return false;  // wide fields are byte ranges
    }
    next = f[i].bit_off + f[i].bit_width;
  }
  return true;
}

// ---- typed fields and views ---------------------------------------------------------------------

// A field of structure S (S is the structure's `Self` tag type).
template <class S>
struct Scalar : Field {};
// An embedded structure T at a fixed place inside S.
template <class S, class T>
struct Sub : Field {};
// A flexible array of T-sized (or elem_bits-sized) elements at the end of S.
template <class S>
struct Flex : Field {};

template <class S>
class View {
 public:
  explicit View(void* p) : p_(static_cast<uint8_t*>(p)) {}
  uint8_t* data() const { return p_; }
  static constexpr uint32_t size_bytes() { return S::size_bits / 8; }

  uint64_t get(const Scalar<S>& f) const { return get_bits(p_, f.bit_off, f.bit_width); }
  View& set(const Scalar<S>& f, uint64_t v) {
    set_bits(p_, f.bit_off, f.bit_width, v);
    return *this;
  }
  // Wide byte-aligned fields (GIDs, MAC bytes, mailbox data).
  uint8_t* bytes(const Scalar<S>& f) const { return p_ + f.byte_off(); }
  View& set_bytes(const Scalar<S>& f, const void* src) {
    memcpy(p_ + f.byte_off(), src, f.byte_len());
    return *this;
  }
  template <class T>
  View<T> at(const Sub<S, T>& f) const {
    return View<T>(p_ + f.byte_off());
  }
  // Element i of a flexible array.
  uint8_t* elem(const Flex<S>& f, uint32_t i) const { return p_ + f.byte_off() + i * (f.elem_bits / 8); }
  void clear() { memset(p_, 0, size_bytes()); }

 private:
  uint8_t* p_;
};

template <class S>
class ConstView {
 public:
  explicit ConstView(const void* p) : p_(static_cast<const uint8_t*>(p)) {}
  ConstView(View<S> v) : p_(v.data()) {}  // NOLINT: a writable view reads too
  const uint8_t* data() const { return p_; }
  uint64_t get(const Scalar<S>& f) const { return get_bits(p_, f.bit_off, f.bit_width); }
  const uint8_t* bytes(const Scalar<S>& f) const { return p_ + f.byte_off(); }
  template <class T>
  ConstView<T> at(const Sub<S, T>& f) const {
    return ConstView<T>(p_ + f.byte_off());
  }
  const uint8_t* elem(const Flex<S>& f, uint32_t i) const { return p_ + f.byte_off() + i * (f.elem_bits / 8); }

 private:
  const uint8_t* p_;
};

// A 48-bit MAC address kept as two fields (bits 47:32 and 31:0), as the PRM does.
inline void set_mac(void* buf, const Field& hi16, const Field& lo32, const uint8_t mac[6]) {
  set(buf, hi16, (uint64_t(mac[0]) << 8) | mac[1]);
  set(buf, lo32, (uint64_t(mac[2]) << 24) | (uint64_t(mac[3]) << 16) | (uint64_t(mac[4]) << 8) | mac[5]);
}
inline void get_mac(const void* buf, const Field& hi16, const Field& lo32, uint8_t mac[6]) {
  uint64_t hi = get(buf, hi16), lo = get(buf, lo32);
  mac[0] = uint8_t(hi >> 8), mac[1] = uint8_t(hi);
  mac[2] = uint8_t(lo >> 24), mac[3] = uint8_t(lo >> 16), mac[4] = uint8_t(lo >> 8), mac[5] = uint8_t(lo);
}

}  // namespace melon::mlx5::prm

// ---- defining a structure -----------------------------------------------------------------------
//
// A structure's field list is an X-macro taking three macros:
//   F(name, bit_off, bit_width)        a scalar or byte-range field
//   S(name, bit_off, struct_name)      an embedded structure (its width is that structure's size)
//   A(name, bit_off, elem_bits)        a flexible array at the end
// MELON_PRM_STRUCT(name, size_bits, LIST) then makes namespace `name` with one constant per field,
// `fields[]`, `layout` and the `Self` tag, and checks the table at compile time.

#define MELON_PRM_NS ::melon::mlx5::prm
#define MELON_PRM_F_DECL(n, o, w) inline constexpr MELON_PRM_NS::Scalar<Self> n{{#n, o, w, nullptr, 0}};
#define MELON_PRM_S_DECL(n, o, t)                                    \
  inline constexpr MELON_PRM_NS::Sub<Self, MELON_PRM_NS::t::Self> n{ \
      {#n, o, MELON_PRM_NS::t::Self::size_bits, &MELON_PRM_NS::t::layout, 0}};
#define MELON_PRM_A_DECL(n, o, e) inline constexpr MELON_PRM_NS::Flex<Self> n{{#n, o, 0, nullptr, e}};
#define MELON_PRM_REF(n, o, w) n,

#define MELON_PRM_STRUCT(sname, bits, LIST)                                                                         \
  namespace sname {                                                                                                 \
  struct Self {                                                                                                     \
    static constexpr uint32_t size_bits = bits;                                                                     \
  };                                                                                                                \
  LIST(MELON_PRM_F_DECL, MELON_PRM_S_DECL, MELON_PRM_A_DECL)                                                        \
  inline constexpr MELON_PRM_NS::Field fields[] = {LIST(MELON_PRM_REF, MELON_PRM_REF, MELON_PRM_REF)};              \
  inline constexpr MELON_PRM_NS::Layout layout{#sname, bits, fields, uint32_t(sizeof(fields) / sizeof(fields[0]))}; \
  static_assert(MELON_PRM_NS::layout_ok(fields, layout.count, bits), #sname ": bad field table");                   \
  using view = MELON_PRM_NS::View<Self>;                                                                            \
  using cview = MELON_PRM_NS::ConstView<Self>;                                                                      \
  inline constexpr uint32_t size_bytes = bits / 8;                                                                  \
  }

// MELON_PRM_VALUES(name, type, LIST) with LIST(V) calling V(ENUMERATOR, value): namespace `name`
// holding an unscoped enum `Value` (so enumerators convert to field values without casts), the
// ConstantSet `set` and name_of().
#define MELON_PRM_V_ENUM(n, v) n = v,
#define MELON_PRM_V_ROW(n, v) {#n, v},
#define MELON_PRM_VALUES(ename, type, LIST)                                                                  \
  namespace ename {                                                                                          \
  enum Value : type { LIST(MELON_PRM_V_ENUM) };                                                              \
  inline constexpr MELON_PRM_NS::Constant items[] = {LIST(MELON_PRM_V_ROW)};                                 \
  inline constexpr MELON_PRM_NS::ConstantSet set{#ename, items, uint32_t(sizeof(items) / sizeof(items[0]))}; \
  inline const char* name_of(uint32_t v) { return MELON_PRM_NS::constant_name(set, v); }                     \
  }
