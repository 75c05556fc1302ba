// MlxPCIDriver and MlxUserClient (src/dext/driverkit), compiled unchanged against the DriverKit
// stand-in, on the emulated ConnectX-4 Lx: Start to MelonState=ready, the orphaned card, the
// entitlement check, ExternalMethod's refusals, the registry counts, mappings, client death and
// Stop leaving nothing behind.
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "dext/driverkit/dext_device.h"
#include "dext/driverkit/driver_parts.h"
#include "dext/driverkit/queue_memory.h"
#include "dk_rig.h"
#include "mlx5/emu/hca.h"
#include "mlx5/emu/wire.h"
#include "mlx5/prm/prm.h"

namespace melon::dktest {
namespace {

using uapi::Selector;
using uapi::Status;

constexpr const char* kAccess = "com.apple.developer.driverkit.userclient-access";

class DextGlue : public ::testing::Test {
 protected:
  void SetUp() override {
    dkfake::clear_log();
    dkfake::set_task_entitlements({MLX_DEXT_ID});
  }
};

bool has_line(const std::string& line) {
  auto v = dkfake::log_lines();
  return std::find(v.begin(), v.end(), line) != v.end();
}

melon::dext::DriverParts* parts(IOService* s) {
  return static_cast<melon::dext::DriverParts*>(static_cast<MlxPCIDriver*>(s)->CoreDevice());
}

TEST_F(DextGlue, StartBringsTheEmulatedCardToReadyAndStopLeavesNothing) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    EXPECT_EQ(dkfake::string_property(d.service, "MelonState"), "ready");
    EXPECT_TRUE(has_line("MlxPCIDriver: function 15b3:1015 (ConnectX-4 Lx)"));
    EXPECT_TRUE(has_line("MlxPCIDriver: MelonState starting"));
    EXPECT_TRUE(has_line("MlxPCIDriver: MelonState ready"));
    ASSERT_NE(parts(d.service), nullptr);
    EXPECT_EQ(parts(d.service)->dev->hca().state(), mlx5::core::HcaState::up);
    // The core ran over MSI-X: the async and completion EQs have vectors, and events came through them.
    EXPECT_TRUE(has_line("MlxEQ: async EQ 1 + 1 completion EQs, MSI-X vectors"));
    EXPECT_GT(parts(d.service)->dev->hca().stats().events, 0u);
    EXPECT_EQ(d.stop(), kIOReturnSuccess);
    EXPECT_EQ(d.card.host().mapped_bytes(), 0u) << "IOVA mappings left on the card";
    EXPECT_EQ(d.card.device().stats().fw_pages_held, 0u);
  }
  expect_same(before, Ledger{});
}

// SetProperties is an IPC and can fail. The failure is logged and MelonState published again by
// the service timer, so the operator scripts see the real state. At 842afb3 the result was ignored
// and the registry said "starting" for good.
TEST_F(DextGlue, FailedSetPropertiesIsLoggedAndMelonStatePublishedAgain) {
  dkfake::fail_set_properties(2);  // MelonState starting, then ready
  Driver d;
  dkfake::fail_set_properties(0);
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  EXPECT_TRUE(has_line("MlxPCIDriver: SetProperties(MelonState starting) failed: 0xe00002bd"));
  EXPECT_TRUE(has_line("MlxPCIDriver: SetProperties(MelonState ready) failed: 0xe00002bd"));
  std::string state;
  for (int i = 0; i < 60 && (state = dkfake::string_property(d.service, "MelonState")) != "ready"; i++)
    usleep(50 * 1000);  // the service timer runs every 500 ms
  EXPECT_EQ(state, "ready");
}

TEST_F(DextGlue, WithoutMsixTheCorePollsAndStillComesUp) {
  Ledger before;
  {
    dkfake::CardOptions o;
    o.configure_msix = false;
    Driver d(o);
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    EXPECT_EQ(dkfake::string_property(d.service, "MelonState"), "ready");
    EXPECT_TRUE(has_line("MlxPCIDriver: MSI-X not configured; using what the function offers"));
    EXPECT_TRUE(has_line("MlxEQ: async EQ 1 + 1 completion EQs, polled"));
    EXPECT_EQ(d.stop(), kIOReturnSuccess);
  }
  expect_same(before, Ledger{});
}

TEST_F(DextGlue, OrphanedCardLogsTheExactLineAndStartFailsCleanly) {
  Ledger before;
  {
    dkfake::Card card;
    card.device().surprise_remove();  // config space now reads all ones, as an unpowered card's does
    kern_return_t r = kIOReturnSuccess;
    IOService* drv = dkfake::start_driver(card, &r);
    ASSERT_NE(drv, nullptr);
    EXPECT_EQ(r, kIOReturnNoDevice);
    EXPECT_TRUE(has_line("MlxPCIDriver: config space reads 0xffff"));
    EXPECT_EQ(dkfake::string_property(drv, "MelonState"), "fatal");
    EXPECT_EQ(static_cast<MlxPCIDriver*>(drv)->CoreDevice(), nullptr);
    // Not registered: no application can find it.
    Conn c;
    EXPECT_EQ(c.open_result, kIOReturnNotFound);
    drv->release();
    EXPECT_EQ(card.host().mapped_bytes(), 0u);
  }
  expect_same(before, Ledger{});
}

// pci_devices.h is what Start drives: any other function is refused before the driver touches it
// (no command, no FLR, memory space and bus master as they were), with a log line, and closed again
// so the next driver that matches can have it. At 842afb3 Start drove a ConnectX-5 like a 4 Lx.
TEST_F(DextGlue, StartRefusesADeviceTheCoreDoesNotDrive) {
  Ledger before;
  {
    dkfake::CardOptions o;
    o.device_id = 0x1017;  // ConnectX-5
    Driver d(o);
    EXPECT_EQ(d.start_result, kIOReturnUnsupported);
    EXPECT_TRUE(has_line("MlxPCIDriver: 15b3:1017 is not a device this driver supports; leaving it"));
    EXPECT_EQ(d.card.device().stats().commands, 0u);
    EXPECT_EQ(d.card.flrs_.load(), 0);
    EXPECT_EQ(d.card.device().config_read(mlx5::emu::kPciCommand, 2) &
                  (mlx5::emu::kPciCommandMemory | mlx5::emu::kPciCommandBusMaster),
              mlx5::emu::kPciCommandMemory);  // as the host enumerated it: bus master never set
    ASSERT_EQ(d.card.pci()->Open(d.service, 0), kIOReturnSuccess) << "Start left the function open";
    d.card.pci()->Close(d.service, 0);
  }
  expect_same(before, Ledger{});
}

TEST_F(DextGlue, BringUpFailureIsFatalAndReleasesEverything) {
  Ledger before;
  {
    dkfake::Card card;
    mlx5::emu::Faults f;
    f.bad_status_opcode = 0x104;  // ENABLE_HCA (PRM opcode) fails
    f.bad_status = 0x4;
    f.bad_status_syndrome = 0x1234;
    card.device().set_faults(f);
    kern_return_t r = kIOReturnSuccess;
    IOService* drv = dkfake::start_driver(card, &r);
    ASSERT_NE(drv, nullptr);
    EXPECT_EQ(r, kIOReturnNotReady);
    EXPECT_EQ(dkfake::string_property(drv, "MelonState"), "fatal");
    bool said = false;
    for (auto& l : dkfake::log_lines())
      said |= l.rfind("MlxPCIDriver: bring-up failed at ENABLE_HCA", 0) == 0 && l.find("syndrome 0x1234") != l.npos;
    EXPECT_TRUE(said) << "no bring-up failure line naming the stage and syndrome";
    drv->release();
    EXPECT_EQ(card.host().mapped_bytes(), 0u);
  }
  expect_same(before, Ledger{});
}

