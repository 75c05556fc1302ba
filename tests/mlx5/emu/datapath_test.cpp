// The data path between two emulated HCAs over the in-memory link: WQEs read from IOVA rings, the
// transport (src/rc), CQEs with the PRM's opcodes, byte counts, immediates and error syndromes.
#include "harness.h"
#include "mlx5/emu/wire.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace wo = prm::wqe_opcode;
namespace co = prm::cqe_opcode;

struct Side {
  explicit Side(MemoryLink& link, uint8_t last_octet) : port(link.add_port()), h(config(last_octet), port) {
    link.attach(port, &h.dev);
    ip[3] = last_octet;
  }
  static DeviceConfig config(uint8_t o) {
    DeviceConfig c;
    c.mac[5] = o;
    return c;
  }
  FramePort* port;
  Harness h;
  uint8_t ip[4] = {10, 0, 0, 0};
  Harness::CqRing cq;
  Harness::QpRing qp;
  TestHost::Buffer mem;
  uint32_t key = 0;
  uint64_t va() const { return reinterpret_cast<uint64_t>(mem.va); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(mem.va); }
  void gid(uint8_t out[16]) const {
    uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ip[0], ip[1], ip[2], ip[3]};
    memcpy(out, g, 16);
  }
};

class EmuDataPath : public ::testing::Test {
 protected:
  uint8_t retry_count_ = 7;  // qpc.retry_count both QPs get
  uint8_t log_cq_ = 8;  // both sides' CQ size
  uint8_t cs_res_ = 0;  // both QPs' qpc.cs_res (responder scatter to CQE)
  MemoryLink link;
  Side a{link, 1}, b{link, 2};

  void SetUp() override {
    for (Side* s : {&a, &b}) {
      s->h.bring_up();
      ASSERT_TRUE(s->h.set_gid(0, s->ip).ok());
      ASSERT_TRUE(s->h.enable_roce().ok());
      s->cq = s->h.create_cq(log_cq_);
      const uint8_t cs = cs_res_;
      ASSERT_TRUE(s->h.create_qp_raw(s->qp, prm::qpc_st::RC, s->cq, s->cq,
                                     [cs](uint8_t* in) {
                                       prm::create_qp_in::view(in).at(prm::create_qp_in::qpc).set(prm::qpc::cs_res, cs);
                                     })
                      .ok());
      s->mem = s->h.host.alloc(256 * 1024);
      s->key = s->h.create_mkey(s->mem, 256 * 1024);
    }
    connect(a, b);
    connect(b, a);
  }
  void connect(Side& s, Side& peer) {
    Harness& h = s.h;
    ASSERT_TRUE(h.transition(op::RST2INIT_QP, s.qp.qpn, [](prm::qpc::view q) {
                   q.at(prm::qpc::primary_address_path).set(prm::ads::vhca_port_num, 1);
                   q.set(prm::qpc::rwe, 1).set(prm::qpc::rre, 1).set(prm::qpc::rae, 1);
                 }).ok());
    uint8_t dgid[16];
    peer.gid(dgid);
    uint32_t remote = peer.qp.qpn;
    Result r = h.transition(op::INIT2RTR_QP, s.qp.qpn, [&](prm::qpc::view q) {
      q.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES)
          .set(prm::qpc::remote_qpn, remote)
          .set(prm::qpc::next_rcv_psn, 100);
      q.set(prm::qpc::log_rra_max, 3).set(prm::qpc::min_rnr_nak, 1);
      auto p = q.at(prm::qpc::primary_address_path);
      p.set(prm::ads::src_addr_index, 0).set(prm::ads::hop_limit, 64).set_bytes(prm::ads::rgid_rip, dgid);
    });
    ASSERT_TRUE(r.ok()) << std::hex << r.syndrome;
    uint8_t retry = retry_count_;
    ASSERT_TRUE(h.transition(op::RTR2RTS_QP, s.qp.qpn, [&](prm::qpc::view q) {
                   q.set(prm::qpc::next_send_psn, 100).set(prm::qpc::retry_count, retry).set(prm::qpc::rnr_retry, 7);
                   q.set(prm::qpc::log_sra_max, 3).at(prm::qpc::primary_address_path).set(prm::ads::ack_timeout, 14);
                 }).ok());
  }
  void pump() {
    for (int i = 0; i < 100000; ++i)
      if (!(int(a.h.dev.service()) | int(b.h.dev.service()))) return;  // both, every round
    FAIL() << "devices never went idle";
  }
  const uint8_t* cqe(Side& s) {
    pump();
    return s.h.poll_cq(s.cq);
  }
};

TEST_F(EmuDataPath, Write64KiBLandsAndCompletesWithTheWqeCounter) {
  for (uint32_t i = 0; i < 65536; ++i) a.bytes()[i] = uint8_t(i * 7 + 1);
  Harness::SendOpts o;
  o.raddr = b.va() + 4096, o.rkey = b.key;
  uint16_t idx = a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 65536, a.key}}, o);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ);
  EXPECT_EQ(prm::get(e, prm::cqe64::sop_drop), wo::RDMA_WRITE);
  EXPECT_EQ(prm::get(e, prm::cqe64::wqe_counter), idx);
  EXPECT_EQ(prm::get(e, prm::cqe64::qpn), a.qp.qpn);
  EXPECT_EQ(memcmp(a.bytes(), b.bytes() + 4096, 65536), 0);
  EXPECT_EQ(b.h.poll_cq(b.cq), nullptr);  // a plain WRITE consumes nothing at the responder
  EXPECT_GE(link.frames(), 64u + 1);  // 64 packets of 1 KiB and at least one ACK
}

