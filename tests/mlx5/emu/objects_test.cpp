// Objects: UAR/PD/TD, EQ and CQ (arm, owner bit), mkeys, QPs and their state machine, SRQ/RMP,
// the GID table, the vport and the port registers, Q counters.
#include "harness.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace cs = prm::cmd_status;
namespace qs = prm::qpc_state;

const uint8_t kIp[4] = {10, 0, 0, 1};

TEST(EmuObjects, UarPdTransportDomainAllocateAndFree) {
  Harness h;
  h.bring_up();
  EXPECT_GE(h.uar, kFirstUarIndex);
  uint32_t td = h.alloc(op::ALLOC_TRANSPORT_DOMAIN, prm::alloc_transport_domain_out::transport_domain);
  auto in = cmd_in(op::DEALLOC_TRANSPORT_DOMAIN, 16);
  prm::set(in.data(), prm::dealloc_transport_domain_in::transport_domain, td);
  EXPECT_TRUE(h.exec(in, 16).ok());
  Result r = h.exec(in, 16);
  EXPECT_EQ(r.status, cs::BAD_RES_ERR);
  EXPECT_EQ(r.syndrome, synd::UNKNOWN_TD);
  // A UAR with an EQ on it cannot go.
  in = cmd_in(op::DEALLOC_UAR, 16);
  prm::set(in.data(), prm::dealloc_uar_in::uar, h.uar);
  r = h.exec(in, 16);
  EXPECT_EQ(r.status, cs::BAD_RES_STATE_ERR);
  EXPECT_EQ(r.syndrome, synd::RESOURCE_IN_USE);
}

TEST(EmuObjects, EqArmRaisesOneInterruptPerArm) {
  Harness h;
  h.bring_up();  // its EQ (vector 0) takes every async event; a PAGE_REQUEST EQE is waiting
  uint32_t eqn = h.eqn;
  while (h.next_eqe()) {}
  h.uar_write32(h.uar, prm::kUarEqArm, eqn << 24 | h.eq_ci);
  h.dev.service();
  EXPECT_EQ(h.host.irq_count(0), 0u);
  auto toggle_port = [&](uint8_t admin) {
    auto in = cmd_in(op::ACCESS_REG, prm::access_register_in::size_bytes + prm::paos_reg::size_bytes, 0);
    prm::set(in.data(), prm::access_register_in::register_id, prm::reg_id::PAOS);
    prm::paos_reg::view(in.data() + 16)
        .set(prm::paos_reg::local_port, 1)
        .set(prm::paos_reg::admin_status, admin)
        .set(prm::paos_reg::ase, 1);
    ASSERT_TRUE(h.exec(in, 16 + prm::paos_reg::size_bytes).ok());
  };
  toggle_port(prm::kPortDown);
  EXPECT_EQ(h.host.irq_count(0), 1u);
  const uint8_t* e = h.next_eqe();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::eqe::event_type), prm::event_type::PORT_CHANGE);
  EXPECT_EQ(prm::get(e, prm::eqe::event_sub_type), prm::port_change_subtype::DOWN);
  toggle_port(prm::kPortUp);
  EXPECT_EQ(h.host.irq_count(0), 1u);  // not re-armed
  // Update CI without arming (one EQE consumed, the PORT_CHANGE UP one left), then arm with that
  // EQE unconsumed: it fires at once.
  h.uar_write32(h.uar, prm::kUarEqUpdate, eqn << 24 | h.eq_ci);
  h.dev.service();
  EXPECT_EQ(h.host.irq_count(0), 1u);
  h.uar_write32(h.uar, prm::kUarEqArm, eqn << 24 | h.eq_ci);
  h.dev.service();
  EXPECT_EQ(h.host.irq_count(0), 2u);
  // The same doorbell through another UAR page is ignored (UAR geometry bugs show).
  uint64_t ignored = h.dev.stats().doorbells_ignored;
  h.uar_write32(h.uar + 1, prm::kUarEqArm, eqn << 24 | h.eq_ci);
  h.dev.service();
  EXPECT_EQ(h.dev.stats().doorbells_ignored, ignored + 1);
  auto q = cmd_in(op::QUERY_EQ, 16);
  prm::set(q.data(), prm::query_eq_in::eq_number, eqn);
  Result r = h.exec(q, Harness::out_size(op::QUERY_EQ));
  ASSERT_TRUE(r.ok());
  auto ctx = prm::query_eq_out::cview(r.out.data()).at(prm::query_eq_out::eq_context_entry);
  EXPECT_EQ(ctx.get(prm::eqc::producer_counter), h.eq_ci + 1);
  EXPECT_EQ(ctx.get(prm::eqc::consumer_counter), h.eq_ci);
  EXPECT_EQ(ctx.get(prm::eqc::intr), 0u);
}

