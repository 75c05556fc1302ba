// Every function libibverbs.so.1 exports to applications (rdma-core v44's IBVERBS_1.* nodes,
// src/abi/v44/libibverbs.so.1.syms, less the omissions listed beside it), called through the shared library with a NULL object or a
// zero length where one matters: it must return its error (EINVAL, or the documented failure
// value: -1 for ibv_query_gid and ibv_query_pkey, as rdma-core's) and must not crash. Each call runs in a child process, so a SIGSEGV fails its own row.
// Users' crash reports name ibv_reg_mr_iova2 with a null PD (exo#2186, mlx#4485).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include "abi/gen/ibverbs_prototypes.h"  // the exports rdma-core declares outside verbs.h
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <functional>
#include <set>
#include <sstream>
#include <string>

namespace {

void* lib() {
  static void* h = [] {
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    setenv("MELON_SOFT_DEVICES", "bad0=127.0.0.2", 1);
    return dlopen(MELON_SHARED_LIB_DIR "/libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  }();
  return h;
}

// The symbol as the shared library exports it, with our header's prototype.
void* lookup(const char* name) { return dlsym(lib(), name); }
template <class F>
F* sym(const char* name) {
  return reinterpret_cast<F*>(lookup(name));
}
#define CALL(fn, ...) sym<decltype(fn)>(#fn)(__VA_ARGS__)

// A row's verdict, from the child: "" when the function answered as it must, else what it did.
using Row = std::function<std::string()>;
std::string expect_rc(int got, int want) {
  return got == want ? "" : "returned " + std::to_string(got) + ", not " + std::to_string(want);
}
std::string expect_fail(const void* p, int want_errno) {
  if (p) return "returned an object";
  return errno == want_errno ? "" : std::string("errno ") + strerror(errno) + ", not " + strerror(want_errno);
}
std::string expect_neg(long got, int want_errno) {
  if (got >= 0) return "returned " + std::to_string(got);
  return errno == want_errno ? "" : std::string("errno ") + strerror(errno);
}

char buf[64];
ibv_wc wc;
ibv_grh grh;
ibv_ah_attr ah_attr;
ibv_qp_attr qp_attr;
ibv_qp_init_attr qp_init;
ibv_srq_attr srq_attr;
ibv_srq_init_attr srq_init;
ibv_port_attr port_attr;
ibv_device_attr dev_attr;
ibv_gid_entry gid_entry;
ibv_ece ece;
ibv_async_event async_ev;
union ibv_gid gid;
uint16_t pkey;
uint8_t mac[6];

// Every public export, with what a NULL (or empty) argument must give.
const std::pair<const char*, Row> kRows[] = {
    {"ibv_get_device_list", [] { return expect_rc(0, 0); }},  // NULL count is allowed; see the test below
    {"ibv_free_device_list",
     [] {
       CALL(ibv_free_device_list, nullptr);
       return std::string();
     }},
    {"ibv_get_device_name", [] { return CALL(ibv_get_device_name, nullptr) ? "a name" : ""; }},
    {"ibv_get_device_guid",
     [] {
       errno = 0;
       return expect_rc(int(CALL(ibv_get_device_guid, nullptr)), 0) + (errno == EINVAL ? "" : "errno");
     }},
    {"ibv_get_device_index", [] { return expect_rc(CALL(ibv_get_device_index, nullptr), -1); }},
    {"ibv_open_device", [] { return expect_fail(CALL(ibv_open_device, nullptr), ENODEV); }},
    {"ibv_close_device", [] { return expect_rc(CALL(ibv_close_device, nullptr), EINVAL); }},
    {"ibv_import_device", [] { return expect_fail(CALL(ibv_import_device, -1), EBADF); }},
    {"ibv_query_device", [] { return expect_rc(CALL(ibv_query_device, nullptr, &dev_attr), EINVAL); }},
    {"ibv_query_port",
     [] {
       return expect_rc(CALL(ibv_query_port, nullptr, 1, reinterpret_cast<_compat_ibv_port_attr*>(&port_attr)), EINVAL);
     }},
    {"ibv_query_gid", [] { return expect_rc(CALL(ibv_query_gid, nullptr, 1, 0, &gid), -1); }},
    {"_ibv_query_gid_ex",
     [] { return expect_rc(CALL(_ibv_query_gid_ex, nullptr, 1, 0, &gid_entry, 0, sizeof gid_entry), EINVAL); }},
    {"_ibv_query_gid_table",
     [] { return expect_rc(int(CALL(_ibv_query_gid_table, nullptr, &gid_entry, 1, 0, sizeof gid_entry)), -EINVAL); }},
    {"ibv_query_pkey", [] { return expect_rc(CALL(ibv_query_pkey, nullptr, 1, 0, &pkey), -1); }},
    {"ibv_get_pkey_index", [] { return expect_rc(CALL(ibv_get_pkey_index, nullptr, 1, 0xffff), -EINVAL); }},
    {"ibv_alloc_pd", [] { return expect_fail(CALL(ibv_alloc_pd, nullptr), EINVAL); }},
    {"ibv_dealloc_pd", [] { return expect_rc(CALL(ibv_dealloc_pd, nullptr), EINVAL); }},
    {"ibv_import_pd", [] { return expect_fail(CALL(ibv_import_pd, nullptr, 1), EINVAL); }},
    {"ibv_unimport_pd",
     [] {
       CALL(ibv_unimport_pd, nullptr);
       return std::string();
     }},
    {"ibv_reg_mr", [] { return expect_fail(CALL(ibv_reg_mr, nullptr, buf, sizeof buf, 0), EINVAL); }},
    {"ibv_reg_mr_iova", [] { return expect_fail(CALL(ibv_reg_mr_iova, nullptr, buf, sizeof buf, 0, 0), EINVAL); }},
    {"ibv_reg_mr_iova2", [] { return expect_fail(CALL(ibv_reg_mr_iova2, nullptr, buf, sizeof buf, 0, 0), EINVAL); }},
    {"ibv_reg_dmabuf_mr",
     [] { return expect_fail(CALL(ibv_reg_dmabuf_mr, nullptr, 0, sizeof buf, 0, -1, 0), EINVAL); }},
    {"ibv_rereg_mr",
     [] {
       return expect_rc(CALL(ibv_rereg_mr, nullptr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0),
                        IBV_REREG_MR_ERR_INPUT);
     }},
    {"ibv_dereg_mr", [] { return expect_rc(CALL(ibv_dereg_mr, nullptr), EINVAL); }},
    {"ibv_import_mr", [] { return expect_fail(CALL(ibv_import_mr, nullptr, 1), EINVAL); }},
    {"ibv_unimport_mr",
     [] {
       CALL(ibv_unimport_mr, nullptr);
       return std::string();
     }},
    {"ibv_import_dm", [] { return expect_fail(CALL(ibv_import_dm, nullptr, 1), EINVAL); }},
    {"ibv_unimport_dm",
     [] {
       CALL(ibv_unimport_dm, nullptr);
       return std::string();
     }},
    {"ibv_create_comp_channel", [] { return expect_fail(CALL(ibv_create_comp_channel, nullptr), EINVAL); }},
    {"ibv_destroy_comp_channel", [] { return expect_rc(CALL(ibv_destroy_comp_channel, nullptr), EINVAL); }},
    {"ibv_create_cq", [] { return expect_fail(CALL(ibv_create_cq, nullptr, 1, nullptr, nullptr, 0), EINVAL); }},
    {"ibv_resize_cq", [] { return expect_rc(CALL(ibv_resize_cq, nullptr, 1), EINVAL); }},
    {"ibv_destroy_cq", [] { return expect_rc(CALL(ibv_destroy_cq, nullptr), EINVAL); }},
    {"ibv_get_cq_event",
     [] {
       ibv_cq* cq;
       void* c;
       return expect_neg(CALL(ibv_get_cq_event, nullptr, &cq, &c), EINVAL);
     }},
    {"ibv_ack_cq_events",
     [] {
       CALL(ibv_ack_cq_events, nullptr, 1);
       return std::string();
     }},
    {"ibv_get_async_event", [] { return expect_neg(CALL(ibv_get_async_event, nullptr, &async_ev), EINVAL); }},
    {"ibv_ack_async_event",
     [] {
       CALL(ibv_ack_async_event, nullptr);
       return std::string();
     }},
    {"ibv_create_srq", [] { return expect_fail(CALL(ibv_create_srq, nullptr, &srq_init), EINVAL); }},
    {"ibv_modify_srq", [] { return expect_rc(CALL(ibv_modify_srq, nullptr, &srq_attr, IBV_SRQ_LIMIT), EINVAL); }},
    {"ibv_query_srq", [] { return expect_rc(CALL(ibv_query_srq, nullptr, &srq_attr), EINVAL); }},
    {"ibv_destroy_srq", [] { return expect_rc(CALL(ibv_destroy_srq, nullptr), EINVAL); }},
    {"ibv_create_qp", [] { return expect_fail(CALL(ibv_create_qp, nullptr, &qp_init), EINVAL); }},
    {"ibv_modify_qp", [] { return expect_rc(CALL(ibv_modify_qp, nullptr, &qp_attr, IBV_QP_STATE), EINVAL); }},
    {"ibv_query_qp", [] { return expect_rc(CALL(ibv_query_qp, nullptr, &qp_attr, IBV_QP_STATE, &qp_init), EINVAL); }},
    {"ibv_destroy_qp", [] { return expect_rc(CALL(ibv_destroy_qp, nullptr), EINVAL); }},
    {"ibv_qp_to_qp_ex", [] { return expect_fail(CALL(ibv_qp_to_qp_ex, nullptr), EINVAL); }},
    {"ibv_query_qp_data_in_order",
     [] { return expect_rc(CALL(ibv_query_qp_data_in_order, nullptr, IBV_WR_SEND, 0), 0); }},
    {"ibv_set_ece", [] { return expect_rc(CALL(ibv_set_ece, nullptr, &ece), EINVAL); }},
    {"ibv_query_ece", [] { return expect_rc(CALL(ibv_query_ece, nullptr, &ece), EINVAL); }},
    {"ibv_attach_mcast", [] { return expect_rc(CALL(ibv_attach_mcast, nullptr, &gid, 0), EINVAL); }},
    {"ibv_detach_mcast", [] { return expect_rc(CALL(ibv_detach_mcast, nullptr, &gid, 0), EINVAL); }},
    {"ibv_create_ah", [] { return expect_fail(CALL(ibv_create_ah, nullptr, &ah_attr), EINVAL); }},
    {"ibv_destroy_ah", [] { return expect_rc(CALL(ibv_destroy_ah, nullptr), EINVAL); }},
    {"ibv_init_ah_from_wc",
     [] { return expect_rc(CALL(ibv_init_ah_from_wc, nullptr, 1, &wc, &grh, &ah_attr), EINVAL); }},
    {"ibv_create_ah_from_wc", [] { return expect_fail(CALL(ibv_create_ah_from_wc, nullptr, &wc, &grh, 1), EINVAL); }},
    {"ibv_resolve_eth_l2_from_gid",
     [] { return expect_rc(CALL(ibv_resolve_eth_l2_from_gid, nullptr, &ah_attr, mac, nullptr), EINVAL); }},
    {"ibv_copy_ah_attr_from_kern",
     [] {
       CALL(ibv_copy_ah_attr_from_kern, nullptr, nullptr);
       return std::string();
     }},
    {"ibv_copy_qp_attr_from_kern",
     [] {
       CALL(ibv_copy_qp_attr_from_kern, nullptr, nullptr);
       return std::string();
     }},
    {"ibv_copy_path_rec_from_kern",
     [] {
       CALL(ibv_copy_path_rec_from_kern, nullptr, nullptr);
       return std::string();
     }},
    {"ibv_copy_path_rec_to_kern",
     [] {
       CALL(ibv_copy_path_rec_to_kern, nullptr, nullptr);
       return std::string();
     }},
    {"ibv_read_sysfs_file", [] { return expect_rc(CALL(ibv_read_sysfs_file, nullptr, nullptr, buf, sizeof buf), -1); }},
    {"ibv_get_sysfs_path", [] { return CALL(ibv_get_sysfs_path) ? "" : "NULL"; }},
    {"ibv_fork_init", [] { return std::string(); }},  // no object argument (called by the test below)
    {"ibv_is_fork_initialized", [] { return std::string(); }},
    {"ibv_dontfork_range", [] { return expect_rc(CALL(ibv_dontfork_range, nullptr, 0), 0); }},
    {"ibv_dofork_range", [] { return expect_rc(CALL(ibv_dofork_range, nullptr, 0), 0); }},
    {"ibv_wc_status_str", [] { return CALL(ibv_wc_status_str, ibv_wc_status(-1)) ? "" : "NULL"; }},
    {"ibv_event_type_str", [] { return CALL(ibv_event_type_str, ibv_event_type(-1)) ? "" : "NULL"; }},
    {"ibv_node_type_str", [] { return CALL(ibv_node_type_str, ibv_node_type(-5)) ? "" : "NULL"; }},
    {"ibv_port_state_str", [] { return CALL(ibv_port_state_str, ibv_port_state(-1)) ? "" : "NULL"; }},
    {"ibv_rate_to_mult", [] { return expect_rc(CALL(ibv_rate_to_mult, ibv_rate(-1)), -1); }},
    {"mult_to_ibv_rate", [] { return expect_rc(CALL(mult_to_ibv_rate, -1), IBV_RATE_MAX); }},
    {"ibv_rate_to_mbps", [] { return expect_rc(CALL(ibv_rate_to_mbps, ibv_rate(-1)), -1); }},
    {"mbps_to_ibv_rate", [] { return expect_rc(CALL(mbps_to_ibv_rate, -1), IBV_RATE_MAX); }},
};

// Runs `row` in a child; "" when it answered as it must.
std::string in_child(const Row& row) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe";
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string verdict = row();
    (void)!write(fds[1], verdict.data(), verdict.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char b[256];
  for (ssize_t n; (n = read(fds[0], b, sizeof b)) > 0;) out.append(b, size_t(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) return std::string("killed by ") + strsignal(WTERMSIG(st));
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return "exit status " + std::to_string(WEXITSTATUS(st));
  return out;
}

TEST(BadArgument, EveryPublicExportHasARow) {
  std::ifstream om(MELON_ABI_DIR "/omissions.txt"), f(MELON_ABI_DIR "/libibverbs.so.1.syms");
  ASSERT_TRUE(f && om) << MELON_ABI_DIR;
  std::vector<std::regex> omitted;  // "<library> <regex over name@version> <reason>"
  for (std::string line; std::getline(om, line);) {
    std::istringstream in(line);
    std::string lib, re;
    if (in >> lib >> re && lib == "libibverbs.so.1") omitted.emplace_back(re);
  }
  std::set<std::string> exported, rows;
  for (std::string line; std::getline(f, line);) {
    std::istringstream in(line);
    std::string kind, name;
    in >> kind >> name;
    size_t at = name.find('@');
    if (kind != "T" || at == std::string::npos || name.find("IBVERBS_1.") == std::string::npos) continue;
    bool skip = false;  // matched as nm prints it: name@@default or name@other
    for (auto& re : omitted) skip = skip || std::regex_match(name, re);
    if (!skip) exported.insert(name.substr(0, at));
  }
  for (auto& r : kRows) rows.insert(r.first);
  ASSERT_GT(exported.size(), 60u);
  for (auto& e : exported) EXPECT_TRUE(rows.count(e)) << e << " is exported and has no bad-argument row";
  for (auto& r : rows) EXPECT_TRUE(exported.count(r)) << r << " is not a v44 public export";
}

TEST(BadArgument, NullObjectsGiveTheirErrorNotACrash) {
  ASSERT_NE(lib(), nullptr) << dlerror();
  for (auto& [name, row] : kRows) {
    ASSERT_NE(lookup(name), nullptr) << name;
    std::string verdict = in_child(row);
    EXPECT_EQ(verdict, "") << name << ": " << verdict;
  }
}

// A real PD, then arguments that are wrong in other ways: a NULL address with a length, a zero
// length, and a destroyed QP's number in a query through a live context.
TEST(BadArgument, ZeroLengthsAndNullBuffersOnALiveDevice) {
  ASSERT_NE(lib(), nullptr) << dlerror();
  EXPECT_EQ(in_child([] {
              int n = 0;
              ibv_device** list = CALL(ibv_get_device_list, &n);
              if (!list || n < 1) return std::string("no device");
              ibv_context* ctx = CALL(ibv_open_device, list[0]);
              if (!ctx) return std::string("open failed");
              std::string v;
              ibv_pd* pd = CALL(ibv_alloc_pd, ctx);
              v += expect_fail(CALL(ibv_reg_mr_iova2, pd, nullptr, 4096, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
              v += expect_rc(CALL(ibv_query_port, ctx, 1, static_cast<_compat_ibv_port_attr*>(nullptr)), EINVAL);
              v += expect_rc(CALL(ibv_query_device, ctx, nullptr), EINVAL);
              v += expect_fail(CALL(ibv_create_cq, ctx, 0, nullptr, nullptr, 0), EINVAL);
              v += expect_fail(CALL(ibv_create_qp, pd, nullptr), EINVAL);
              v += expect_fail(CALL(ibv_create_ah, pd, nullptr), EINVAL);
              v += expect_rc(CALL(ibv_query_gid, ctx, 1, 0, nullptr), -1);
              CALL(ibv_dealloc_pd, pd);
              CALL(ibv_close_device, ctx);
              CALL(ibv_free_device_list, list);
              return v;
            }),
            "");
}

}  // namespace