TEST_F(EmuDataPath, ReadReturnsRemoteBytesAndByteCount) {
  for (uint32_t i = 0; i < 8192; ++i) b.bytes()[100000 + i] = uint8_t(i ^ 0x5a);
  Harness::SendOpts o;
  o.raddr = b.va() + 100000, o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_READ, {{a.va() + 3000, 5000, a.key}, {a.va() + 20000, 3192, a.key}}, o);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ);
  EXPECT_EQ(prm::get(e, prm::cqe64::sop_drop), wo::RDMA_READ);
  EXPECT_EQ(prm::get(e, prm::cqe64::byte_cnt), 8192u);
  EXPECT_EQ(memcmp(a.bytes() + 3000, b.bytes() + 100000, 5000), 0);
  EXPECT_EQ(memcmp(a.bytes() + 20000, b.bytes() + 105000, 3192), 0);
}

TEST_F(EmuDataPath, SendWithImmediateMultiSgeAndInline) {
  b.h.post_recv(b.qp, {{b.va(), 100, b.key}, {b.va() + 1000, 4000, b.key}});
  b.h.post_recv(b.qp, {{b.va() + 8000, 256, b.key}});
  for (int i = 0; i < 3000; ++i) a.bytes()[i] = uint8_t(i);
  Harness::SendOpts o;
  o.imm = 0xdeadbeef;
  o.solicited = true;
  a.h.post_send(a.qp, wo::SEND_IMM, {{a.va(), 1000, a.key}, {a.va() + 1000, 2000, a.key}}, o);
  Harness::SendOpts in;
  in.has_inline = true;
  in.inline_data.assign(77, 0xab);
  a.h.post_send(a.qp, wo::SEND, {}, in);
  pump();
  const uint8_t* r1 = b.h.poll_cq(b.cq);
  ASSERT_NE(r1, nullptr);
  EXPECT_EQ(prm::get(r1, prm::cqe64::opcode), co::RESP_SEND_IMM);
  EXPECT_EQ(prm::get(r1, prm::cqe64::byte_cnt), 3000u);
  EXPECT_EQ(prm::get(r1, prm::cqe64::imm_inval_pkey), 0xdeadbeefu);
  EXPECT_EQ(prm::get(r1, prm::cqe64::se), 1u);
  EXPECT_EQ(prm::get(r1, prm::cqe64::wqe_counter), 0u);
  EXPECT_EQ(memcmp(b.bytes(), a.bytes(), 100), 0);
  EXPECT_EQ(memcmp(b.bytes() + 1000, a.bytes() + 100, 2900), 0);
  const uint8_t* r2 = b.h.poll_cq(b.cq);
  ASSERT_NE(r2, nullptr);
  EXPECT_EQ(prm::get(r2, prm::cqe64::opcode), co::RESP_SEND);
  EXPECT_EQ(prm::get(r2, prm::cqe64::byte_cnt), 77u);
  EXPECT_EQ(prm::get(r2, prm::cqe64::wqe_counter), 1u);
  EXPECT_EQ(b.bytes()[8000], 0xab);
  EXPECT_EQ(b.bytes()[8076], 0xab);
  ASSERT_NE(a.h.poll_cq(a.cq), nullptr);
  ASSERT_NE(a.h.poll_cq(a.cq), nullptr);
}

// The responder writes a message's bytes, each once, and nothing else of the buffer. It used to
// write back a copy of the whole receive buffer (or WRITE target) taken when it checked the key,
// which put old bytes over any the application had changed meanwhile: UCX posts SRQ buffers whose
// last bytes lie over the next buffer's header and changes that header while the buffer is posted
// (docs/rdmacm.md, the io_demo crash with mlx5_0 serving).
TEST_F(EmuDataPath, ResponderWritesOnlyTheBytesOfTheMessage) {
  std::vector<std::pair<uint64_t, size_t>> writes;
  b.h.host.on_write = [&](uint64_t iova, size_t len) {
    if (iova < b.mem.iova + 256 * 1024 && iova + len > b.mem.iova) writes.push_back({iova - b.mem.iova, len});
  };
  auto written = [&](uint64_t from, uint64_t to) {  // bytes written, each in [from, to) or the test fails
    size_t n = 0;
    for (auto [off, len] : writes) {
      EXPECT_GE(off, from);
      EXPECT_LE(off + len, to) << "a write of " << len << " at " << off;
      n += len;
    }
    writes.clear();
    return n;
  };
  for (int i = 0; i < 4096; ++i) a.bytes()[i] = uint8_t(i * 13 + 5);
  b.h.post_recv(b.qp, {{b.va(), 8192, b.key}});  // a receive far longer than the message
  a.h.post_send(a.qp, wo::SEND, {{a.va(), 3000, a.key}});
  const uint8_t* r = cqe(b);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(prm::get(r, prm::cqe64::byte_cnt), 3000u);
  EXPECT_EQ(memcmp(b.bytes(), a.bytes(), 3000), 0);
  EXPECT_EQ(written(0, 3000), 3000u);
  Harness::SendOpts o;
  o.raddr = b.va() + 50000, o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 4096, a.key}}, o);  // 4 packets of 1 KiB
  pump();
  EXPECT_EQ(memcmp(b.bytes() + 50000, a.bytes(), 4096), 0);
  EXPECT_EQ(written(50000, 50000 + 4096), 4096u);
  b.h.host.on_write = nullptr;
  ASSERT_NE(a.h.poll_cq(a.cq), nullptr);
  ASSERT_NE(a.h.poll_cq(a.cq), nullptr);
}