TEST(EmuObjects, CreateCqValidation) {
  Harness h;
  h.bring_up();
  Harness::CqRing cq;
  Result r = h.create_cq_raw(cq, 6, 999);
  EXPECT_EQ(r.status, cs::BAD_RES_ERR);
  EXPECT_EQ(r.syndrome, synd::UNKNOWN_EQ);
  r = h.create_cq_raw(cq, 6, h.eqn, [](uint8_t* in) { prm::set(in, prm::create_cq_in::cq_umem_valid, 1); });
  EXPECT_EQ(r.status, cs::BAD_PARAM_ERR);
  r = h.create_cq_raw(cq, 6, h.eqn, [](uint8_t* in) {
    prm::create_cq_in::view(in).at(prm::create_cq_in::cq_context).set(prm::cqc::log_cq_size, 23);
  });
  EXPECT_EQ(r.status, cs::BAD_PARAM_ERR);
  EXPECT_EQ(r.syndrome, synd::BAD_QUEUE_SIZE);
  r = h.create_cq_raw(cq, 6, h.eqn, [](uint8_t* in) {
    prm::create_cq_in::view(in).at(prm::create_cq_in::cq_context).set(prm::cqc::log_cq_size, 12);  // needs 64 pages
  });
  EXPECT_EQ(r.syndrome, synd::PAS_TOO_SHORT);
  r = h.create_cq_raw(cq, 6, h.eqn, [](uint8_t* in) {
    prm::create_cq_in::view(in).at(prm::create_cq_in::cq_context).set(prm::cqc::dbr_addr, 0x1004);
  });
  EXPECT_EQ(r.syndrome, synd::BAD_DBR_ADDR);
  Harness::CqRing ok = h.create_cq(6);
  auto q = cmd_in(op::QUERY_CQ, 16);
  prm::set(q.data(), prm::query_cq_in::cqn, ok.cqn);
  r = h.exec(q, Harness::out_size(op::QUERY_CQ));
  ASSERT_TRUE(r.ok());
  auto ctx = prm::query_cq_out::cview(r.out.data()).at(prm::query_cq_out::cq_context);
  EXPECT_EQ(ctx.get(prm::cqc::log_cq_size), 6u);
  EXPECT_EQ(ctx.get(prm::cqc::c_eqn), h.eqn);
  EXPECT_EQ(ctx.get(prm::cqc::dbr_addr), ok.dbr.iova);
}

