// The forward mode's receive ring (src/providers/soft/share_ring.h), deterministically: datagrams in
// order across many wrap-arounds, a full ring's drop counted, an oversize datagram refused, and a
// torn, forged or random mapping from a crashed or hostile peer never read past (the ASan build
// would report it) nor handed on with a length beyond a slot.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "providers/soft/share_ring.h"

namespace {

using namespace melon::soft;

constexpr uint64_t kNonce = 0x1234567890abcdefull;

struct Ring {
  std::vector<uint64_t> mem = std::vector<uint64_t>(ring_bytes() / 8 + 1);  // 8-byte aligned, like a mapping
  RingProducer prod;
  RingConsumer cons;
  Ring() {
    ring_init(bytes(), kNonce);
    EXPECT_TRUE(prod.attach(bytes(), ring_bytes(), kNonce));
    EXPECT_TRUE(cons.attach(bytes(), ring_bytes(), kNonce));
  }
  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(mem.data()); }
  uint32_t& index(size_t at) { return *reinterpret_cast<uint32_t*>(bytes() + at); }
  uint8_t* slot(uint32_t i) { return bytes() + ring_layout().slots + size_t(i % kRingSlots) * ring_layout().stride; }
};

RingMeta meta_of(uint32_t i) {
  RingMeta m;
  std::memset(m.src, 0, 16);
  m.src[10] = m.src[11] = 0xff;
  std::memcpy(m.src + 12, &i, 4);
  m.sport = uint16_t(49152 + i % 1000);
  m.likely_id = uint16_t(i % 7);
  return m;
}

std::vector<uint8_t> datagram_of(uint32_t i) {
  std::vector<uint8_t> d(12 + (i * 37) % 4096);
  for (size_t j = 0; j < d.size(); ++j) d[j] = uint8_t(i * 131 + j);
  return d;
}

TEST(SoftShareRing, DatagramsComeOutInOrderAcrossWrapArounds) {
  Ring r;
  uint32_t sent = 0, got = 0;
  std::mt19937 rng(7);
  while (got < 5 * kRingSlots + 17) {  // bursts of 1..200 in, 1..150 out: every slot reused many times
    for (uint32_t k = rng() % 200 + 1; k && sent - got < kRingSlots; --k, ++sent) {
      const auto d = datagram_of(sent);
      ASSERT_TRUE(r.prod.push(d.data(), d.size(), meta_of(sent)));
    }
    r.cons.pop(rng() % 150 + 1, [&](const uint8_t* data, size_t len, const RingMeta& m) {
      const auto want = datagram_of(got);
      ASSERT_EQ(len, want.size());
      EXPECT_EQ(std::memcmp(data, want.data(), len), 0) << got;
      const RingMeta wm = meta_of(got);
      EXPECT_EQ(std::memcmp(m.src, wm.src, 16), 0);
      EXPECT_EQ(m.sport, wm.sport);
      EXPECT_EQ(m.likely_id, wm.likely_id);
      EXPECT_FALSE(m.v6);
      ++got;
    });
  }
  EXPECT_EQ(r.prod.full_drops(), 0u);
  EXPECT_EQ(r.cons.bad(), 0u);
}

TEST(SoftShareRing, AFullRingDropsAndCountsUntilTheConsumerReads) {
  Ring r;
  const uint8_t d[16] = {1};
  for (uint32_t i = 0; i < kRingSlots; ++i) ASSERT_TRUE(r.prod.push(d, sizeof d, meta_of(i)));
  EXPECT_FALSE(r.prod.push(d, sizeof d, meta_of(0)));
  EXPECT_FALSE(r.prod.push(d, sizeof d, meta_of(0)));
  EXPECT_EQ(r.prod.full_drops(), 2u);
  EXPECT_EQ(r.cons.pop(1, [](const uint8_t*, size_t, const RingMeta&) {}), 1u);
  EXPECT_TRUE(r.prod.push(d, sizeof d, meta_of(0)));  // one slot free again
  EXPECT_FALSE(r.prod.push(d, sizeof d, meta_of(0)));
  EXPECT_EQ(r.prod.full_drops(), 3u);
  EXPECT_EQ(r.cons.pop(2 * kRingSlots, [](const uint8_t*, size_t, const RingMeta&) {}), kRingSlots);
  EXPECT_FALSE(r.cons.pending());
}

TEST(SoftShareRing, ADatagramLongerThanASlotIsRefusedAndCounted) {
  Ring r;
  std::vector<uint8_t> big(kRingDatagram + 1, 0xab);
  EXPECT_FALSE(r.prod.push(big.data(), big.size(), meta_of(0)));
  EXPECT_EQ(r.prod.oversize_drops(), 1u);
  EXPECT_FALSE(r.cons.pending());
  EXPECT_TRUE(r.prod.push(big.data(), kRingDatagram, meta_of(0)));  // exactly a slot: fine
  size_t len = 0;
  r.cons.pop(1, [&](const uint8_t*, size_t l, const RingMeta&) { len = l; });
  EXPECT_EQ(len, size_t(kRingDatagram));
}