// A buffer whose DMA segments do not follow each other cannot be one queue or mailbox: the HAL
// refuses it, bring-up fails at the first such buffer with its stage named, and everything is
// released (no IOVA mapping, no descriptor, no command left).
TEST_F(DextGlue, DmaMappingsWithGapsAreRefusedAndBringUpFailsCleanly) {
  Ledger before;
  {
    dkfake::CardOptions o;
    o.dma_segment_bytes = 4096;
    o.dma_segment_gaps = true;
    Driver d(o);
    EXPECT_EQ(d.start_result, kIOReturnNotReady);
    EXPECT_EQ(dkfake::string_property(d.service, "MelonState"), "fatal");
    bool said = false;
    for (auto& l : dkfake::log_lines()) said |= l.rfind("MlxPCIDriver: bring-up failed at ", 0) == 0;
    EXPECT_TRUE(said) << "no bring-up failure line";
    EXPECT_EQ(d.card.host().mapped_bytes(), 0u);
  }
  expect_same(before, Ledger{});
}

TEST_F(DextGlue, OpenWithoutTheEntitlementIsRefused) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  const std::string refusal =
      std::string("MlxUserClient: refused: the opener lacks ") + kAccess + " for " + MLX_DEXT_ID;
  dkfake::set_task_entitlements({});
  {
    Conn c;
    EXPECT_EQ(c.open_result, kIOReturnNotPermitted);
  }
  EXPECT_TRUE(has_line(refusal));
  dkfake::set_task_entitlements({"org.example.another.dext", "org.melondma.rdma.dex"});
  {
    Conn c;
    EXPECT_EQ(c.open_result, kIOReturnNotPermitted);
  }
  // Both of Apple's forms name us: an array, or a single string.
  dkfake::set_task_entitlements({"org.example.another.dext", MLX_DEXT_ID});
  {
    Conn c;
    EXPECT_EQ(c.open_result, kIOReturnSuccess);
    EXPECT_EQ(c.open(), Status::ok);
  }
  dkfake::set_task_entitlements({MLX_DEXT_ID}, false);
  {
    Conn c;
    EXPECT_EQ(c.open_result, kIOReturnSuccess);
  }
  EXPECT_EQ(parts(d.service)->dev->clients(), 0u);
}

TEST_F(DextGlue, ExternalMethodRefusalsCarryTheUapiStatus) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  Conn c;
  ASSERT_EQ(c.open_result, kIOReturnSuccess);
  uapi::HandleResp pd{};
  // Before Open.
  EXPECT_EQ(c.call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::not_open);
  ASSERT_EQ(c.open(), Status::ok);
  EXPECT_EQ(c.open(), Status::already_open);
  ASSERT_EQ(c.call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::ok);
  uapi::EmptyResp e;
  // Unknown selector, a short (truncated) request, a short response buffer.
  EXPECT_EQ(c.call(0x1fff, nullptr, 0, nullptr, 0), Status::unknown_selector);
  uapi::CreateCqReq cq{63, 0, 0, 0};
  uapi::CreateCqResp cqr{};
  EXPECT_EQ(c.call(uint32_t(Selector::create_cq), &cq, 3, &cqr, sizeof cqr), Status::truncated);
  uapi::DeviceAttr attr{};
  EXPECT_EQ(c.call(uint32_t(Selector::query_device), nullptr, 0, &attr, 8), Status::out_too_small);
  // Longer than the server's struct with nonzero extra bytes.
  uint8_t longer[sizeof(uapi::HandleReq) + 4] = {};
  memcpy(longer, &pd, sizeof pd);
  longer[sizeof longer - 1] = 1;
  EXPECT_EQ(c.call(uint32_t(Selector::dealloc_pd), longer, sizeof longer, &e, 0), Status::trailing_nonzero);
  // Forged handles: a made-up token, the right slot with the wrong type, bits above 24.
  EXPECT_EQ(c.call(Selector::dealloc_pd, uapi::HandleReq{0x12345, 0}, &e), Status::bad_handle);
  EXPECT_EQ(c.call(Selector::destroy_qp, uapi::HandleReq{pd.handle, 0}, &e), Status::bad_handle);
  EXPECT_EQ(c.call(Selector::dealloc_pd, uapi::HandleReq{pd.handle | 0x1000000, 0}, &e), Status::bad_handle);
  // Structures IOKit would pass out of line are not ours: a transport error, not a uapi status.
  std::vector<uint8_t> huge(uapi::iokit::kMaxInline + 1);
  size_t n = 0;
  uapi::Status st;
  kern_return_t kr = c.raw(uint32_t(Selector::alloc_pd), huge.data(), huge.size(), nullptr, &n);
  EXPECT_EQ(kr, kIOReturnBadArgument);
  EXPECT_FALSE(uapi::iokit::status_of_return(kr, &st));
  // A response the caller cannot hold is the kernel's refusal (the stand-in's, here).
  // Nothing was created by any of the refusals.
  uapi::UsageResp u{};
  ASSERT_EQ(c.call(Selector::query_usage, uapi::EmptyReq{}, &u), Status::ok);
  EXPECT_EQ(u.server_live[uint8_t(uapi::ObjType::pd)], 1u);
  EXPECT_EQ(u.server_live[uint8_t(uapi::ObjType::cq)], 0u);
  EXPECT_EQ(c.call(Selector::dealloc_pd, uapi::HandleReq{pd.handle, 0}, &e), Status::ok);
}

struct Objects {
  uint32_t pd = 0, uar = 0, cq = 0, qp = 0, mr = 0;
  uapi::UarResp uar_r{};
  uapi::CreateCqResp cq_r{};
  uapi::CreateQpResp qp_r{};
};

void make_objects(Conn& c, Objects* o, void* buf, size_t len) {
  uapi::HandleResp pd{};
  ASSERT_EQ(c.call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::ok);
  o->pd = pd.handle;
  ASSERT_EQ(c.call(Selector::alloc_uar, uapi::EmptyReq{}, &o->uar_r), Status::ok);
  o->uar = o->uar_r.handle;
  ASSERT_EQ(c.call(Selector::create_cq, uapi::CreateCqReq{63, 0, o->uar, 0}, &o->cq_r), Status::ok);
  o->cq = o->cq_r.handle;
  uapi::CreateQpReq q{};
  q.pd = o->pd;
  q.send_cq = q.recv_cq = o->cq;
  q.uar = o->uar;
  q.qp_type = uapi::kQpRc;
  q.max_send_wr = q.max_recv_wr = 32;
  q.max_send_sge = q.max_recv_sge = 1;
  ASSERT_EQ(c.call(Selector::create_qp, q, &o->qp_r), Status::ok);
  o->qp = o->qp_r.handle;
  uapi::RegMrReq mr{o->pd, uapi::kAccessLocalWrite | uapi::kAccessRemoteWrite, uint64_t(uintptr_t(buf)), len};
  uapi::RegMrResp mrr{};
  ASSERT_EQ(c.call(Selector::reg_mr, mr, &mrr), Status::ok);
  o->mr = mrr.handle;
}

