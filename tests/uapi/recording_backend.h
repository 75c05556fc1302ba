// A uapi::Backend that records every call (the "firmware commands") and keeps its own view of the
// objects, so tests can prove that a refused request reached no backend call and that cleanup
// never destroys an object before its dependents.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "uapi/backend.h"

namespace melon::uapi::test {

class RecordingBackend final : public Backend {
 public:
  struct Obj {
    std::string kind;
    std::vector<Obj*> parents;
    int children = 0;
    bool live = true;
  };

  std::vector<std::string> calls;
  std::vector<std::string> violations;  // destroyed with live children, double destroy, ...
  Status fail_next = Status::ok;  // the next creating call fails with this
  uint32_t next_id = 0x100;
  std::vector<Transition> transitions;

  int live(const std::string& kind) const {
    int n = 0;
    for (auto& o : objs_)
      if (o->live && o->kind == kind) n++;
    return n;
  }
  int live_total() const {
    int n = 0;
    for (auto& o : objs_) n += o->live;
    return n;
  }
  // Drops the records of destroyed objects (a long-lived backend, as a fuzz target's, stays small).
  void forget_dead() {
    std::vector<std::unique_ptr<Obj>> keep;
    for (auto& o : objs_)
      if (o->live) keep.push_back(std::move(o));
    objs_ = std::move(keep);
  }

  Status query_device(DeviceAttr* a) override {
    calls.push_back("query_device");
    a->vendor_id = 0x02c9;
    a->vendor_part_id = 4117;
    return Status::ok;
  }
  Status query_port(uint32_t port, PortAttr* a) override {
    calls.push_back("query_port");
    a->state = 4;
    a->active_mtu = 3;
    (void)port;
    return Status::ok;
  }
  Status query_gid(uint32_t, uint32_t index, GidResp* g) override {
    calls.push_back("query_gid");
    g->gid[15] = uint8_t(index);
    g->valid = 1;
    g->roce_version = 2;
    return Status::ok;
  }
  Status alloc_pd(void** pd) override { return make("pd", {}, pd); }
  Status dealloc_pd(void* o) override { return destroy("pd", o); }
  Status alloc_uar(Created* c, UarResp* r) override {
    Status s = make("uar", {}, &c->obj);
    if (s != Status::ok) return s;
    c->maps[0] = MapRegion{uint8_t(MapKind::uar), kMapWriteCombine, 7, 0x4000 * next_id, 4096};
    r->page_bytes = 4096;
    r->db_offset = 0x800;
    r->bf_bytes = 256;
    return s;
  }
  Status free_uar(void* o) override { return destroy("uar", o); }
  Status reg_mr(void* host, void* pd, const RegMrReq&, void** mr, RegMrResp* r) override {
    last_host = host;
    Status s = make("mr", {pd}, mr);
    r->lkey = r->rkey = next_id << 8;
    return s;
  }
  Status dereg_mr(void* o) override { return destroy("mr", o); }
  Status create_cq(const CqSpec& spec, Created* c, CreateCqResp* r) override {
    Status s = make("cq", {spec.uar}, &c->obj);
    if (s != Status::ok) return s;
    last_cq = spec;
    r->cqn = next_id;
    r->cqe = 1u << spec.log_size;
    r->cqe_bytes = 64;
    c->maps[0] = MapRegion{uint8_t(MapKind::cqe), 0, 9, 0, 64ull << spec.log_size};
    c->maps[1] = MapRegion{uint8_t(MapKind::db_record), 0, 9, 64ull << spec.log_size, 64};
    return s;
  }
  Status destroy_cq(void* o) override { return destroy("cq", o); }
  uint32_t last_resize_log = 0;
  Status resize_cq(void*, uint32_t log_size, MapRegion* ring, ResizeCqResp* r) override {
    calls.push_back("resize_cq");
    if (Status s = take_fail(); s != Status::ok) return s;
    last_resize_log = log_size;
    *ring = MapRegion{uint8_t(MapKind::cqe), 0, 12, 0, 64ull << log_size};
    r->cqe = 1u << log_size;
    r->cqe_bytes = 64;
    return Status::ok;
  }
  Status create_srq(const SrqSpec& spec, Created* c, CreateSrqResp* r) override {
    Status s = make("srq", {spec.pd}, &c->obj);
    if (s != Status::ok) return s;
    r->wqe_cnt = 1u << spec.log_size;
    r->stride = 1u << spec.log_stride;
    c->maps[0] = MapRegion{uint8_t(MapKind::rq), 0, 10, 0, uint64_t(r->wqe_cnt) * r->stride};
    return s;
  }
  Status modify_srq(void*, uint32_t) override {
    calls.push_back("modify_srq");
    return fail_modify_srq;
  }
  Status fail_modify_srq = Status::ok;  // what every modify_srq (arming the limit) answers
  Status destroy_srq(void* o) override { return destroy("srq", o); }
  Status create_qp(const QpSpec& spec, Created* c, CreateQpResp* r) override {
    std::vector<void*> parents{spec.pd, spec.send_cq, spec.recv_cq, spec.uar};
    if (spec.srq) parents.push_back(spec.srq);
    Status s = make("qp", parents, &c->obj);
    if (s != Status::ok) return s;
    last_qp = spec;
    r->qpn = next_id;
    r->sq_wqe_cnt = 1u << spec.log_sq_size;
    c->maps[0] = MapRegion{uint8_t(MapKind::sq), 0, 11, 0, 64ull << spec.log_sq_size};
    return s;
  }
  Status modify_qp(void*, Transition t, const ModifyQpReq&) override {
    calls.push_back("modify_qp");
    transitions.push_back(t);
    return take_fail();
  }
  Status query_qp(void*, QpAttr* a) override {
    calls.push_back("query_qp");
    a->state = query_state;
    return Status::ok;
  }
  Status destroy_qp(void* o) override { return destroy("qp", o); }
  Status make_av(const AddressReq& av, uint8_t* out) override {
    out[0] = av.dgid[15];
    return Status::ok;
  }

  void* last_host = nullptr;
  CqSpec last_cq{};
  QpSpec last_qp{};
  uint8_t query_state = 0;

 private:
  Status take_fail() {
    Status s = fail_next;
    fail_next = Status::ok;
    return s;
  }
  Status make(const std::string& kind, std::vector<void*> parents, void** out) {
    calls.push_back("create_" + kind);
    if (Status s = take_fail(); s != Status::ok) return s;
    auto o = std::make_unique<Obj>();
    o->kind = kind;
    for (void* p : parents) {
      Obj* po = static_cast<Obj*>(p);
      if (!po || !po->live)
        violations.push_back(kind + " created on a dead parent");
      else {
        po->children++;
        o->parents.push_back(po);
      }
    }
    *out = o.get();
    objs_.push_back(std::move(o));
    next_id++;
    return Status::ok;
  }
  Status destroy(const std::string& kind, void* p) {
    calls.push_back("destroy_" + kind);
    Obj* o = static_cast<Obj*>(p);
    if (!o || !o->live || o->kind != kind) {
      violations.push_back("destroy_" + kind + " of a dead or wrong object");
      return Status::invalid;
    }
    if (o->children) violations.push_back("destroy_" + kind + " with live dependents");
    o->live = false;
    for (Obj* par : o->parents) par->children--;
    return Status::ok;
  }
  std::vector<std::unique_ptr<Obj>> objs_;
};

}  // namespace melon::uapi::test