// What the responder writes whole it does not fetch first: no read of the receive buffer or the
// WRITE's target (melon-emud paid a system call per packet for it). The target is still checked: a
// WRITE to a key whose pages the IOMMU no longer maps is refused (a remote access error), not lost.
TEST_F(EmuDataPath, ResponderDoesNotReadWhatItOverwrites) {
  size_t reads = 0;
  b.h.host.on_read = [&](uint64_t iova, size_t len) {
    if (iova < b.mem.iova + 256 * 1024 && iova + len > b.mem.iova) reads++;
  };
  memset(a.bytes(), 0x6d, 4096);
  b.h.post_recv(b.qp, {{b.va(), 8192, b.key}});
  a.h.post_send(a.qp, wo::SEND, {{a.va(), 3000, a.key}});
  ASSERT_NE(cqe(b), nullptr);
  EXPECT_EQ(b.bytes()[2999], 0x6d);
  Harness::SendOpts o;
  o.raddr = b.va() + 50000, o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 4096, a.key}}, o);
  pump();
  EXPECT_EQ(b.bytes()[50000 + 4095], 0x6d);
  EXPECT_EQ(reads, 0u) << "reads of the receive buffer or the WRITE's target";
  b.h.host.on_read = nullptr;
  ASSERT_NE(a.h.poll_cq(a.cq), nullptr);
  ASSERT_NE(a.h.poll_cq(a.cq), nullptr);

  TestHost::Buffer gone = b.h.host.alloc(4096);
  uint32_t rkey = b.h.create_mkey(gone, 4096);
  ASSERT_TRUE(b.h.host.free(gone.iova));
  uint64_t faults = b.h.host.dma_faults();
  o.raddr = reinterpret_cast<uint64_t>(gone.va), o.rkey = rkey;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key}}, o);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::opcode), co::REQ_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::REMOTE_ACCESS_ERR);
  EXPECT_GT(b.h.host.dma_faults(), faults);
}

// A send's payload is fetched in blocks (rc::HostMemory::will_gather), not a DMA read per packet,
// and never a byte outside the work request's own segment: the bytes after it may belong to a work
// request not posted yet, which the application is still writing. A block serves only the engine
// call that read it: the same buffer sent again after the application changed it leaves with the
// new bytes.
TEST_F(EmuDataPath, SendPayloadIsFetchedInBlocksOfItsOwnSegmentOnly) {
  std::vector<std::pair<uint64_t, size_t>> reads;  // offsets into a's buffer, lengths
  a.h.host.on_read = [&](uint64_t iova, size_t len) {
    if (iova < a.mem.iova + 256 * 1024 && iova + len > a.mem.iova) reads.push_back({iova - a.mem.iova, len});
  };
  for (int round = 0; round < 2; ++round) {
    memset(a.bytes(), 0x11 * (round + 1), 65536);
    reads.clear();
    Harness::SendOpts o;
    o.raddr = b.va() + 16384 * round, o.rkey = b.key;
    a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va() + 4096, 16384, a.key}}, o);  // 16 packets of 1 KiB
    pump();
    ASSERT_NE(a.h.poll_cq(a.cq), nullptr);
    EXPECT_LE(reads.size(), 4u) << "DMA reads for 16 packets";
    for (auto [off, len] : reads) {
      EXPECT_GE(off, 4096u) << "a read before the segment";
      EXPECT_LE(off + len, 4096u + 16384) << "a read past the segment";
    }
    for (int i : {0, 1023, 1024, 16383}) EXPECT_EQ(b.bytes()[16384 * round + i], 0x11 * (round + 1)) << i;
  }
  a.h.host.on_read = nullptr;
}

// The same for READ responses: the responder fetches the asked range in blocks, and nothing else.
TEST_F(EmuDataPath, ReadResponsesAreFetchedInBlocksOfTheAskedRangeOnly) {
  for (uint32_t i = 0; i < 65536; ++i) b.bytes()[i] = uint8_t(i * 13 + 5);
  std::vector<std::pair<uint64_t, size_t>> reads;
  b.h.host.on_read = [&](uint64_t iova, size_t len) {
    if (iova < b.mem.iova + 256 * 1024 && iova + len > b.mem.iova) reads.push_back({iova - b.mem.iova, len});
  };
  Harness::SendOpts o;
  o.raddr = b.va() + 8192, o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_READ, {{a.va(), 20000, a.key}}, o);  // 20 response packets
  const uint8_t* e = cqe(a);
  b.h.host.on_read = nullptr;
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ);
  EXPECT_EQ(memcmp(a.bytes(), b.bytes() + 8192, 20000), 0);
  EXPECT_LE(reads.size(), 4u) << "DMA reads for 20 packets";
  for (auto [off, len] : reads) {
    EXPECT_GE(off, 8192u);
    EXPECT_LE(off + len, 8192u + 20000);
  }
}