// Apple's PrepareForDMA may describe one IOVA range as several segments. Segments that follow
// each other are one range: the driver comes up and moves data over such mappings. At 842afb3 any
// second segment was refused, so bring-up failed at the first buffer larger than a segment.
TEST_F(DextGlue, DmaMappingsInSeveralContiguousSegmentsAreOneRange) {
  Ledger before;
  {
    dkfake::CardOptions o;
    o.dma_segment_bytes = 4096;
    Driver d(o);
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    EXPECT_EQ(dkfake::string_property(d.service, "MelonState"), "ready");
    Conn c;
    ASSERT_EQ(c.open(), Status::ok);
    std::vector<uint8_t> buf(65536);
    Objects ob;
    make_objects(c, &ob, buf.data(), buf.size());  // a 64 KiB MR and queue buffers of several pages
    EXPECT_EQ(d.stop(), kIOReturnSuccess);
    c.port = IO_OBJECT_NULL;
  }
  expect_same(before, Ledger{});
}

// The kernel makes a descriptor only of memory the client task maps, writable where the device
// writes (the fake asks /proc/self/maps). An MR the device may write over read-only pages, or over
// pages not mapped at all, is refused cleanly; a read-only MR over read-only pages is taken.
TEST_F(DextGlue, MrOverMemoryTheClientCannotLendIsRefused) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    Conn c;
    ASSERT_EQ(c.open(), Status::ok);
    uapi::HandleResp pd{};
    ASSERT_EQ(c.call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::ok);
    const size_t len = 65536;
    void* ro = mmap(nullptr, 2 * len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(ro, MAP_FAILED);
    uint64_t gone = uint64_t(uintptr_t(ro)) + len;
    ASSERT_EQ(munmap(reinterpret_cast<void*>(uintptr_t(gone)), len), 0);
    uint64_t live = parts(d.service)->queues->live();
    // Memory the client cannot lend for that access is a bad address (EFAULT, as ibv_reg_mr on Linux).
    uapi::RegMrResp mr{};
    EXPECT_EQ(
        c.call(Selector::reg_mr, uapi::RegMrReq{pd.handle, uapi::kAccessLocalWrite, uint64_t(uintptr_t(ro)), len}, &mr),
        Status::bad_address);
    EXPECT_EQ(c.call(Selector::reg_mr, uapi::RegMrReq{pd.handle, uapi::kAccessRemoteRead, gone, len}, &mr),
              Status::bad_address);
    EXPECT_EQ(parts(d.service)->queues->live(), live) << "a refused pin left something behind";
    ASSERT_EQ(
        c.call(Selector::reg_mr, uapi::RegMrReq{pd.handle, uapi::kAccessRemoteRead, uint64_t(uintptr_t(ro)), len}, &mr),
        Status::ok);
    uapi::EmptyResp e;
    EXPECT_EQ(c.call(Selector::dereg_mr, uapi::HandleReq{mr.handle, 0}, &e), Status::ok);
    munmap(ro, len);
  }
  expect_same(before, Ledger{});
}

TEST_F(DextGlue, UserClientPublishesItsQpAndMrCounts) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  Conn c;
  ASSERT_EQ(c.open_result, kIOReturnSuccess);
  EXPECT_EQ(dkfake::number_property(c.client(), "MelonQPCount"), 0);
  EXPECT_EQ(dkfake::number_property(c.client(), "MelonMRCount"), 0);
  ASSERT_EQ(c.open(), Status::ok);
  std::vector<uint8_t> buf(64 * 1024);
  Objects o;
  make_objects(c, &o, buf.data(), buf.size());
  EXPECT_EQ(dkfake::number_property(c.client(), "MelonQPCount"), 1);
  EXPECT_EQ(dkfake::number_property(c.client(), "MelonMRCount"), 1);
  uapi::EmptyResp e;
  ASSERT_EQ(c.call(Selector::destroy_qp, uapi::HandleReq{o.qp, 0}, &e), Status::ok);
  EXPECT_EQ(dkfake::number_property(c.client(), "MelonQPCount"), 0);
  EXPECT_EQ(dkfake::number_property(c.client(), "MelonMRCount"), 1);
  ASSERT_EQ(c.call(Selector::dereg_mr, uapi::HandleReq{o.mr, 0}, &e), Status::ok);
  EXPECT_EQ(dkfake::number_property(c.client(), "MelonMRCount"), 0);
}

TEST_F(DextGlue, MappingsComeFromCopyClientMemoryForType) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  Conn c;
  ASSERT_EQ(c.open(), Status::ok);
  std::vector<uint8_t> buf(16384);
  Objects o;
  make_objects(c, &o, buf.data(), buf.size());
  // The CQ ring: every CQE starts software-owned with an invalid opcode (0xf1 in its last byte).
  mach_vm_address_t addr = 0;
  mach_vm_size_t size = 0;
  ASSERT_EQ(IOConnectMapMemory64(c.port, uapi::map_type(uapi::MapKind::cqe, o.cq), mach_task_self(), &addr, &size,
                                 kIOMapAnywhere),
            kIOReturnSuccess);
  ASSERT_GE(size, 64u * 64);
  for (uint32_t i = 0; i < o.cq_r.cqe; i++) ASSERT_EQ(reinterpret_cast<uint8_t*>(addr)[i * 64 + 63], 0xf1) << i;
  EXPECT_EQ(IOConnectUnmapMemory64(c.port, uapi::map_type(uapi::MapKind::cqe, o.cq), mach_task_self(), addr),
            kIOReturnSuccess);
  // The QP's doorbell record and send queue.
  for (auto kind : {uapi::MapKind::db_record, uapi::MapKind::sq, uapi::MapKind::rq}) {
    ASSERT_EQ(IOConnectMapMemory64(c.port, uapi::map_type(kind, o.qp), mach_task_self(), &addr, &size, kIOMapAnywhere),
              kIOReturnSuccess)
        << int(kind);
    EXPECT_GT(size, 0u);
  }
  // The UAR: one host page of BAR0, past the initialization segment, page aligned.
  ASSERT_EQ(IOConnectMapMemory64(c.port, uapi::map_type(uapi::MapKind::uar, o.uar), mach_task_self(), &addr, &size,
                                 kIOMapAnywhere),
            kIOReturnSuccess);
  EXPECT_EQ(size, dkfake::task_page_size());
  long long off = dkfake::device_offset_of(c.port, addr);
  EXPECT_GE(off, (long long)mlx5::emu::kFirstUarIndex * 4096);
  EXPECT_EQ(off % dkfake::task_page_size(), 0u);
  // Refusals: another object's kind, a forged token, a type above 32 bits of sense.
  kern_return_t kr =
      IOConnectMapMemory64(c.port, uapi::map_type(uapi::MapKind::sq, o.cq), mach_task_self(), &addr, &size, 0);
  Status st;
  ASSERT_TRUE(uapi::iokit::status_of_return(kr, &st)) << std::hex << kr;
  EXPECT_NE(st, Status::ok);
  kr = IOConnectMapMemory64(c.port, uapi::map_type(uapi::MapKind::cqe, 0x345), mach_task_self(), &addr, &size, 0);
  ASSERT_TRUE(uapi::iokit::status_of_return(kr, &st));
  EXPECT_EQ(st, Status::bad_handle);
}

