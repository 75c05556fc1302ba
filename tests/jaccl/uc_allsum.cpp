// A two-rank all_sum that uses verbs the way MLX's JACCL does (ml-explore/mlx, distributed/jaccl;
// facts from its source, not its code): the library is dlopen()ed and 16 ibv_* functions looked up;
// the data path is verbs.h's inline functions; UC QPs, depth 32, one SGE, MTU 1024, sq_psn 7; the
// first IPv4-mapped GID published but sgid_index 1 used; two send and two receive buffers per size,
// a send re-posted as soon as the previous one on its buffer completes, whether or not the peer
// has re-posted its receive. Over spec UC that loses messages and the ranks fall out of step; with
// reliable UC (MELON_UC_RELIABLE) every sum comes out right. Exit 0: every element verified;
// 3: stalled (a message lost); 4: a wrong sum (out of step); 1: setup failed.
//
//   uc_allsum --rank 0 --dev NAME --addr IP:PORT [--bytes N] [--rounds K]   (rank 0 listens)
//   uc_allsum --rank 1 --dev NAME --addr IP:PORT ...                         (rank 1 connects)
#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDepth = 32;
constexpr int kBuffers = 2;  // per direction, as JACCL's NUM_BUFFERS
constexpr size_t kFrame = 4096;
constexpr int kSizes = 8;  // buffer sizes kFrame << 0..7, as JACCL's BUFFER_SIZES