TEST(EmuObjects, MkeyValidationAndQuery) {
  Harness h;
  h.bring_up();
  TestHost::Buffer b = h.host.alloc(3 * 4096);
  uint32_t key = 0;
  Result r = h.create_mkey_raw(b, 3 * 4096, 0xf, &key, [](uint8_t* in) {
    prm::set(in, prm::create_mkey_in::translations_octword_actual_size, 1);  // 2 MTTs for 3 pages
  });
  EXPECT_EQ(r.syndrome, synd::MTT_TOO_SHORT);
  r = h.create_mkey_raw(b, 4096, 0xf, &key, [](uint8_t* in) {
    prm::create_mkey_in::view(in).at(prm::create_mkey_in::memory_key_mkey_entry).set(prm::mkc::pd, 777);
  });
  EXPECT_EQ(r.status, cs::BAD_RES_ERR);
  EXPECT_EQ(r.syndrome, synd::UNKNOWN_PD);
  r = h.create_mkey_raw(b, 4096, 0xf, &key, [](uint8_t* in) {
    prm::mkc_set_access_mode(prm::create_mkey_in::view(in).at(prm::create_mkey_in::memory_key_mkey_entry),
                             prm::mkc_access_mode::KLMS);
  });
  EXPECT_EQ(r.syndrome, synd::BAD_ACCESS_MODE);
  r = h.create_mkey_raw(b, 4096, 0xf, &key, [&](uint8_t* in) {
    prm::mtt_set(prm::create_mkey_in::view(in).elem(prm::create_mkey_in::klm_pas_mtt, 0), b.iova + 0x100, 1, 1);
  });
  EXPECT_EQ(r.syndrome, synd::PAGE_NOT_ALIGNED);
  key = h.create_mkey(b, 3 * 4096, 1 | 2);
  auto q = cmd_in(op::QUERY_MKEY, 16);
  prm::set(q.data(), prm::query_mkey_in::mkey_index, key >> 8);
  r = h.exec(q, Harness::out_size(op::QUERY_MKEY));
  ASSERT_TRUE(r.ok());
  auto m = prm::query_mkey_out::cview(r.out.data()).at(prm::query_mkey_out::memory_key_mkey_entry);
  EXPECT_EQ(m.get(prm::mkc::len), 3u * 4096);
  EXPECT_EQ(m.get(prm::mkc::rw), 1u);
  EXPECT_EQ(m.get(prm::mkc::rr), 0u);
  EXPECT_EQ(m.get(prm::mkc::mkey_7_0), 0x42u);
  // The model translates through the MTT, and checks PD, rights and bounds.
  Hca& hca = h.dev.hca();
  std::vector<Hca::IovaSeg> segs;
  uint64_t va = reinterpret_cast<uint64_t>(b.va);
  EXPECT_EQ(hca.mkey_resolve(key, h.pd, va + 4000, 200, Hca::kAccWrite | Hca::kAccRemote, &segs), 0);
  ASSERT_EQ(segs.size(), 1u);  // consecutive IOVAs merge
  EXPECT_EQ(segs[0].iova, b.iova + 4000);
  EXPECT_NE(hca.mkey_resolve(key, h.pd, va, 16, Hca::kAccRead | Hca::kAccRemote, &segs), 0);  // no remote read
  EXPECT_NE(hca.mkey_resolve(key, h.pd + 1, va, 16, Hca::kAccRead, &segs), 0);  // other PD
  EXPECT_NE(hca.mkey_resolve(key, h.pd, va + 3 * 4096 - 8, 16, Hca::kAccRead, &segs), 0);  // past the end
  EXPECT_NE(hca.mkey_resolve(key ^ 1, h.pd, va, 16, Hca::kAccRead, &segs), 0);  // wrong key byte
  auto d = cmd_in(op::DESTROY_MKEY, 16);
  prm::set(d.data(), prm::destroy_mkey_in::mkey_index, key >> 8);
  EXPECT_TRUE(h.exec(d, 16).ok());
  EXPECT_EQ(h.exec(d, 16).syndrome, synd::UNKNOWN_MKEY);
}

// Drives `qp` from RST to `target` with valid commands.
void drive(Harness& h, uint32_t qpn, uint8_t target) {
  if (target == qs::RST) return;
  if (target == qs::ERR) {
    ASSERT_TRUE(h.transition(op::QP_2ERR, qpn).ok());
    return;
  }
  ASSERT_TRUE(h.transition(op::RST2INIT_QP, qpn, [](prm::qpc::view q) {
                 q.at(prm::qpc::primary_address_path).set(prm::ads::vhca_port_num, 1);
                 q.set(prm::qpc::rwe, 1).set(prm::qpc::rre, 1).set(prm::qpc::rae, 1);
               }).ok());
  if (target == qs::INIT) return;
  Result r = h.transition(op::INIT2RTR_QP, qpn, [](prm::qpc::view q) {
    q.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES)
        .set(prm::qpc::remote_qpn, 0x99)
        .set(prm::qpc::next_rcv_psn, 0x1234);
    q.set(prm::qpc::log_rra_max, 2).set(prm::qpc::min_rnr_nak, 12);
    q.at(prm::qpc::primary_address_path).set(prm::ads::src_addr_index, 0).set(prm::ads::hop_limit, 64);
  });
  ASSERT_TRUE(r.ok()) << int(r.status) << " " << std::hex << r.syndrome;
  if (target == qs::RTR) return;
  ASSERT_TRUE(h.transition(op::RTR2RTS_QP, qpn, [](prm::qpc::view q) {
                 q.set(prm::qpc::next_send_psn, 0x777).set(prm::qpc::retry_count, 7).set(prm::qpc::rnr_retry, 7);
                 q.set(prm::qpc::log_sra_max, 2).at(prm::qpc::primary_address_path).set(prm::ads::ack_timeout, 14);
               }).ok());
}