// Device::set_ack_hold: the ACK of a SEND that completed a receive waits for the host's answer and
// leaves right after it (the peer's next request and our ACK together); without an answer it leaves
// when its time is up (release_due_acks) or when holding is turned off.
TEST_F(EmuDataPath, AHeldAckLeavesAfterTheAnswerOrWhenItsTimeIsUp) {
  struct Seen {
    uint8_t from, opcode;
  };
  std::vector<Seen> seen;
  link.drop_arg = &seen;
  link.drop = [](void* arg, const uint8_t* f, size_t len) {
    roce::IpUdp h;
    if (roce::parse_ip_udp(f, len, h) == roce::ParseError::ok && len > h.hdr_len)
      static_cast<std::vector<Seen>*>(arg)->push_back({h.src[15], f[h.hdr_len]});
    return false;
  };
  constexpr uint8_t kSendOnly = 0x04, kAck = 0x11;
  auto sent_by = [&](uint8_t from) {
    std::vector<uint8_t> ops;
    for (const Seen& x : seen)
      if (x.from == from) ops.push_back(x.opcode);
    return ops;
  };
  b.h.dev.set_ack_hold(1'000'000);
  a.h.post_recv(a.qp, {{a.va() + 8192, 64, a.key}});
  b.h.post_recv(b.qp, {{b.va(), 64, b.key}});
  b.h.post_recv(b.qp, {{b.va() + 64, 64, b.key}});

  // The ping: b completes the receive and holds its ACK, so a's SEND is not complete yet.
  a.h.post_send(a.qp, wo::SEND, {{a.va(), 8, a.key}});
  pump();
  ASSERT_NE(b.h.poll_cq(b.cq), nullptr);
  EXPECT_EQ(sent_by(2), std::vector<uint8_t>{}) << "b sent before its host answered";
  EXPECT_EQ(a.h.poll_cq(a.cq), nullptr);

  // The pong: b's SEND, then the ACK, one after the other.
  b.h.post_send(b.qp, wo::SEND, {{b.va() + 4096, 8, b.key}});
  pump();
  EXPECT_EQ(sent_by(2), (std::vector<uint8_t>{kSendOnly, kAck}));
  int completions = 0;
  while (a.h.poll_cq(a.cq)) completions++;
  EXPECT_EQ(completions, 2) << "a's SEND and its receive";

  // No answer: the ACK waits for its time, then leaves at the next release_due_acks.
  a.h.post_send(a.qp, wo::SEND, {{a.va(), 8, a.key}});
  pump();
  ASSERT_NE(b.h.poll_cq(b.cq), nullptr);
  while (b.h.poll_cq(b.cq)) {}
  const size_t before = sent_by(2).size();
  b.h.dev.release_due_acks();
  pump();
  EXPECT_EQ(sent_by(2).size(), before) << "released before its time";
  b.h.clock.advance(1'000'001);
  b.h.dev.release_due_acks();
  pump();
  ASSERT_EQ(sent_by(2).size(), before + 1);
  EXPECT_EQ(sent_by(2).back(), kAck);
  EXPECT_NE(a.h.poll_cq(a.cq), nullptr);

  // Holding off: what is held leaves at once.
  b.h.post_recv(b.qp, {{b.va(), 64, b.key}});
  a.h.post_send(a.qp, wo::SEND, {{a.va(), 8, a.key}});
  pump();
  EXPECT_EQ(sent_by(2).size(), before + 1);
  b.h.dev.set_ack_hold(0);
  pump();
  EXPECT_EQ(sent_by(2).size(), before + 2);
  EXPECT_NE(a.h.poll_cq(a.cq), nullptr);
  link.drop = nullptr;
}

TEST_F(EmuDataPath, WriteWithImmediateConsumesAReceive) {
  b.h.post_recv(b.qp, {{b.va(), 16, b.key}});
  Harness::SendOpts o;
  o.raddr = b.va() + 50000, o.rkey = b.key, o.imm = 0x01020304;
  memset(a.bytes(), 0x3c, 2048);
  a.h.post_send(a.qp, wo::RDMA_WRITE_IMM, {{a.va(), 2048, a.key}}, o);
  pump();
  const uint8_t* r = b.h.poll_cq(b.cq);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(prm::get(r, prm::cqe64::opcode), co::RESP_WR_IMM);
  EXPECT_EQ(prm::get(r, prm::cqe64::imm_inval_pkey), 0x01020304u);
  EXPECT_EQ(prm::get(r, prm::cqe64::byte_cnt), 2048u);
  EXPECT_EQ(b.bytes()[50000 + 2047], 0x3c);
}