// Apple: "For a given IOUserClient instance, calling CopyClientMemoryForType() with a given type,
// should return the same IOMemoryDescriptor instance." The caller consumes one reference each time.
// A destroyed object's descriptors are let go at once (its queue memory with them), the rest when
// the client goes. At 842afb3 each call made a new sub-descriptor.
TEST_F(DextGlue, CopyClientMemoryForTypeGivesOneInstancePerType) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    Conn c;
    ASSERT_EQ(c.open(), Status::ok);
    std::vector<uint8_t> buf(16384);
    Objects o;
    make_objects(c, &o, buf.data(), buf.size());
    IOUserClient* uc = c.client();
    auto copy = [&](uapi::MapKind k, uint32_t h) {
      uint64_t opts = 1;
      IOMemoryDescriptor* m = nullptr;
      EXPECT_EQ(uc->CopyClientMemoryForType(uapi::map_type(k, h), &opts, &m), kIOReturnSuccess);
      EXPECT_EQ(opts, 0u);
      return m;
    };
    // How many objects a destroy of a QP and its CQ frees, on a pair nobody mapped.
    uapi::CreateCqResp cq2{};
    ASSERT_EQ(c.call(Selector::create_cq, uapi::CreateCqReq{63, 0, o.uar, 0}, &cq2), Status::ok);
    uapi::EmptyResp e;
    long with_cq2 = dkfake::live_objects();
    ASSERT_EQ(c.call(Selector::destroy_cq, uapi::HandleReq{cq2.handle, 0}, &e), Status::ok);
    long cq_objects = with_cq2 - dkfake::live_objects();
    // The same instance for the same type, another for another type.
    IOMemoryDescriptor* m1 = copy(uapi::MapKind::cqe, o.cq);
    IOMemoryDescriptor* m2 = copy(uapi::MapKind::cqe, o.cq);
    IOMemoryDescriptor* m3 = copy(uapi::MapKind::db_record, o.cq);
    ASSERT_TRUE(m1 && m2 && m3);
    EXPECT_EQ(m1, m2);
    EXPECT_NE(m1, m3);
    m1->release(), m2->release(), m3->release();  // the references the caller consumes
    ASSERT_EQ(c.call(Selector::destroy_qp, uapi::HandleReq{o.qp, 0}, &e), Status::ok);
    long mapped = dkfake::live_objects();
    ASSERT_EQ(c.call(Selector::destroy_cq, uapi::HandleReq{o.cq, 0}, &e), Status::ok);
    EXPECT_EQ(mapped - dkfake::live_objects(), cq_objects + 2) << "the CQ's two descriptors outlived it";
  }
  expect_same(before, Ledger{});
}

// A resized CQ's ring is other memory: the glue lets the cached ring descriptor go, so the next
// copy describes the new ring (mapped, it has the new size and fresh CQEs), and keeps the record's.
TEST_F(DextGlue, ResizeCqRefreshesTheRingDescriptorOnly) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    Conn c;
    ASSERT_EQ(c.open(), Status::ok);
    std::vector<uint8_t> buf(16384);
    Objects o;
    make_objects(c, &o, buf.data(), buf.size());
    IOUserClient* uc = c.client();
    auto copy = [&](uapi::MapKind k) {
      uint64_t opts = 1;
      IOMemoryDescriptor* m = nullptr;
      EXPECT_EQ(uc->CopyClientMemoryForType(uapi::map_type(k, o.cq), &opts, &m), kIOReturnSuccess);
      return m;
    };
    IOMemoryDescriptor* ring1 = copy(uapi::MapKind::cqe);
    IOMemoryDescriptor* rec1 = copy(uapi::MapKind::db_record);
    uapi::ResizeCqResp rr{};
    ASSERT_EQ(c.call(Selector::resize_cq, uapi::ResizeCqReq{o.cq, 255}, &rr), Status::ok);
    EXPECT_EQ(rr.cqe, 256u);
    IOMemoryDescriptor* ring2 = copy(uapi::MapKind::cqe);
    IOMemoryDescriptor* rec2 = copy(uapi::MapKind::db_record);
    ASSERT_TRUE(ring1 && rec1 && ring2 && rec2);
    EXPECT_NE(ring1, ring2);
    EXPECT_EQ(rec1, rec2);
    ring1->release(), rec1->release(), ring2->release(), rec2->release();
    mach_vm_address_t addr = 0;
    mach_vm_size_t size = 0;
    ASSERT_EQ(IOConnectMapMemory64(c.port, uapi::map_type(uapi::MapKind::cqe, o.cq), mach_task_self(), &addr, &size,
                                   kIOMapAnywhere),
              kIOReturnSuccess);
    ASSERT_GE(size, 64u * 256);
    for (uint32_t i = 0; i < rr.cqe; i++) ASSERT_EQ(reinterpret_cast<uint8_t*>(addr)[i * 64 + 63], 0xf1) << i;
    EXPECT_EQ(IOConnectUnmapMemory64(c.port, uapi::map_type(uapi::MapKind::cqe, o.cq), mach_task_self(), addr),
              kIOReturnSuccess);
  }
  expect_same(before, Ledger{});
}

TEST_F(DextGlue, ClientDeathReleasesEverythingItHeld) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    std::vector<uint8_t> buf(64 * 1024);
    {
      Conn c;
      ASSERT_EQ(c.open(), Status::ok);
      Objects o;
      make_objects(c, &o, buf.data(), buf.size());
      Objects o2;
      make_objects(c, &o2, buf.data(), 4096);
      mach_vm_address_t addr = 0;
      mach_vm_size_t size = 0;
      ASSERT_EQ(IOConnectMapMemory64(c.port, uapi::map_type(uapi::MapKind::sq, o.qp), mach_task_self(), &addr, &size,
                                     kIOMapAnywhere),
                kIOReturnSuccess);
      auto* p = parts(d.service);
      EXPECT_EQ(p->dev->hca().live(mlx5::core::ObjKind::qp), 2u);
      EXPECT_GT(p->queues->live(), 0u);
      // The process dies: no destroy, no unmap, no close.
      dkfake::kill_connection(c.port);
      c.port = IO_OBJECT_NULL;
      EXPECT_EQ(p->dev->clients(), 0u);
      for (auto k : {mlx5::core::ObjKind::qp, mlx5::core::ObjKind::cq, mlx5::core::ObjKind::mr, mlx5::core::ObjKind::pd,
                     mlx5::core::ObjKind::uar})
        EXPECT_EQ(p->dev->hca().live(k), 0u) << int(k);
      EXPECT_EQ(p->queues->live(), 0u) << "queue memory or pinned ranges left";
    }
    // What another client sees: nothing of the dead one's.
    Conn other;
    ASSERT_EQ(other.open(), Status::ok);
    uapi::UsageResp u{};
    ASSERT_EQ(other.call(Selector::query_usage, uapi::EmptyReq{}, &u), Status::ok);
    EXPECT_EQ(u.clients, 1u);
    for (uint32_t t = 0; t < uapi::kObjTypes; t++) EXPECT_EQ(u.server_live[t], 0u) << t;
    EXPECT_EQ(u.pinned_bytes, 0u);
    EXPECT_EQ(u.queue_bytes, 0u);
  }
  expect_same(before, Ledger{});
}