TEST(EmuObjects, EveryQpTransitionFromEveryReachableState) {
  Harness h;
  h.bring_up();
  ASSERT_TRUE(h.set_gid(0, kIp).ok());
  Harness::CqRing cq = h.create_cq();
  struct Cmd {
    uint16_t opcode;
    uint8_t from;  // 0xff: any
    uint8_t to;
  };
  const Cmd cmds[] = {{op::RST2INIT_QP, qs::RST, qs::INIT},
                      {op::INIT2INIT_QP, qs::INIT, qs::INIT},
                      {op::INIT2RTR_QP, qs::INIT, qs::RTR},
                      {op::RTR2RTS_QP, qs::RTR, qs::RTS},
                      {op::RTS2RTS_QP, qs::RTS, qs::RTS},
                      {op::SQERR2RTS_QP, qs::SQER, qs::RTS},
                      {op::QP_2ERR, 0xff, qs::ERR},
                      {op::QP_2RST, 0xff, qs::RST},
                      // No command enters SQD on this device (prm/qp_modify.h): SQD_RTS_QP always
                      // finds the QP in the wrong state.
                      {op::SQD_RTS_QP, qs::SQD, qs::RTS}};
  const uint8_t states[] = {qs::RST, qs::INIT, qs::RTR, qs::RTS, qs::ERR};
  for (uint8_t from : states) {
    for (const Cmd& c : cmds) {
      Harness::QpRing q;
      ASSERT_TRUE(h.create_qp_raw(q, prm::qpc_st::RC, cq, cq).ok());
      drive(h, q.qpn, from);
      Result r = h.transition(c.opcode, q.qpn, [](prm::qpc::view v) {
        v.at(prm::qpc::primary_address_path).set(prm::ads::vhca_port_num, 1);
        v.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES);
      });
      bool valid = c.from == 0xff || c.from == from;
      if (valid) {
        EXPECT_TRUE(r.ok()) << prm::opcode_name(c.opcode) << " from " << prm::qpc_state::name_of(from) << ": "
                            << int(r.status) << " " << std::hex << r.syndrome;
      } else {
        EXPECT_EQ(r.status, cs::BAD_QP_STATE_ERR)
            << prm::opcode_name(c.opcode) << " from " << prm::qpc_state::name_of(from);
        EXPECT_EQ(r.syndrome, synd::BAD_QP_STATE);
      }
      auto qq = cmd_in(op::QUERY_QP, 16);
      prm::set(qq.data(), prm::query_qp_in::qpn, q.qpn);
      Result s = h.exec(qq, Harness::out_size(op::QUERY_QP));
      ASSERT_TRUE(s.ok());
      uint32_t now = uint32_t(prm::query_qp_out::cview(s.out.data()).at(prm::query_qp_out::qpc).get(prm::qpc::state));
      EXPECT_EQ(now, valid ? c.to : from) << prm::opcode_name(c.opcode) << " from " << prm::qpc_state::name_of(from);
      auto d = cmd_in(op::DESTROY_QP, 16);
      prm::set(d.data(), prm::destroy_qp_in::qpn, q.qpn);
      ASSERT_TRUE(h.exec(d, 16).ok());
    }
  }
}