TEST_F(EmuDataPath, SendWithInvalidateFreesTheRemoteKey) {
  TestHost::Buffer win = b.h.host.alloc(4096);
  uint32_t rkey = 0;
  ASSERT_TRUE(
      b.h.create_mkey_raw(
             win, 4096, 0xf, &rkey,
             [](uint8_t* in) {
               prm::create_mkey_in::view(in).at(prm::create_mkey_in::memory_key_mkey_entry).set(prm::mkc::en_rinval, 1);
             })
          .ok());
  b.h.post_recv(b.qp, {{b.va(), 64, b.key}});
  Harness::SendOpts o;
  o.imm = rkey;
  a.h.post_send(a.qp, wo::SEND_INVAL, {{a.va(), 8, a.key}}, o);
  pump();
  const uint8_t* r = b.h.poll_cq(b.cq);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(prm::get(r, prm::cqe64::opcode), co::RESP_SEND_INV);
  EXPECT_EQ(prm::get(r, prm::cqe64::imm_inval_pkey), rkey);
  ASSERT_NE(a.h.poll_cq(a.cq), nullptr);
  // The key is dead now: a WRITE through it is a remote access error.
  Harness::SendOpts w;
  w.raddr = reinterpret_cast<uint64_t>(win.va), w.rkey = rkey;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 8, a.key}}, w);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::REMOTE_ACCESS_ERR);
}

TEST_F(EmuDataPath, AtomicsReturnTheOriginalValue) {
  uint64_t v = 1000;
  memcpy(b.bytes() + 64, &v, 8);
  Harness::SendOpts o;
  o.raddr = b.va() + 64, o.rkey = b.key, o.swap_add = 5;
  a.h.post_send(a.qp, wo::ATOMIC_FA, {{a.va() + 8, 8, a.key}}, o);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::sop_drop), wo::ATOMIC_FA);
  EXPECT_EQ(prm::get(e, prm::cqe64::byte_cnt), 8u);
  uint64_t got, now;
  memcpy(&got, a.bytes() + 8, 8);
  memcpy(&now, b.bytes() + 64, 8);
  EXPECT_EQ(got, 1000u);
  EXPECT_EQ(now, 1005u);
  Harness::SendOpts cs;
  cs.raddr = b.va() + 64, cs.rkey = b.key, cs.compare = 1005, cs.swap_add = 77;
  a.h.post_send(a.qp, wo::ATOMIC_CS, {{a.va() + 16, 8, a.key}}, cs);
  e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::sop_drop), wo::ATOMIC_CS);
  memcpy(&got, a.bytes() + 16, 8);
  memcpy(&now, b.bytes() + 64, 8);
  EXPECT_EQ(got, 1005u);
  EXPECT_EQ(now, 77u);
}

// An atomic target registered with local write and remote atomic only (as perftest's ib_atomic_bw
// registers it): IBA o10-39 asks for Remote Atomic access, not Remote Write.
TEST_F(EmuDataPath, AtomicNeedsRemoteAtomicNotRemoteWrite) {
  TestHost::Buffer target = b.h.host.alloc(4096);
  uint32_t key = b.h.create_mkey(target, 4096, /*lw + a*/ 1 | 8);
  uint64_t v = 10;
  memcpy(target.va, &v, 8);
  Harness::SendOpts o;
  o.raddr = reinterpret_cast<uint64_t>(target.va), o.rkey = key, o.swap_add = 3;
  a.h.post_send(a.qp, wo::ATOMIC_FA, {{a.va(), 8, a.key}}, o);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ) << "syndrome " << prm::get(e, prm::err_cqe::syndrome);
  memcpy(&v, target.va, 8);
  EXPECT_EQ(v, 13u);
  // Without the atomic right the same key is refused: remote access error.
  uint32_t no_atomic = b.h.create_mkey(target, 4096, /*lw + rw*/ 1 | 2);
  o.rkey = no_atomic;
  a.h.post_send(a.qp, wo::ATOMIC_FA, {{a.va(), 8, a.key}}, o);
  e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::opcode), co::REQ_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::REMOTE_ACCESS_ERR);
}

TEST_F(EmuDataPath, UnsignaledWqesReportThroughTheNextSignaledOne) {
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key, o.signaled = false;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key}}, o);
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key}}, o);
  o.signaled = true, o.fence = true;
  uint16_t last = a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key}}, o);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::wqe_counter), last);
  EXPECT_EQ(a.h.poll_cq(a.cq), nullptr);
}

TEST_F(EmuDataPath, BadRkeyIsARemoteAccessErrorAndFlushesTheRest) {
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key ^ 0xff00;
  uint16_t bad = a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key}}, o);
  o.rkey = b.key;
  uint16_t next = a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key}}, o);
  pump();
  const uint8_t* e = a.h.poll_cq(a.cq);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::opcode), co::REQ_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::REMOTE_ACCESS_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::wqe_counter), bad);
  EXPECT_EQ(prm::get(e, prm::err_cqe::s_wqe_opcode), wo::RDMA_WRITE);
  e = a.h.poll_cq(a.cq);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::WR_FLUSH_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::wqe_counter), next);
  auto q = cmd_in(op::QUERY_QP, 16);
  prm::set(q.data(), prm::query_qp_in::qpn, a.qp.qpn);
  Result r = a.h.exec(q, Harness::out_size(op::QUERY_QP));
  EXPECT_EQ(prm::query_qp_out::cview(r.out.data()).at(prm::query_qp_out::qpc).get(prm::qpc::state),
            prm::qpc_state::ERR);
}