// Apple does not promise that a provider's Stop comes after its clients'. A client still open when
// the driver stops finds a stopped device: its calls and mappings answer device_dead, its objects
// are gone, and its own Stop later frees what was left. At 842afb3 the driver freed the device
// under the client, whose next call used freed memory (ASan stops the debug build there).
TEST_F(DextGlue, DriverStoppedBeforeItsClientsLeavesThemAStoppedDevice) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    Conn c;
    ASSERT_EQ(c.open(), Status::ok);
    std::vector<uint8_t> buf(16384);
    Objects o;
    make_objects(c, &o, buf.data(), buf.size());
    EXPECT_EQ(dkfake::stop_provider_first(d.service), kIOReturnSuccess);
    EXPECT_EQ(d.card.host().mapped_bytes(), 0u) << "the stopped device still maps memory for the client";
    uapi::HandleResp pd{};
    EXPECT_EQ(c.call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::device_dead);
    mach_vm_address_t addr = 0;
    mach_vm_size_t size = 0;
    kern_return_t kr = IOConnectMapMemory64(c.port, uapi::map_type(uapi::MapKind::cqe, o.cq), mach_task_self(), &addr,
                                            &size, kIOMapAnywhere);
    Status st;
    ASSERT_TRUE(uapi::iokit::status_of_return(kr, &st)) << std::hex << kr;
    EXPECT_EQ(st, Status::device_dead);
    IOServiceClose(c.port);
    c.port = IO_OBJECT_NULL;
    dkfake::release_stopped(d.service);
    d.service = nullptr;
  }
  expect_same(before, Ledger{});
}

TEST_F(DextGlue, StopWithClientsStillOpenStopsThemFirst) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    std::vector<uint8_t> buf(16384);
    Conn a, b;
    ASSERT_EQ(a.open(), Status::ok);
    ASSERT_EQ(b.open(), Status::ok);
    Objects o;
    make_objects(a, &o, buf.data(), buf.size());
    EXPECT_EQ(d.stop(), kIOReturnSuccess);
    EXPECT_TRUE(has_line("MlxPCIDriver: MelonState stopped"));
    // The connections are gone with the driver; a call on one is the kernel's refusal.
    uapi::HandleResp pd{};
    size_t n = sizeof pd;
    EXPECT_EQ(a.raw(uint32_t(Selector::alloc_pd), nullptr, 0, &pd, &n), kIOReturnBadArgument);
    a.port = b.port = IO_OBJECT_NULL;
    EXPECT_EQ(d.card.host().mapped_bytes(), 0u);
  }
  expect_same(before, Ledger{});
}

// The card reports a fatal firmware error: the service timer's health poll finds it, MelonState
// turns fatal (what scripts/macos wait on), and Stop can only reset the function (FLR through the
// PCIe capability in configuration space) before it frees the memory the card may still write.
TEST_F(DextGlue, FatalFirmwareShowsAsMelonStateFatalAndStopResetsTheFunction) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    Conn c;
    ASSERT_EQ(c.open(), Status::ok);
    // The client holds a CQ, a QP, an SRQ and an MR when the device dies: their destroys cannot
    // reach the firmware, so their IOBufferMemoryDescriptors and IODMACommands stay until the FLR,
    // then go (UapiBackend::release_dead()).
    std::vector<uint8_t> buf(16384);
    Objects o;
    make_objects(c, &o, buf.data(), buf.size());
    uapi::CreateSrqResp srq{};
    ASSERT_EQ(c.call(Selector::create_srq, uapi::CreateSrqReq{o.pd, 8, 1, 0}, &srq), Status::ok);
    // What the device may write: buffer descriptors and their DMA mappings. (Not every OSObject:
    // the service timer's property dictionaries come and go meanwhile.)
    const long held_buffers = dkfake::live_buffers();
    const uint64_t held_mapped = d.card.host().mapped_bytes();
    d.card.device().inject_fatal(0x7);
    std::string state;
    for (int i = 0; i < 200 && (state = dkfake::string_property(d.service, "MelonState")) != "fatal"; i++)
      usleep(50 * 1000);  // the core polls health every 2 s; the service timer runs every 500 ms
    EXPECT_EQ(state, "fatal");
    // The client learns it from its calls too.
    uapi::HandleResp pd{};
    EXPECT_EQ(c.call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::device_dead);
    EXPECT_EQ(d.card.flrs_.load(), 0);
    // The client's destroys succeed for it, but nothing the device may write is freed before the FLR.
    uapi::EmptyResp e;
    EXPECT_EQ(c.call(Selector::destroy_qp, uapi::HandleReq{o.qp, 0}, &e), Status::ok);
    EXPECT_EQ(c.call(Selector::destroy_qp, uapi::HandleReq{o.qp, 0}, &e), Status::bad_handle);
    EXPECT_EQ(dkfake::live_buffers(), held_buffers) << "queue memory freed while the device may write it";
    EXPECT_EQ(d.card.host().mapped_bytes(), held_mapped) << "DMA unmapped while the device may write it";
    EXPECT_EQ(d.stop(), kIOReturnSuccess);
    c.port = IO_OBJECT_NULL;  // stopped with the driver
    EXPECT_EQ(d.card.flrs_.load(), 1) << "teardown of a fatal device must reset it before freeing";
    EXPECT_EQ(d.card.host().mapped_bytes(), 0u);
  }
  expect_same(before, Ledger{});
}

// The FLR of a fatal Stop leaves a card the next Start brings up: a real FLR puts the BARs, the
// command register and MSI-X back at their reset values (the emulated card models it), so the glue
// waits for Transactions Pending to clear, saves them, resets, and restores them. At 842afb3 the
// reset was a raw Device Control write: the second Start found BAR0 unassigned (MMIO all ones) and
// failed, and Transactions Pending was never looked at.
TEST_F(DextGlue, FlrAtStopLeavesACardTheNextStartBringsUp) {
  Ledger before;
  {
    dkfake::Card card;
    kern_return_t r = kIOReturnError;
    IOService* s = dkfake::start_driver(card, &r);
    ASSERT_EQ(r, kIOReturnSuccess);
    card.device().inject_fatal(0x7);
    for (int i = 0; i < 200 && dkfake::string_property(s, "MelonState") != "fatal"; i++) usleep(50 * 1000);
    ASSERT_EQ(dkfake::string_property(s, "MelonState"), "fatal");
    mlx5::emu::Faults f = card.device().faults();
    f.transactions_pending_reads = 2;  // a DMA in flight when Stop comes
    card.device().set_faults(f);
    EXPECT_EQ(dkfake::stop_driver(s), kIOReturnSuccess);
    EXPECT_EQ(card.flrs_.load(), 1);
    EXPECT_EQ(card.device().faults().transactions_pending_reads, 0u) << "Transactions Pending never read";
    // The function decodes its BAR again, with MSI-X enabled as it was.
    EXPECT_NE(card.device().config_read(mlx5::emu::kPciCommand, 2) & mlx5::emu::kPciCommandMemory, 0u);
    uint64_t bar0 = uint64_t(card.device().config_read(0x14, 4)) << 32 | (card.device().config_read(0x10, 4) & ~0xfu);
    EXPECT_EQ(bar0, mlx5::emu::kBar0HostAddress);
    EXPECT_NE(card.device().config_read(mlx5::emu::kPciMsixCap + 2, 2) & mlx5::emu::kPciMsixEnable, 0u);
    uint64_t unclaimed = card.device().stats().mmio_unclaimed;
    dkfake::clear_log();
    s = dkfake::start_driver(card, &r);
    EXPECT_EQ(r, kIOReturnSuccess);
    EXPECT_EQ(dkfake::string_property(s, "MelonState"), "ready");
    EXPECT_EQ(card.device().stats().mmio_unclaimed, unclaimed);
    EXPECT_TRUE(has_line("MlxEQ: async EQ 1 + 1 completion EQs, MSI-X vectors"));
    EXPECT_EQ(card.device().stats().irqs_held, 0u) << "interrupts held: MSI-X left masked";
    if (r == kIOReturnSuccess) {
      EXPECT_EQ(dkfake::stop_driver(s), kIOReturnSuccess);
    } else {
      s->release();
    }
  }
  expect_same(before, Ledger{});
}