TEST(EmuObjects, QpTransitionsCheckTheirAttributes) {
  Harness h;
  h.bring_up();
  Harness::CqRing cq = h.create_cq();
  Harness::QpRing q;
  ASSERT_TRUE(h.create_qp_raw(q, prm::qpc_st::RC, cq, cq).ok());
  Result r = h.transition(op::RST2INIT_QP, q.qpn, [](prm::qpc::view v) {
    v.at(prm::qpc::primary_address_path).set(prm::ads::vhca_port_num, 2);
  });
  EXPECT_EQ(r.syndrome, synd::BAD_PORT);
  drive(h, q.qpn, qs::INIT);
  // No GID at index 0 yet.
  r = h.transition(op::INIT2RTR_QP, q.qpn, [](prm::qpc::view v) { v.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES); });
  EXPECT_EQ(r.syndrome, synd::BAD_GID_INDEX);
  ASSERT_TRUE(h.set_gid(0, kIp).ok());
  r = h.transition(op::INIT2RTR_QP, q.qpn, [](prm::qpc::view v) { v.set(prm::qpc::mtu, 6); });
  EXPECT_EQ(r.syndrome, synd::BAD_MTU);
  r = h.transition(op::INIT2RTR_QP, q.qpn, [](prm::qpc::view v) {
    v.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES).set(prm::qpc::log_rra_max, 7);
  });
  EXPECT_EQ(r.syndrome, synd::BAD_RD_ATOMIC);
  r = h.transition(
      op::INIT2RTR_QP, q.qpn, [](prm::qpc::view v) { v.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES); },
      1 << 0 /* alternate path: no APM on this device */);
  EXPECT_EQ(r.syndrome, synd::BAD_FIELD_SELECT);
  // Refused transitions changed nothing: still INIT, and a good INIT2RTR works.
  drive(h, 0, qs::RST);
  r = h.transition(op::INIT2RTR_QP, q.qpn, [](prm::qpc::view v) {
    v.set(prm::qpc::mtu, prm::qpc_mtu::MTU_4K_BYTES)
        .set(prm::qpc::next_rcv_psn, 0xabcde)
        .set(prm::qpc::remote_qpn, 0x51);
  });
  ASSERT_TRUE(r.ok());
  auto qq = cmd_in(op::QUERY_QP, 16);
  prm::set(qq.data(), prm::query_qp_in::qpn, q.qpn);
  Result s = h.exec(qq, Harness::out_size(op::QUERY_QP));
  auto ctx = prm::query_qp_out::cview(s.out.data()).at(prm::query_qp_out::qpc);
  EXPECT_EQ(ctx.get(prm::qpc::state), qs::RTR);
  EXPECT_EQ(ctx.get(prm::qpc::mtu), prm::qpc_mtu::MTU_4K_BYTES);
  EXPECT_EQ(ctx.get(prm::qpc::next_rcv_psn), 0xabcdeu);
  EXPECT_EQ(ctx.get(prm::qpc::remote_qpn), 0x51u);
  EXPECT_EQ(ctx.get(prm::qpc::rwe), 1u);
}

TEST(EmuObjects, CreateQpValidationAndReferences) {
  Harness h;
  h.bring_up();
  Harness::CqRing cq = h.create_cq();
  Harness::QpRing q;
  Result r = h.create_qp_raw(q, prm::qpc_st::XRC, cq, cq);
  EXPECT_EQ(r.syndrome, synd::BAD_QP_TYPE);
  r = h.create_qp_raw(q, prm::qpc_st::RC, cq, cq, [](uint8_t* in) {
    prm::create_qp_in::view(in).at(prm::create_qp_in::qpc).set(prm::qpc::cqn_rcv, 0x5555);
  });
  EXPECT_EQ(r.syndrome, synd::UNKNOWN_CQ);
  r = h.create_qp_raw(q, prm::qpc_st::RC, cq, cq, [](uint8_t* in) {
    prm::create_qp_in::view(in).at(prm::create_qp_in::qpc).set(prm::qpc::log_sq_size, 12);
  });
  EXPECT_EQ(r.syndrome, synd::PAS_TOO_SHORT);
  r = h.create_qp_raw(q, prm::qpc_st::RC, cq, cq, [](uint8_t* in) {
    prm::create_qp_in::view(in).at(prm::create_qp_in::qpc).set(prm::qpc::log_rq_stride, 6);  // 1 KiB receive WQEs
  });
  EXPECT_EQ(r.syndrome, synd::BAD_STRIDE);
  ASSERT_TRUE(h.create_qp_raw(q, prm::qpc_st::RC, cq, cq).ok());
  auto d = cmd_in(op::DESTROY_CQ, 16);
  prm::set(d.data(), prm::destroy_cq_in::cqn, cq.cqn);
  r = h.exec(d, 16);
  EXPECT_EQ(r.status, cs::BAD_RES_STATE_ERR);  // the QP still uses it
  auto dq = cmd_in(op::DESTROY_QP, 16);
  prm::set(dq.data(), prm::destroy_qp_in::qpn, q.qpn);
  ASSERT_TRUE(h.exec(dq, 16).ok());
  EXPECT_TRUE(h.exec(d, 16).ok());
  EXPECT_EQ(h.exec(dq, 16).syndrome, synd::UNKNOWN_QP);
}