TEST(SoftShareRing, ATornSlotIsSkippedAndTheNextOneDelivered) {
  Ring r;
  const uint8_t d[20] = {9, 9, 9};
  ASSERT_TRUE(r.prod.push(d, sizeof d, meta_of(1)));
  ASSERT_TRUE(r.prod.push(d, sizeof d, meta_of(2)));
  // A peer that died (or lies) halfway: the first slot's length is garbage, the second's family too.
  const uint32_t huge = 0xfffffff0u;
  std::memcpy(r.slot(0), &huge, 4);
  ASSERT_TRUE(r.prod.push(d, sizeof d, meta_of(3)));
  r.slot(1)[8] = 7;  // v6 flag byte: neither 0 nor 1
  std::vector<uint32_t> ports;
  r.cons.pop(10, [&](const uint8_t*, size_t len, const RingMeta& m) {
    EXPECT_EQ(len, sizeof d);
    ports.push_back(m.sport);
  });
  EXPECT_EQ(r.cons.bad(), 2u);
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_EQ(ports[0], meta_of(3).sport);
}

TEST(SoftShareRing, AForgedProducerIndexIsCountedNotFollowed) {
  Ring r;
  const uint8_t d[8] = {};
  ASSERT_TRUE(r.prod.push(d, sizeof d, meta_of(0)));
  r.index(ring_layout().head) += 5 * kRingSlots;  // more than the ring holds
  uint32_t n = r.cons.pop(100, [](const uint8_t*, size_t, const RingMeta&) {});
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(r.cons.bad(), 1u);
  EXPECT_FALSE(r.cons.pending());  // it starts again from there
  // A consumer index the consumer never had (ahead of the producer): the producer sees a full ring.
  Ring s;
  s.index(ring_layout().tail) = 1000;
  EXPECT_FALSE(s.prod.push(d, sizeof d, meta_of(0)));
  EXPECT_EQ(s.prod.full_drops(), 1u);
}

TEST(SoftShareRing, RandomBytesInTheWholeMappingNeverCrashTheConsumer) {
  std::mt19937_64 rng(25);
  for (int round = 0; round < 12; ++round) {
    Ring r;
    uint8_t* b = r.bytes();
    const size_t from = ring_layout().head;  // geometry stays; indices and slots are noise
    for (size_t i = from; i + 8 <= ring_bytes(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(b + i, &v, 8);
    }
    RingConsumer c;
    ASSERT_TRUE(c.attach(b, ring_bytes(), kNonce));
    if (round % 2) r.index(ring_layout().head) = r.index(ring_layout().tail) + uint32_t(rng() % (kRingSlots + 1));
    uint32_t delivered = 0;
    c.pop(2 * kRingSlots, [&](const uint8_t* data, size_t len, const RingMeta&) {
      ASSERT_LE(len, size_t(kRingDatagram));
      volatile uint8_t sum = 0;
      for (size_t j = 0; j < len; ++j) sum = uint8_t(sum + data[j]);  // every byte readable (ASan)
      ++delivered;
    });
    EXPECT_LE(delivered, kRingSlots);
  }
}

TEST(SoftShareRing, AttachRefusesAnotherRingOrLayout) {
  Ring r;
  RingProducer p;
  EXPECT_FALSE(p.attach(r.bytes(), ring_bytes(), kNonce + 1));  // a member that left; its slot reused
  EXPECT_FALSE(p.attach(r.bytes(), ring_bytes() - 1, kNonce));
  EXPECT_FALSE(p.attach(nullptr, ring_bytes(), kNonce));
  r.bytes()[0] ^= 1;  // magic
  EXPECT_FALSE(p.attach(r.bytes(), ring_bytes(), kNonce));
  RingConsumer c;
  EXPECT_FALSE(c.attach(r.bytes(), ring_bytes(), kNonce));
  const uint8_t d[4] = {};
  EXPECT_FALSE(p.push(d, sizeof d, meta_of(0)));  // unattached: counted, nothing written
}

TEST(SoftShareRing, TwoMappingsOfOneFileAreOneRing) {
  char dir[] = "/tmp/melon-ring-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/r.ring";
  std::string why;
  RingFile mine, theirs;
  ASSERT_EQ(mine.create(path, kNonce, &why), 0) << why;
  ASSERT_EQ(theirs.open(path, &why), 0) << why;
  RingProducer p;
  RingConsumer c;
  ASSERT_TRUE(p.attach(theirs.mem(), theirs.bytes(), kNonce));
  ASSERT_TRUE(c.attach(mine.mem(), mine.bytes(), kNonce));
  const auto d = datagram_of(3);
  ASSERT_TRUE(p.push(d.data(), d.size(), meta_of(3)));
  std::vector<uint8_t> got;
  c.pop(4, [&](const uint8_t* data, size_t len, const RingMeta&) { got.assign(data, data + len); });
  EXPECT_EQ(got, d);
  // A file that is no ring (wrong size) is not mapped.
  const std::string other = std::string(dir) + "/x.ring";
  FILE* f = fopen(other.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("not a ring", f);
  fclose(f);
  RingFile bad;
  EXPECT_NE(bad.open(other, &why), 0);
  mine.close();
  theirs.close();
  unlink(path.c_str());
  unlink(other.c_str());
  rmdir(dir);
}

}  // namespace