// Apple: InterruptOccurred runs on its own queue, and SetEnableWithCompletion(false) returns before
// a handler already running there has finished (only the completion runs after it). The fake now
// behaves so. A handler is held inside the core's EQ drain (at its EQ doorbell store) while a
// fatal Stop tears the device down: no DMA buffer may be freed until the handler is out. At
// 842afb3 vector_disable returned at once and the event queues were freed under the handler.
TEST_F(DextGlue, InterruptDisableWaitsForTheHandlerInsideTheEqBeforeItIsFreed) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    mlx5::emu::Hca& hca = d.card.device().hca();
    uint64_t arm = 0;
    {
      std::lock_guard<std::mutex> l(hca.mu_);
      for (auto& [eqn, eq] : hca.eqs_)
        if (eq.intr == 0) arm = eq.uar * hca.uar_page_bytes() + mlx5::prm::kUarEqArm;
    }
    ASSERT_NE(arm, 0u);
    d.card.block_handler_store(arm);
    std::thread irq([&] { d.card.host().on_irq(0); });  // an MSI-X message on vector 0 (async EQ)
    ASSERT_TRUE(d.card.wait_handler_blocked(5000)) << "the handler did not reach the EQ doorbell";
    d.card.device().inject_fatal(0x7);
    for (int i = 0; i < 200 && dkfake::string_property(d.service, "MelonState") != "fatal"; i++) usleep(50 * 1000);
    EXPECT_EQ(dkfake::string_property(d.service, "MelonState"), "fatal");
    long freed = dkfake::freed_while_a_handler_runs();
    std::thread stop([&] { EXPECT_EQ(d.stop(), kIOReturnSuccess); });
    usleep(500 * 1000);  // the fatal teardown: FLR (100 ms), then the vectors, then the EQs
    EXPECT_EQ(dkfake::freed_while_a_handler_runs(), freed) << "DMA memory freed while the handler was in the EQ";
    d.card.release_handler();
    irq.join();
    stop.join();
  }
  expect_same(before, Ledger{});
}

// One application per card, each card with its own driver, the two cards on one in-memory Ethernet
// link: QPs connected through ExternalMethod, then an RDMA WRITE posted the way the mlx5 provider
// posts it, into memory that reached the application through CopyClientMemoryForType (WQE in the
// SQ ring, the doorbell record, the BlueFlame doorbell stored into the UAR window of BAR0). The
// device reads the WQE and the client's pinned buffer through the DEXT's IODMACommand mappings, the
// peer writes into its client's pinned buffer, and the completion lands in the mapped CQ ring.
namespace p = mlx5::prm;

struct Side {
  Conn& c;
  std::vector<uint8_t> buf = std::vector<uint8_t>(65536);
  uapi::UarResp uar{};
  uapi::CreateCqResp cq{};
  uapi::CreateQpResp qp{};
  uapi::RegMrResp mr{};
  uapi::PortAttr port{};
  uapi::GidResp gid{};
  uint8_t *uar_page = nullptr, *sq = nullptr, *qp_dbr = nullptr, *cqe = nullptr, *cq_dbr = nullptr;

  void* map(uapi::MapKind kind, uint32_t handle) {
    mach_vm_address_t a = 0;
    mach_vm_size_t n = 0;
    EXPECT_EQ(IOConnectMapMemory64(c.port, uapi::map_type(kind, handle), mach_task_self(), &a, &n, kIOMapAnywhere),
              kIOReturnSuccess);
    return reinterpret_cast<void*>(uintptr_t(a));
  }
  void make() {
    ASSERT_EQ(c.open(), Status::ok);
    uapi::HandleResp pd{};
    ASSERT_EQ(c.call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::ok);
    ASSERT_EQ(c.call(Selector::alloc_uar, uapi::EmptyReq{}, &uar), Status::ok);
    ASSERT_EQ(c.call(Selector::create_cq, uapi::CreateCqReq{63, 0, uar.handle, 0}, &cq), Status::ok);
    uapi::CreateQpReq q{};
    q.pd = pd.handle;
    q.send_cq = q.recv_cq = cq.handle;
    q.uar = uar.handle;
    q.qp_type = uapi::kQpRc;
    q.max_send_wr = q.max_recv_wr = 16;
    q.max_send_sge = q.max_recv_sge = 1;
    ASSERT_EQ(c.call(Selector::create_qp, q, &qp), Status::ok);
    uapi::RegMrReq r{pd.handle, uapi::kAccessLocalWrite | uapi::kAccessRemoteWrite, uint64_t(uintptr_t(buf.data())),
                     buf.size()};
    ASSERT_EQ(c.call(Selector::reg_mr, r, &mr), Status::ok);
    ASSERT_EQ(c.call(Selector::query_port, uapi::PortReq{1, 0}, &port), Status::ok);
    ASSERT_EQ(c.call(Selector::query_gid, uapi::GidReq{1, 0}, &gid), Status::ok);
    uar_page = static_cast<uint8_t*>(map(uapi::MapKind::uar, uar.handle));
    sq = static_cast<uint8_t*>(map(uapi::MapKind::sq, qp.handle)) + qp.sq_offset;
    qp_dbr = static_cast<uint8_t*>(map(uapi::MapKind::db_record, qp.handle)) + qp.dbr_offset;
    cqe = static_cast<uint8_t*>(map(uapi::MapKind::cqe, cq.handle));
    cq_dbr = static_cast<uint8_t*>(map(uapi::MapKind::db_record, cq.handle)) + cq.dbr_offset;
  }
  void connect(const Side& peer) {
    uapi::EmptyResp e;
    uapi::ModifyQpReq m{};
    m.handle = qp.handle;
    m.attr_mask = uapi::kQpState | uapi::kQpPkeyIndex | uapi::kQpPort | uapi::kQpAccessFlags;
    m.qp_state = uapi::kStateInit;
    m.port = 1;
    m.access = uapi::kAccessRemoteWrite;
    ASSERT_EQ(c.call(Selector::modify_qp, m, &e), Status::ok);
    m = {};
    m.handle = qp.handle;
    m.attr_mask = uapi::kQpState | uapi::kQpAv | uapi::kQpPathMtu | uapi::kQpDestQpn | uapi::kQpRqPsn |
                  uapi::kQpMaxDestRdAtomic | uapi::kQpMinRnrTimer;
    m.qp_state = uapi::kStateRtr;
    m.path_mtu = 3;  // 1024
    m.dest_qpn = peer.qp.qpn;
    m.rq_psn = 100;
    m.max_dest_rd_atomic = 1;
    m.min_rnr_timer = 12;
    memcpy(m.av.dgid, peer.gid.gid, 16);
    memcpy(m.av.dmac, peer.port.mac, 6);
    m.av.hop_limit = 64;
    m.av.port = 1;
    ASSERT_EQ(c.call(Selector::modify_qp, m, &e), Status::ok);
    m = {};
    m.handle = qp.handle;
    m.attr_mask = uapi::kQpState | uapi::kQpSqPsn | uapi::kQpTimeout | uapi::kQpRetryCnt | uapi::kQpRnrRetry |
                  uapi::kQpMaxQpRdAtomic;
    m.qp_state = uapi::kStateRts;
    m.sq_psn = 100;
    m.timeout = 14;
    m.retry_cnt = 7;
    m.rnr_retry = 7;
    m.max_rd_atomic = 1;
    ASSERT_EQ(c.call(Selector::modify_qp, m, &e), Status::ok);
  }
};