// The functions JACCL looks up (its IBVWrapper), by name.
struct Ibv {
  ibv_device** (*get_device_list)(int*);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  void (*free_device_list)(ibv_device**);
  int (*close_device)(ibv_context*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  int (*destroy_qp)(ibv_qp*);
  int (*dealloc_pd)(ibv_pd*);
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
};

[[noreturn]] void die(int code, const char* what) {
  std::fprintf(stderr, "uc_allsum: %s%s%s\n", what, errno ? ": " : "", errno ? std::strerror(errno) : "");
  std::exit(code);
}

bool load(Ibv* f) {
  const char* lib = std::getenv("MELON_UC_ALLSUM_LIB");
  void* h = dlopen(lib ? lib : "libibverbs.so.1", RTLD_NOW);
  if (!h) return std::fprintf(stderr, "uc_allsum: %s\n", dlerror()), false;
  struct {
    void** slot;
    const char* name;
  } syms[] = {{reinterpret_cast<void**>(&f->get_device_list), "ibv_get_device_list"},
              {reinterpret_cast<void**>(&f->get_device_name), "ibv_get_device_name"},
              {reinterpret_cast<void**>(&f->open_device), "ibv_open_device"},
              {reinterpret_cast<void**>(&f->free_device_list), "ibv_free_device_list"},
              {reinterpret_cast<void**>(&f->close_device), "ibv_close_device"},
              {reinterpret_cast<void**>(&f->alloc_pd), "ibv_alloc_pd"},
              {reinterpret_cast<void**>(&f->create_qp), "ibv_create_qp"},
              {reinterpret_cast<void**>(&f->create_cq), "ibv_create_cq"},
              {reinterpret_cast<void**>(&f->destroy_cq), "ibv_destroy_cq"},
              {reinterpret_cast<void**>(&f->destroy_qp), "ibv_destroy_qp"},
              {reinterpret_cast<void**>(&f->dealloc_pd), "ibv_dealloc_pd"},
              {reinterpret_cast<void**>(&f->query_port), "ibv_query_port"},
              {reinterpret_cast<void**>(&f->query_gid), "ibv_query_gid"},
              {reinterpret_cast<void**>(&f->modify_qp), "ibv_modify_qp"},
              {reinterpret_cast<void**>(&f->reg_mr), "ibv_reg_mr"},
              {reinterpret_cast<void**>(&f->dereg_mr), "ibv_dereg_mr"}};
  for (auto& s : syms)
    if (!(*s.slot = dlsym(h, s.name))) return std::fprintf(stderr, "uc_allsum: no %s\n", s.name), false;
  return true;
}

// What the ranks exchange over TCP (JACCL's Destination).
struct Dest {
  int32_t lid;
  int32_t qpn;
  int32_t psn;
  uint8_t gid[16];
};

int side_channel(int rank, const std::string& addr) {
  size_t colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(std::atoi(addr.c_str() + colon + 1)));
  if (colon == std::string::npos || inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr) != 1)
    die(1, "--addr wants IPv4:port");
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (rank == 0) {
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa) || listen(s, 1)) die(1, "listen");
    int c = accept(s, nullptr, nullptr);
    close(s);
    return c;
  }
  for (auto end = Clock::now() + std::chrono::seconds(20); Clock::now() < end; usleep(20000)) {
    if (connect(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return s;
    close(s);
    s = socket(AF_INET, SOCK_STREAM, 0);
  }
  die(1, "connect");
}

void exchange(int fd, const void* out, void* in, size_t n) {
  if (write(fd, out, n) != ssize_t(n)) die(1, "side channel write");
  for (size_t got = 0; got < n;) {
    ssize_t r = read(fd, static_cast<char*>(in) + got, n - got);
    if (r <= 0) die(1, "side channel read");
    got += size_t(r);
  }
}

struct Buffer {
  std::vector<float> mem;
  ibv_mr* mr = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, rounds = 3;
  size_t bytes = 1 << 20;
  std::string dev_name, addr;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--rank")
      rank = std::atoi(argv[i + 1]);
    else if (k == "--dev")
      dev_name = argv[i + 1];
    else if (k == "--addr")
      addr = argv[i + 1];
    else if (k == "--bytes")
      bytes = std::strtoull(argv[i + 1], nullptr, 0);
    else if (k == "--rounds")
      rounds = std::atoi(argv[i + 1]);
  }
  if ((rank != 0 && rank != 1) || dev_name.empty() || addr.empty() || bytes < 4 || bytes % 4) die(1, "bad arguments");
  Ibv ibv;
  if (!load(&ibv)) return 1;

  int n = 0;
  ibv_device** list = ibv.get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && !ctx; i++)
    if (dev_name == ibv.get_device_name(list[i])) ctx = ibv.open_device(list[i]);
  ibv.free_device_list(list);
  if (!ctx) die(1, "no such device");
  ibv_port_attr port;
  if (ibv.query_port(ctx, 1, &port)) die(1, "query_port");
  ibv_pd* pd = ibv.alloc_pd(ctx);
  ibv_cq* cq = ibv.create_cq(ctx, 2 * kDepth, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = kDepth;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = pd && cq ? ibv.create_qp(pd, &ia) : nullptr;
  if (!qp) die(1, "create_qp");

  // Two send and two receive buffers of every size (JACCL's 64 MRs for a peer pair, near enough),
  // then the size this message uses: the largest frame multiple it fills.
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  std::vector<Buffer> send_buf(kSizes * kBuffers), recv_buf(kSizes * kBuffers);
  for (int i = 0; i < kSizes * kBuffers; i++)
    for (Buffer* b : {&send_buf[i], &recv_buf[i]}) {
      b->mem.assign((kFrame << (i / kBuffers)) / 4, 0.f);
      if (!(b->mr = ibv.reg_mr(pd, b->mem.data(), b->mem.size() * 4, acc))) die(1, "reg_mr");
    }
  int k = kSizes - 1;
  while (k > 0 && bytes < (kFrame << k)) k--;
  const size_t chunk = kFrame << k;

  // Publish the first IPv4-mapped GID; connect with sgid_index 1 (JACCL's mismatch, mlx#3467).
  Dest me{port.lid, int32_t(qp->qp_num), 7, {}}, peer;
  for (int i = 0; i < port.gid_tbl_len; i++) {
    ibv_gid g;
    static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (ibv.query_gid(ctx, 1, i, &g) == 0 && !std::memcmp(g.raw, v4, 12)) {
      std::memcpy(me.gid, g.raw, 16);
      break;
    }
  }
  int fd = side_channel(rank, addr);
  exchange(fd, &me, &peer, sizeof me);

  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.qp_access_flags = acc;
  if (ibv.modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die(1, "INIT");
  at = {};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = IBV_MTU_1024;
  at.dest_qp_num = uint32_t(peer.qpn);
  at.rq_psn = uint32_t(peer.psn);
  at.ah_attr.is_global = 1;
  at.ah_attr.port_num = 1;
  at.ah_attr.grh.sgid_index = 1;
  at.ah_attr.grh.hop_limit = 1;
  std::memcpy(at.ah_attr.grh.dgid.raw, peer.gid, 16);
  if (ibv.modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
    die(1, "RTR");
  at = {};
  at.qp_state = IBV_QPS_RTS;
  at.sq_psn = uint32_t(me.psn);
  if (ibv.modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN)) die(1, "RTS");

  // Rank r contributes (r + 1) * (i % 4093): sums stay exact in float.
  const size_t elems = bytes / 4, per = chunk / 4, nchunks = (elems + per - 1) / per;
  std::vector<float> in(elems), out(elems);
  for (size_t i = 0; i < elems; i++) in[i] = float((rank + 1) * (i % 4093));
  Buffer* sb = &send_buf[k * kBuffers];
  Buffer* rb = &recv_buf[k * kBuffers];
  auto post_send = [&](size_t c) {
    Buffer& b = sb[c % kBuffers];
    size_t len = std::min(per, elems - c * per);
    std::memcpy(b.mem.data(), in.data() + c * per, len * 4);
    ibv_sge sge{reinterpret_cast<uintptr_t>(b.mem.data()), uint32_t(len * 4), b.mr->lkey};
    ibv_send_wr wr{}, *bad;
    wr.wr_id = (uint64_t(1) << 32) | c;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(qp, &wr, &bad)) die(1, "post_send");
  };
  auto post_recv = [&](size_t c) {
    Buffer& b = rb[c % kBuffers];
    ibv_sge sge{reinterpret_cast<uintptr_t>(b.mem.data()), uint32_t(chunk), b.mr->lkey};
    ibv_recv_wr wr{}, *bad;
    wr.wr_id = c;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(qp, &wr, &bad)) die(1, "post_recv");
  };

  int status = 0;
  double total_s = 0;
  for (int round = 0; round < rounds && !status; round++) {
    // Both ranks post their receives, then meet, so no first message can beat its receive.
    for (size_t c = 0; c < std::min<size_t>(kBuffers, nchunks); c++) post_recv(c);
    char x = 0, y;
    exchange(fd, &x, &y, 1);
    auto t0 = Clock::now();
    size_t sent = 0, send_done = 0, recvd = 0;
    for (; sent < std::min<size_t>(kBuffers, nchunks); sent++) post_send(sent);
    auto last = Clock::now();
    while ((send_done < nchunks || recvd < nchunks) && !status) {
      ibv_wc wc[8];
      int got = ibv_poll_cq(cq, 8, wc);
      if (got < 0) die(1, "poll_cq");
      if (got == 0) {
        if (Clock::now() - last > std::chrono::seconds(5)) status = 3;
        continue;
      }
      last = Clock::now();
      for (int i = 0; i < got && !status; i++) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          std::fprintf(stderr, "uc_allsum: completion status %d\n", int(wc[i].status));
          status = 1;
        } else if (wc[i].wr_id >> 32) {  // a send done: its buffer takes the next chunk at once
          send_done++;
          if (sent < nchunks) post_send(sent++);
        } else {  // a chunk in: add it, then give its buffer back to the peer
          size_t c = wc[i].wr_id;
          const float* r = rb[c % kBuffers].mem.data();
          size_t len = std::min(per, elems - c * per);
          if (wc[i].byte_len != len * 4) status = 4;
          for (size_t j = 0; j < len; j++) out[c * per + j] = in[c * per + j] + r[j];
          recvd++;
          if (c + kBuffers < nchunks) post_recv(c + kBuffers);
        }
      }
    }
    total_s += std::chrono::duration<double>(Clock::now() - t0).count();
    if (status == 3) {
      std::fprintf(stderr,
                   "uc_allsum: round %d stalled: %zu of %zu chunks in, %zu of %zu sends done (a lost message)\n", round,
                   recvd, nchunks, send_done, nchunks);
      break;
    }
    for (size_t i = 0; i < elems && !status; i++)
      if (out[i] != float(3 * (i % 4093))) {
        std::fprintf(stderr, "uc_allsum: round %d: element %zu is %g, not %g (out of step)\n", round, i, out[i],
                     double(3 * (i % 4093)));
        status = 4;
      }
    exchange(fd, &x, &y, 1);  // the peer has drained too before the next round posts
  }
  if (!status)
    std::printf("uc_allsum: rank %d %s %zu bytes x %d rounds verified, chunk %zu, %.2f Gbit/s\n", rank,
                dev_name.c_str(), bytes, rounds, chunk, 8.0 * bytes * rounds / total_s / 1e9);
  close(fd);
  for (auto* v : {&send_buf, &recv_buf})
    for (Buffer& b : *v) ibv.dereg_mr(b.mr);
  ibv.destroy_qp(qp);
  ibv.destroy_cq(cq);
  ibv.dealloc_pd(pd);
  ibv.close_device(ctx);
  return status;
}