TEST_F(EmuDataPath, BadLkeyIsALocalProtectionError) {
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key + 0x100}}, o);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::opcode), co::REQ_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::LOCAL_PROT_ERR);
}

// A WQE whose ds claims more blocks than the doorbell record posted (found by fuzz_mlx5_wqe): one
// LOCAL_QP_OP_ERR CQE at that WQE, the device stops at the record and goes idle (it used to step
// past the record and go round the 16-bit counter).
TEST_F(EmuDataPath, WqeLongerThanThePostedBlocksIsALocalQpOpError) {
  uint8_t w[64] = {};
  prm::wqe_ctrl_seg::view(w)
      .set(prm::wqe_ctrl_seg::opcode, wo::SEND)
      .set(prm::wqe_ctrl_seg::qpn, a.qp.qpn)
      .set(prm::wqe_ctrl_seg::ds, 13)  // four blocks
      .set(prm::wqe_ctrl_seg::ce, 2);
  memcpy(a.qp.sq(0), w, 64);
  a.qp.sq_pi = 1;  // one block posted
  prm::set(a.qp.dbr.va, prm::qp_dbrec::snd_counter, 1);
  a.h.uar_write64(a.h.uar, prm::kUarBlueFlame, w);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::opcode), co::REQ_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::LOCAL_QP_OP_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::wqe_counter), 0u);
  EXPECT_EQ(a.h.poll_cq(a.cq), nullptr);  // one CQE, not a counter's worth
}

// A SEND whose inline segment holds 0 bytes (found by fuzz_mlx5_wqe): a 0-byte message.
TEST_F(EmuDataPath, EmptyInlineSendIsAZeroByteMessage) {
  b.h.post_recv(b.qp, {{b.va(), 64, b.key}});
  Harness::SendOpts o;
  o.has_inline = true;
  a.h.post_send(a.qp, wo::SEND, {}, o);
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ);
  e = cqe(b);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::RESP_SEND);
  EXPECT_EQ(prm::get(e, prm::cqe64::byte_cnt), 0u);
}

TEST_F(EmuDataPath, QueryQpReportsLivePsns) {
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 4096, a.key}}, o);  // 4 packets at MTU 1024
  ASSERT_NE(cqe(a), nullptr);
  auto psn = [&](Side& s, const prm::Field& f) {
    auto q = cmd_in(op::QUERY_QP, 16);
    prm::set(q.data(), prm::query_qp_in::qpn, s.qp.qpn);
    Result r = s.h.exec(q, Harness::out_size(op::QUERY_QP));
    return prm::get(prm::query_qp_out::cview(r.out.data()).at(prm::query_qp_out::qpc).data(), f);
  };
  EXPECT_EQ(psn(a, prm::qpc::next_send_psn), 104u);
  EXPECT_EQ(psn(b, prm::qpc::next_rcv_psn), 104u);
}

TEST_F(EmuDataPath, ArmedCqRaisesACompletionEvent) {
  // Consume what the harness EQ holds, arm it, then arm the CQ.
  while (a.h.next_eqe()) {}
  a.h.uar_write32(a.h.uar, prm::kUarEqArm, a.h.eqn << 24 | a.h.eq_ci);
  a.h.arm_cq(a.cq, false);
  uint64_t irqs = a.h.host.irq_count(0);
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 8, a.key}}, o);
  pump();
  const uint8_t* e = a.h.next_eqe();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::eqe::event_type), prm::event_type::COMP);
  EXPECT_EQ(prm::get(e + 32, prm::comp_event::cq_number), a.cq.cqn);
  EXPECT_EQ(a.h.host.irq_count(0), irqs + 1);
}

TEST_F(EmuDataPath, RingWrapsAroundManyTimes) {
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key;
  for (int round = 0; round < 300; ++round) {
    a.bytes()[0] = uint8_t(round);
    a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 1, a.key}}, o);
    const uint8_t* e = cqe(a);
    ASSERT_NE(e, nullptr) << round;
    ASSERT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ) << round;
    ASSERT_EQ(b.bytes()[0], uint8_t(round));
  }
}

// Binds `s`'s QP to a new Q counter set and returns its id.
uint32_t bind_counter(Side& s) {
  uint32_t id = s.h.alloc(op::ALLOC_Q_COUNTER, prm::alloc_q_counter_out::counter_set_id);
  Result r = s.h.transition(
      op::RTS2RTS_QP, s.qp.qpn, [&](prm::qpc::view q) { q.set(prm::qpc::counter_set_id, id); },
      1u << 25 /* MLX5_QP_OPTPAR_COUNTER_SET_ID */);
  EXPECT_TRUE(r.ok()) << std::hex << r.syndrome;
  return id;
}
uint32_t counter(Side& s, uint32_t id, const prm::Field& f) {
  auto q = cmd_in(op::QUERY_Q_COUNTER, Harness::in_size(op::QUERY_Q_COUNTER));
  prm::set(q.data(), prm::query_q_counter_in::counter_set_id, id);
  Result r = s.h.exec(q, Harness::out_size(op::QUERY_Q_COUNTER));
  return uint32_t(prm::get(r.out.data(), f));
}