TEST_F(DextGlue, TwoCardsExchangeAnRdmaWriteThroughTheDriversMappings) {
  mlx5::emu::MemoryLink link;
  dkfake::CardOptions oa, ob;
  oa.wire = link.add_port(), oa.mac_last = 0x0a;
  ob.wire = link.add_port(), ob.mac_last = 0x0b;
  Driver da(oa), db(ob);
  ASSERT_EQ(da.start_result, kIOReturnSuccess);
  ASSERT_EQ(db.start_result, kIOReturnSuccess);
  link.attach(oa.wire, &da.card.device());
  link.attach(ob.wire, &db.card.device());
  Conn ca(dkfake::service_port(da.service)), cb(dkfake::service_port(db.service));
  Side a{ca}, b{cb};
  a.make();
  b.make();
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_NE(memcmp(a.gid.gid, b.gid.gid, 16), 0);
  a.connect(b);
  b.connect(a);
  ASSERT_FALSE(HasFatalFailure());
  for (size_t i = 0; i < 4096; i++) a.buf[i] = uint8_t(i * 7 + 1);

  // The WQE: control, remote address, one data segment (PRM send WQE; rdma-core mlx5 post_send).
  uint8_t w[64] = {};
  p::wqe_raddr_seg::view(w + 16)
      .set(p::wqe_raddr_seg::raddr, uint64_t(uintptr_t(b.buf.data())) + 1024)
      .set(p::wqe_raddr_seg::rkey, b.mr.rkey);
  p::wqe_data_seg::view(w + 32)
      .set(p::wqe_data_seg::byte_count, 4096)
      .set(p::wqe_data_seg::lkey, a.mr.lkey)
      .set(p::wqe_data_seg::addr, uint64_t(uintptr_t(a.buf.data())));
  p::wqe_ctrl_seg::view(w)
      .set(p::wqe_ctrl_seg::opcode, p::wqe_opcode::RDMA_WRITE)
      .set(p::wqe_ctrl_seg::wqe_index, 0)
      .set(p::wqe_ctrl_seg::qpn, a.qp.qpn)
      .set(p::wqe_ctrl_seg::ds, 3)
      .set(p::wqe_ctrl_seg::ce, 2);
  memcpy(a.sq, w, 64);
  p::set(a.qp_dbr, p::qp_dbrec::snd_counter, 1);
  ASSERT_TRUE(dkfake::mmio_store64(ca.port, a.uar_page + a.uar.db_offset, w));

  const uint8_t* e = nullptr;
  uint32_t log_cq = 0;
  while ((1u << log_cq) < a.cq.cqe) log_cq++;
  for (int i = 0; i < 400 && !e; i++) {
    if (p::cqe_sw_owned(a.cqe, 0, log_cq)) e = a.cqe;
    if (!e) usleep(5000);
  }
  ASSERT_NE(e, nullptr) << "no completion in the mapped CQ ring";
  EXPECT_EQ(p::get(e, p::cqe64::opcode), p::cqe_opcode::REQ);
  EXPECT_EQ(p::get(e, p::cqe64::qpn), a.qp.qpn);
  EXPECT_EQ(memcmp(b.buf.data() + 1024, a.buf.data(), 4096), 0) << "the peer's buffer does not hold the data";
  EXPECT_EQ(b.buf[1023], 0);
  EXPECT_EQ(b.buf[1024 + 4096], 0);
  EXPECT_GT(link.frames(), 0u);
}

// A client's UAR mapping is whole 16 KiB task pages of BAR0, and a store anywhere in them reaches
// the card. Those pages must hold no other client's UAR, no EQ's UAR and not the initialization
// segment, whether the card takes 16 KiB UAR pages (max log_uar_page_sz 2) or only 4 KiB ones (0:
// the core then takes every UAR of a host page for one owner). At 842afb3, with 4 KiB UAR pages,
// the EQ's UAR and the second client's shared the first client's page.
class UarIsolation : public DextGlue, public ::testing::WithParamInterface<int> {};

TEST_P(UarIsolation, AClientCannotRingAnotherClientsOrTheEqsDoorbells) {
  dkfake::CardOptions o;
  o.max_log_uar_page_sz = uint8_t(GetParam());
  Driver d(o);
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  Conn ca, cb;
  Side a{ca}, b{cb};
  a.make();
  b.make();
  ASSERT_FALSE(HasFatalFailure());
  long long off_a = dkfake::device_offset_of(ca.port, uint64_t(uintptr_t(a.uar_page)));
  long long off_b = dkfake::device_offset_of(cb.port, uint64_t(uintptr_t(b.uar_page)));
  ASSERT_GE(off_a, 0);
  ASSERT_GE(off_b, 0);
  mlx5::emu::Hca& hca = d.card.device().hca();
  std::vector<uint64_t> foreign = {p::init_seg_offset::cmd_dbell, uint64_t(off_b) + p::kUarCqDoorbell,
                                   uint64_t(off_b) + p::kUarBlueFlame};
  {
    std::lock_guard<std::mutex> l(hca.mu_);
    EXPECT_EQ(hca.uar_page_bytes(), GetParam() >= 2 ? 16384u : 4096u);
    ASSERT_FALSE(hca.eqs_.empty());
    for (auto& [eqn, eq] : hca.eqs_) foreign.push_back(eq.uar * hca.uar_page_bytes() + p::kUarEqArm);
  }
  uint8_t bytes[8] = {};
  for (uint64_t t : foreign) {
    uint8_t* at = a.uar_page + (int64_t(t) - off_a);  // where a's mapping would hold BAR offset t
    EXPECT_FALSE(dkfake::mmio_store64(ca.port, at, bytes)) << "client a reaches BAR0+0x" << std::hex << t;
  }
  // Its own doorbells it reaches: the arm doorbell of its CQ arms the CQ.
  uint8_t arm[8] = {};
  p::set(arm, p::cq_uar_db::cqn, a.cq.cqn);
  EXPECT_TRUE(dkfake::mmio_store64(ca.port, a.uar_page + p::kUarCqDoorbell, arm));
  auto armed = [&] {
    std::lock_guard<std::mutex> l(hca.mu_);
    auto it = hca.cqs_.find(a.cq.cqn);
    return it != hca.cqs_.end() && it->second.arm != mlx5::emu::CqArm::kNone;
  };
  for (int i = 0; i < 2000 && !armed(); i++) usleep(1000);
  EXPECT_TRUE(armed());
}