TEST(EmuObjects, SrqAndRmp) {
  Harness h;
  h.bring_up();
  TestHost::Buffer ring = h.host.alloc(4096), dbr = h.host.alloc(64);
  auto in = cmd_in(op::CREATE_SRQ, prm::create_srq_in::size_bytes + 8);
  auto ctx = prm::create_srq_in::view(in.data()).at(prm::create_srq_in::srq_context_entry);
  ctx.set(prm::srqc::log_srq_size, 6)
      .set(prm::srqc::log_rq_stride, 2)
      .set(prm::srqc::pd, h.pd)
      .set(prm::srqc::dbr_addr, dbr.iova);
  prm::pas_set(prm::create_srq_in::view(in.data()).elem(prm::create_srq_in::pas, 0), ring.iova);
  Result r = h.exec(in, Harness::out_size(op::CREATE_SRQ));
  ASSERT_TRUE(r.ok()) << std::hex << r.syndrome;
  uint32_t srqn = uint32_t(prm::get(r.out.data(), prm::create_srq_out::srqn));
  ctx.set(prm::srqc::log_srq_size, 7);  // 128 x 64 B = 2 pages, one given
  EXPECT_EQ(h.exec(in, Harness::out_size(op::CREATE_SRQ)).syndrome, synd::PAS_TOO_SHORT);
  auto arm = cmd_in(op::ARM_RQ, 16, prm::kArmRqOpModSrq);
  prm::set(arm.data(), prm::arm_rq_in::srq_number, srqn);
  prm::set(arm.data(), prm::arm_rq_in::lwm, 5);
  EXPECT_TRUE(h.exec(arm, 16).ok());
  auto q = cmd_in(op::QUERY_SRQ, 16);
  prm::set(q.data(), prm::query_srq_in::srqn, srqn);
  r = h.exec(q, Harness::out_size(op::QUERY_SRQ));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(prm::query_srq_out::cview(r.out.data()).at(prm::query_srq_out::srq_context_entry).get(prm::srqc::lwm), 5u);
  // RMP over a linked-list WQ.
  auto rin = cmd_in(op::CREATE_RMP, prm::create_rmp_in::size_bytes + 8);
  auto rc = prm::create_rmp_in::view(rin.data()).at(prm::create_rmp_in::ctx);
  rc.set(prm::rmpc::state, prm::rmpc_state::RDY);
  auto wq = rc.at(prm::rmpc::wq);
  wq.set(prm::wq::wq_type, prm::wq_type::LINKED_LIST).set(prm::wq::pd, h.pd).set(prm::wq::dbr_addr, dbr.iova + 8);
  wq.set(prm::wq::log_wq_stride, 6).set(prm::wq::log_wq_sz, 6);
  prm::pas_set(rin.data() + prm::create_rmp_in::size_bytes, ring.iova);
  r = h.exec(rin, Harness::out_size(op::CREATE_RMP));
  ASSERT_TRUE(r.ok()) << std::hex << r.syndrome;
  uint32_t rmpn = uint32_t(prm::get(r.out.data(), prm::create_rmp_out::rmpn));
  auto dr = cmd_in(op::DESTROY_SRQ, 16);  // an RMP is not an SRQ to DESTROY_SRQ
  prm::set(dr.data(), prm::destroy_srq_in::srqn, rmpn);
  EXPECT_EQ(h.exec(dr, 16).syndrome, synd::UNKNOWN_SRQ);
  auto drm = cmd_in(op::DESTROY_RMP, 16);
  prm::set(drm.data(), prm::destroy_rmp_in::rmpn, rmpn);
  EXPECT_TRUE(h.exec(drm, 16).ok());
}