TEST_F(EmuDataPath, ALostPacketIsRecoveredAndCounted) {
  uint32_t ca = bind_counter(a), cb = bind_counter(b);
  struct Drop {
    int seen = 0;
  } d;
  link.drop_arg = &d;
  link.drop = [](void* arg, const uint8_t*, size_t) { return ++static_cast<Drop*>(arg)->seen == 2; };
  for (int i = 0; i < 8192; ++i) a.bytes()[i] = uint8_t(i * 5);
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 8192, a.key}}, o);  // 8 packets; the second is lost
  const uint8_t* e = cqe(a);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ);
  EXPECT_EQ(memcmp(a.bytes(), b.bytes(), 8192), 0);
  EXPECT_EQ(link.dropped(), 1u);
  EXPECT_EQ(counter(b, cb, prm::query_q_counter_out::out_of_sequence), 1u);  // one NAK for the gap
  EXPECT_EQ(counter(a, ca, prm::query_q_counter_out::packet_seq_err), 1u);
}

class EmuRetry : public EmuDataPath {
 protected:
  EmuRetry() { retry_count_ = 2; }
};

TEST_F(EmuRetry, RetryCountAndAckTimeoutAreHonoured) {
  uint32_t ca = bind_counter(a);
  link.drop = [](void*, const uint8_t*, size_t) { return true; };
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key;
  a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key}}, o);
  pump();
  EXPECT_EQ(link.frames(), 1u);
  // ack_timeout 14: 4.096 us * 2^14 = 67 ms per try. Nothing happens before it expires.
  a.h.clock.advance(60'000'000), b.h.clock.advance(60'000'000);
  pump();
  EXPECT_EQ(link.frames(), 1u);
  const uint8_t* e = nullptr;
  for (int i = 0; i < 10 && !(e = a.h.poll_cq(a.cq)); ++i) {
    a.h.clock.advance(70'000'000), b.h.clock.advance(70'000'000);
    pump();
  }
  // The first try and retry_count = 2 retries, then the error.
  EXPECT_EQ(link.frames(), 3u);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::opcode), co::REQ_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::TRANSPORT_RETRY_EXC_ERR);
  EXPECT_EQ(counter(a, ca, prm::query_q_counter_out::local_ack_timeout_err), 3u);
}

class EmuScatterToCqe : public EmuDataPath {
 protected:
  EmuScatterToCqe() { cs_res_ = prm::qpc_cs_res::SCAT_DATA32_CQE; }
};

// qpc.cs_res = 1: a SEND of up to 32 bytes comes in the CQE's first 32 bytes with format 1 (mlx5dv.h
// MLX5_INLINE_SCATTER_32) and the receive's buffer is not written (no DMA write at all); a longer
// one, or a WRITE with immediate, is placed as always. The receive's length is still checked.
TEST_F(EmuScatterToCqe, SmallSendsComeInTheCqeAndLargerOnesInTheBuffer) {
  size_t writes = 0;
  b.h.host.on_write = [&](uint64_t iova, size_t len) {
    if (iova < b.mem.iova + 256 * 1024 && iova + len > b.mem.iova) writes++;
  };
  memset(b.bytes(), 0xee, 4096);
  for (int i = 0; i < 100; ++i) a.bytes()[i] = uint8_t(0x40 + i);
  for (uint32_t len : {32u, 1u, 0u, 33u}) {
    writes = 0;
    b.h.post_recv(b.qp, {{b.va() + 8, 20, b.key}, {b.va() + 1000, 100, b.key}});
    Harness::SendOpts o;
    o.imm = 0x1234;
    a.h.post_send(a.qp, len == 1 ? wo::SEND_IMM : wo::SEND, {{a.va(), len, a.key}}, o);
    const uint8_t* e = cqe(b);
    ASSERT_NE(e, nullptr) << len;
    EXPECT_EQ(prm::get(e, prm::cqe64::opcode), len == 1 ? co::RESP_SEND_IMM : co::RESP_SEND) << len;
    EXPECT_EQ(prm::get(e, prm::cqe64::byte_cnt), len);
    if (len <= 32) {
      EXPECT_EQ(prm::get(e, prm::cqe64::format), prm::cqe_format::INLINE_SCATTER_32) << len;
      EXPECT_EQ(memcmp(e, a.bytes(), len), 0) << len;
      EXPECT_EQ(writes, 0u) << len << " bytes: the buffer was written";
      if (len == 1) EXPECT_EQ(prm::get(e, prm::cqe64::imm_inval_pkey), 0x1234u);
    } else {
      EXPECT_EQ(prm::get(e, prm::cqe64::format), prm::cqe_format::PLAIN);
      EXPECT_EQ(memcmp(b.bytes() + 8, a.bytes(), 20), 0);
      EXPECT_EQ(memcmp(b.bytes() + 1000, a.bytes() + 20, 13), 0);
    }
    while (a.h.poll_cq(a.cq)) {}
  }
  EXPECT_EQ(b.bytes()[8 + 19], 0x40 + 19) << "only the 33-byte SEND placed bytes";
  EXPECT_EQ(b.bytes()[1000 + 13], 0xee);

  // Too long for the receive: a length error, as without scatter to CQE.
  b.h.post_recv(b.qp, {{b.va(), 4, b.key}});
  a.h.post_send(a.qp, wo::SEND, {{a.va(), 8, a.key}});
  const uint8_t* e = cqe(b);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::err_cqe::opcode), co::RESP_ERR);
  EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::LOCAL_LENGTH_ERR);
  b.h.host.on_write = nullptr;
}