INSTANTIATE_TEST_SUITE_P(MaxLogUarPageSize, UarIsolation, ::testing::Values(0, 2));

// The host page is the system's (IOVMPageSize), not Apple silicon's 16 KiB: on an Intel Mac (4 KiB)
// a client's UAR is one 4 KiB page, one UAR index, and the core's DMA buffers are 4 KiB multiples.
// At 842afb3 the size was hard-coded: the client got 16 KiB of BAR0 and, with 4 KiB UAR pages, its
// neighbours' doorbells.
TEST_F(DextGlue, HostPageSizeComesFromTheSystem) {
  struct PageSize {
    uint64_t was = IOVMPageSize;
    PageSize() { IOVMPageSize = 4096; }
    ~PageSize() { IOVMPageSize = was; }
  } intel;
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  Conn c;
  Side a{c};
  a.make();
  ASSERT_FALSE(HasFatalFailure());
  mach_vm_address_t addr = 0;
  mach_vm_size_t size = 0;
  ASSERT_EQ(IOConnectMapMemory64(c.port, uapi::map_type(uapi::MapKind::uar, a.uar.handle), mach_task_self(), &addr,
                                 &size, kIOMapAnywhere),
            kIOReturnSuccess);
  EXPECT_EQ(size, 4096u);
  long long off = dkfake::device_offset_of(c.port, addr);
  {
    mlx5::emu::Hca& hca = d.card.device().hca();
    std::lock_guard<std::mutex> l(hca.mu_);
    EXPECT_EQ(hca.uar_page_bytes(), 4096u);  // the core asked for 4 KiB UAR pages
  }
  // The next 4 KiB of BAR0 is not the client's to store to.
  uint8_t bytes[8] = {};
  EXPECT_FALSE(dkfake::mmio_store64(c.port, reinterpret_cast<uint8_t*>(addr) + 4096 + 0x20, bytes)) << off;
  EXPECT_TRUE(dkfake::mmio_store64(c.port, reinterpret_cast<uint8_t*>(addr) + 0x20, bytes));
}

// Bad input at the boundary, through the glue: random selectors (known and not), random lengths and
// bytes, handles taken from earlier answers, random mapping types. Every answer must be one of the
// server's statuses (or the glue's own refusal of an oversized structure), nothing may crash, and
// the client's death must leave nothing behind.
TEST_F(DextGlue, RandomRequestsGetKnownAnswersAndDeathCleansUp) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    std::vector<uint8_t> mem(64 * 1024);
    {
      Conn c;
      ASSERT_EQ(c.open(), Status::ok);
      std::mt19937 rng(13);
      struct Sel {
        uint32_t value, req;
      };
      std::vector<Sel> sels;
#define MELON_SEL(name, value, req, resp) \
  if (value != uint32_t(Selector::close)) sels.push_back({value, uapi::wire_size<uapi::req>});  // Close ends it
      MELON_UAPI_SELECTORS(MELON_SEL)
#undef MELON_SEL
      std::vector<uint32_t> handles{0};
      uint32_t answers[32] = {};
      for (int i = 0; i < 3000; i++) {
        Sel pick = sels[rng() % sels.size()];
        uint32_t sel = rng() % 8 ? pick.value : uint32_t(rng());
        uint8_t in[96];
        for (auto& b : in) b = uint8_t(rng());
        // Mostly plausible shapes: small reserved fields, real handles, the client's own memory.
        uint32_t* w = reinterpret_cast<uint32_t*>(in);
        for (int k = 0; k < 24; k++)
          if (rng() % 3) w[k] = rng() % 2 ? handles[rng() % handles.size()] : rng() % 64;
        if (sel == uint32_t(Selector::reg_mr) && rng() % 2) {
          uapi::RegMrReq mr{handles[rng() % handles.size()], uint32_t(rng() % 16), uint64_t(uintptr_t(mem.data())),
                            uint64_t(rng() % mem.size()) + 1};
          memcpy(in, &mr, sizeof mr);
        }
        size_t len = rng() % 4 ? pick.req : rng() % 97;  // mostly the request's own size
        uint8_t out[256];
        size_t out_len = rng() % 4 ? sizeof out : rng() % 64;
        kern_return_t kr = c.raw(sel, len ? in : nullptr, len, out, &out_len);
        Status st;
        ASSERT_TRUE(uapi::iokit::status_of_return(kr, &st)) << std::hex << kr << " selector " << sel;
        ASSERT_LT(uint32_t(st), 32u);
        answers[uint32_t(st)]++;
        if (st == Status::ok && out_len >= 4) handles.push_back(*reinterpret_cast<uint32_t*>(out));
        if (rng() % 16 == 0) {
          mach_vm_address_t addr = 0;
          mach_vm_size_t size = 0;
          uint32_t type = uapi::map_type(uapi::MapKind(rng() % 7), handles[rng() % handles.size()]);
          kr = IOConnectMapMemory64(c.port, rng() % 8 ? type : uint32_t(rng()), mach_task_self(), &addr, &size,
                                    kIOMapAnywhere);
          ASSERT_TRUE(kr == kIOReturnSuccess || uapi::iokit::status_of_return(kr, &st)) << std::hex << kr;
        }
      }
      std::string hist;
      for (uint32_t k = 0; k < 32; k++)
        if (answers[k]) hist += std::string(uapi::status_name(Status(k))) + "=" + std::to_string(answers[k]) + " ";
      EXPECT_GT(answers[uint32_t(Status::ok)], 50u) << "the sequence never got far: " << hist;
      EXPECT_GT(answers[uint32_t(Status::bad_handle)] + answers[uint32_t(Status::invalid)], 50u) << hist;
      dkfake::kill_connection(c.port);
      c.port = IO_OBJECT_NULL;
      auto* p = parts(d.service);
      for (auto k : {mlx5::core::ObjKind::qp, mlx5::core::ObjKind::cq, mlx5::core::ObjKind::mr, mlx5::core::ObjKind::pd,
                     mlx5::core::ObjKind::uar, mlx5::core::ObjKind::srq})
        EXPECT_EQ(p->dev->hca().live(k), 0u) << int(k);
      EXPECT_EQ(p->queues->live(), 0u);
    }
    EXPECT_EQ(d.stop(), kIOReturnSuccess);
    EXPECT_EQ(d.card.host().mapped_bytes(), 0u);
  }
  expect_same(before, Ledger{});
}

}  // namespace
}  // namespace melon::dktest