TEST(EmuObjects, GidTableVportAndPortRegisters) {
  Harness h;
  h.bring_up();
  ASSERT_TRUE(h.set_gid(3, kIp).ok());
  auto q = cmd_in(op::QUERY_ROCE_ADDRESS, 16);
  prm::set(q.data(), prm::query_roce_address_in::roce_address_index, 3);
  Result r = h.exec(q, Harness::out_size(op::QUERY_ROCE_ADDRESS));
  ASSERT_TRUE(r.ok());
  auto a = prm::query_roce_address_out::cview(r.out.data()).at(prm::query_roce_address_out::roce_address);
  EXPECT_EQ(a.bytes(prm::roce_addr_layout::source_l3_address)[15], 1);
  EXPECT_EQ(a.get(prm::roce_addr_layout::roce_version), prm::roce_version::VERSION_2);
  EXPECT_EQ(h.set_gid(256, kIp).syndrome, synd::BAD_GID_INDEX);
  // roce_en: off after power-up, on once the driver sets it.
  auto qv = cmd_in(op::QUERY_NIC_VPORT_CONTEXT, 16);
  auto roce_en = [&] {
    Result x = h.exec(qv, Harness::out_size(op::QUERY_NIC_VPORT_CONTEXT));
    return prm::query_nic_vport_context_out::cview(x.out.data())
        .at(prm::query_nic_vport_context_out::nic_vport_context)
        .get(prm::nic_vport_context::roce_en);
  };
  EXPECT_EQ(roce_en(), 0u);
  auto mv = cmd_in(op::MODIFY_NIC_VPORT_CONTEXT, Harness::in_size(op::MODIFY_NIC_VPORT_CONTEXT));
  prm::modify_nic_vport_context_in::view m(mv.data());
  m.at(prm::modify_nic_vport_context_in::field_select).set(prm::modify_nic_vport_field_select::roce_en, 1);
  m.at(prm::modify_nic_vport_context_in::nic_vport_context).set(prm::nic_vport_context::roce_en, 1);
  ASSERT_TRUE(h.exec(mv, 16).ok());
  EXPECT_EQ(roce_en(), 1u);
  // PMTU and PTYS.
  auto reg = [&](uint16_t id, uint32_t bytes, uint16_t mode, std::function<void(uint8_t*)> fill) {
    auto in = cmd_in(op::ACCESS_REG, prm::access_register_in::size_bytes + bytes, mode);
    prm::set(in.data(), prm::access_register_in::register_id, id);
    fill(in.data() + 16);
    return h.exec(in, 16 + bytes);
  };
  r = reg(prm::reg_id::PMTU, prm::pmtu_reg::size_bytes, prm::access_reg_op_mod::READ,
          [](uint8_t* p) { prm::set(p, prm::pmtu_reg::local_port, 1); });
  ASSERT_TRUE(r.ok());
  EXPECT_GE(prm::get(r.out.data() + 16, prm::pmtu_reg::max_mtu), 4096u);
  r = reg(prm::reg_id::PTYS, prm::ptys_reg::size_bytes, prm::access_reg_op_mod::READ, [](uint8_t* p) {
    prm::set(p, prm::ptys_reg::local_port, 1);
    prm::set(p, prm::ptys_reg::proto_mask, prm::kPtysEth);
  });
  ASSERT_TRUE(r.ok());
  EXPECT_NE(prm::get(r.out.data() + 16, prm::ptys_reg::eth_proto_oper), 0u);
  r = reg(prm::reg_id::PTYS, prm::ptys_reg::size_bytes, prm::access_reg_op_mod::READ,
          [](uint8_t* p) { prm::set(p, prm::ptys_reg::local_port, 2); });
  EXPECT_EQ(r.syndrome, synd::BAD_PORT);
  r = reg(0x1234, 16, prm::access_reg_op_mod::READ, [](uint8_t*) {});
  EXPECT_EQ(r.syndrome, synd::BAD_REGISTER);
}

TEST(EmuObjects, QCountersAllocateQueryAndFree) {
  Harness h;
  h.bring_up();
  uint32_t id = h.alloc(op::ALLOC_Q_COUNTER, prm::alloc_q_counter_out::counter_set_id);
  EXPECT_NE(id, 0u);
  auto q = cmd_in(op::QUERY_Q_COUNTER, Harness::in_size(op::QUERY_Q_COUNTER));
  prm::set(q.data(), prm::query_q_counter_in::counter_set_id, id);
  EXPECT_TRUE(h.exec(q, Harness::out_size(op::QUERY_Q_COUNTER)).ok());
  auto d = cmd_in(op::DEALLOC_Q_COUNTER, 16);
  prm::set(d.data(), prm::dealloc_q_counter_in::counter_set_id, id);
  EXPECT_TRUE(h.exec(d, 16).ok());
  EXPECT_EQ(h.exec(q, Harness::out_size(op::QUERY_Q_COUNTER)).syndrome, synd::UNKNOWN_Q_COUNTER);
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