class EmuCqOverrun : public EmuDataPath {
 protected:
  EmuCqOverrun() { log_cq_ = 1; }  // 2 CQEs
};

// Hardware (PRM "CQ Error"): a completion with no room is an overrun. The CQ goes to error with a
// CQ_ERROR event (syndrome CQ_OVERRUN); the QP whose completion was lost goes to ERR with a local
// work queue catastrophic error (IBA 11.6.3.1). The completions written before it stay.
TEST_F(EmuCqOverrun, EngineCompletionsThatOverrunTheCqRaiseCqErrorAndFailTheQp) {
  while (a.h.next_eqe()) {}
  Harness::SendOpts o;
  o.raddr = b.va(), o.rkey = b.key;
  for (int i = 0; i < 3; ++i) {
    a.h.post_send(a.qp, wo::RDMA_WRITE, {{a.va(), 64, a.key}}, o);
    pump();
  }
  std::vector<std::pair<uint8_t, uint32_t>> events;  // (type, cqn or qpn)
  while (const uint8_t* e = a.h.next_eqe()) {
    uint8_t type = uint8_t(prm::get(e, prm::eqe::event_type));
    if (type == prm::event_type::CQ_ERROR) {
      EXPECT_EQ(prm::get(e + 32, prm::cq_error::syndrome), prm::cq_error_syndrome::CQ_OVERRUN);
      events.push_back({type, uint32_t(prm::get(e + 32, prm::cq_error::cqn))});
    } else if (type != prm::event_type::COMP) {
      EXPECT_EQ(prm::get(e + 32, prm::qp_events::type), prm::kEventObjQp);
      events.push_back({type, uint32_t(prm::get(e + 32, prm::qp_events::qpn_rqn_sqn))});
    }
  }
  std::vector<std::pair<uint8_t, uint32_t>> want = {{prm::event_type::CQ_ERROR, a.cq.cqn},
                                                    {prm::event_type::WQ_CATAS_ERROR, a.qp.qpn}};
  EXPECT_EQ(events, want);
  for (int i = 0; i < 2; ++i) {
    const uint8_t* e = a.h.poll_cq(a.cq);
    ASSERT_NE(e, nullptr) << "the completions that fitted were written";
    EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ);
  }
  EXPECT_EQ(a.h.poll_cq(a.cq), nullptr);
  auto qc = cmd_in(op::QUERY_CQ, 16);
  prm::set(qc.data(), prm::query_cq_in::cqn, a.cq.cqn);
  Result r = a.h.exec(qc, Harness::out_size(op::QUERY_CQ));
  EXPECT_EQ(prm::query_cq_out::cview(r.out.data()).at(prm::query_cq_out::cq_context).get(prm::cqc::status),
            prm::cqc_status::CQ_OVERFLOW);
  auto qq = cmd_in(op::QUERY_QP, 16);
  prm::set(qq.data(), prm::query_qp_in::qpn, a.qp.qpn);
  r = a.h.exec(qq, Harness::out_size(op::QUERY_QP));
  EXPECT_EQ(prm::query_qp_out::cview(r.out.data()).at(prm::query_qp_out::qpc).get(prm::qpc::state),
            prm::qpc_state::ERR);
}

TEST(EmuCqOverflow, OverrunRaisesACqErrorEvent) {
  Harness h;
  h.bring_up();
  Harness::CqRing cq = h.create_cq(1);  // 2 entries
  Harness::QpRing q;
  ASSERT_TRUE(h.create_qp_raw(q, prm::qpc_st::RC, cq, cq).ok());
  uint8_t ip[4] = {10, 0, 0, 9};
  ASSERT_TRUE(h.set_gid(0, ip).ok());
  // NOPs complete without a peer; the third signalled one does not fit.
  ASSERT_TRUE(h.transition(op::QP_2ERR, q.qpn).ok());
  while (h.next_eqe()) {}
  for (int i = 0; i < 3; ++i) h.post_send(q, wo::NOP, {});
  h.dev.service();
  const uint8_t* e = h.next_eqe();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::eqe::event_type), prm::event_type::CQ_ERROR);
  EXPECT_EQ(prm::get(e + 32, prm::cq_error::cqn), cq.cqn);
  EXPECT_EQ(prm::get(e + 32, prm::cq_error::syndrome), 1u);  // overrun
  auto qc = cmd_in(op::QUERY_CQ, 16);
  prm::set(qc.data(), prm::query_cq_in::cqn, cq.cqn);
  Result r = h.exec(qc, Harness::out_size(op::QUERY_CQ));
  EXPECT_EQ(prm::query_cq_out::cview(r.out.data()).at(prm::query_cq_out::cq_context).get(prm::cqc::status),
            prm::cqc_status::CQ_OVERFLOW);
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
