/* A verbs consumer, as a project that uses rdma-core would write it: list the devices, open one,
 * connect two RC QPs of it to each other and move bytes with RDMA WRITE and SEND/RECV, checking
 * every byte. Built against an installed MelonDMA by check.sh (pkg-config and CMake).
 *
 *   verbs_hello <device> [<directory libibverbs must be loaded from>]
 *
 * Exit 0: the transfer was verified (and the library came from that directory). */
#define _GNU_SOURCE /* dladdr */
#include <infiniband/verbs.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIZE 4096

static int fail(const char* what, int err) {
  fprintf(stderr, "verbs_hello: %s failed: %s\n", what, strerror(err));
  return 1;
}

/* Where the dynamic loader found ibv_get_device_list. */
static int check_library_dir(const char* want) {
  Dl_info info;
  char lib[PATH_MAX], dir[PATH_MAX];
  if (!dladdr((void*)ibv_get_device_list, &info) || !info.dli_fname) return fail("dladdr", EINVAL);
  if (!realpath(info.dli_fname, lib) || !realpath(want, dir)) return fail("realpath", EINVAL);
  printf("verbs_hello: libibverbs from %s\n", lib);
  size_t n = strlen(dir);
  if (strncmp(lib, dir, n) != 0 || lib[n] != '/' || strchr(lib + n + 1, '/')) {
    fprintf(stderr, "verbs_hello: libibverbs is not the one in %s\n", dir);
    return 1;
  }
  return 0;
}

static int to_rts(struct ibv_qp* qp, uint32_t dest_qpn, const union ibv_gid* dgid) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (err) return fail("modify_qp(INIT)", err);
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 7;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.dgid = *dgid;
  err = ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (err) return fail("modify_qp(RTR)", err);
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 7;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  err = ibv_modify_qp(
      qp, &a,
      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  return err ? fail("modify_qp(RTS)", err) : 0;
}

/* Waits up to 5 s for one completion with the given id. */
static int wait_one(struct ibv_cq* cq, uint64_t wr_id, const char* what) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    struct ibv_wc wc;
    int n = ibv_poll_cq(cq, 1, &wc); /* the header's inline path */
    if (n < 0) return fail("poll_cq", EIO);
    if (n == 1) {
      if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id) {
        fprintf(stderr, "verbs_hello: %s: %s (wr_id %llu)\n", what, ibv_wc_status_str(wc.status),
                (unsigned long long)wc.wr_id);
        return 1;
      }
      return 0;
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 5) {
      fprintf(stderr, "verbs_hello: %s: no completion in 5 s\n", what);
      return 1;
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: verbs_hello <device> [<libibverbs directory>]\n");
    return 2;
  }
  if (argc == 3 && check_library_dir(argv[2])) return 1;

  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  if (!list) return fail("get_device_list", errno);
  struct ibv_device* dev = NULL;
  printf("verbs_hello: %d device(s):", n);
  for (int i = 0; i < n; i++) {
    printf(" %s", ibv_get_device_name(list[i]));
    if (strcmp(ibv_get_device_name(list[i]), argv[1]) == 0) dev = list[i];
  }
  printf("\n");
  if (!dev) {
    fprintf(stderr, "verbs_hello: no device %s\n", argv[1]);
    return 1;
  }
  struct ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) return fail("open_device", errno);
  struct ibv_port_attr port;
  int err = ibv_query_port(ctx, 1, &port);
  if (err) return fail("query_port", err);
  union ibv_gid gid;
  err = ibv_query_gid(ctx, 1, 0, &gid);
  if (err) return fail("query_gid", err);

  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  if (!pd) return fail("alloc_pd", errno);
  static unsigned char src[SIZE], dst[SIZE], msg[64], got[64];
  for (int i = 0; i < SIZE; i++) src[i] = (unsigned char)(i * 7 + 1);
  snprintf((char*)msg, sizeof(msg), "hello from %s", argv[1]);
  struct ibv_mr* src_mr = ibv_reg_mr(pd, src, sizeof(src), 0);
  struct ibv_mr* dst_mr = ibv_reg_mr(pd, dst, sizeof(dst), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_mr* msg_mr = ibv_reg_mr(pd, msg, sizeof(msg), 0);
  struct ibv_mr* got_mr = ibv_reg_mr(pd, got, sizeof(got), IBV_ACCESS_LOCAL_WRITE);
  if (!src_mr || !dst_mr || !msg_mr || !got_mr) return fail("reg_mr", errno);
  struct ibv_cq* cq[2];
  struct ibv_qp* qp[2];
  for (int i = 0; i < 2; i++) {
    cq[i] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    if (!cq[i]) return fail("create_cq", errno);
    struct ibv_qp_init_attr qa;
    memset(&qa, 0, sizeof(qa));
    qa.send_cq = qa.recv_cq = cq[i];
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    qp[i] = ibv_create_qp(pd, &qa);
    if (!qp[i]) return fail("create_qp", errno);
  }
  if (to_rts(qp[0], qp[1]->qp_num, &gid) || to_rts(qp[1], qp[0]->qp_num, &gid)) return 1;

  struct ibv_sge rsge = {(uintptr_t)got, sizeof(got), got_mr->lkey};
  struct ibv_recv_wr rwr = {.wr_id = 3, .sg_list = &rsge, .num_sge = 1}, *bad_rwr;
  err = ibv_post_recv(qp[1], &rwr, &bad_rwr);
  if (err) return fail("post_recv", err);
  struct ibv_sge wsge = {(uintptr_t)src, sizeof(src), src_mr->lkey};
  struct ibv_send_wr write = {.wr_id = 1, .sg_list = &wsge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
  write.wr.rdma.remote_addr = (uintptr_t)dst;
  write.wr.rdma.rkey = dst_mr->rkey;
  struct ibv_sge ssge = {(uintptr_t)msg, sizeof(msg), msg_mr->lkey};
  struct ibv_send_wr send = {
      .wr_id = 2, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
  write.next = &send; /* unsignaled WRITE, then a signaled SEND: RC completes them in order */
  struct ibv_send_wr* bad;
  err = ibv_post_send(qp[0], &write, &bad);
  if (err) return fail("post_send", err);
  if (wait_one(cq[0], 2, "send") || wait_one(cq[1], 3, "recv")) return 1;
  if (memcmp(src, dst, SIZE) != 0 || memcmp(msg, got, sizeof(msg)) != 0) {
    fprintf(stderr, "verbs_hello: the bytes that arrived differ from those sent\n");
    return 1;
  }
  printf("verbs_hello: %s: RDMA WRITE of %d bytes and SEND of \"%s\" verified\n", argv[1], SIZE, got);

  for (int i = 0; i < 2; i++) {
    if ((err = ibv_destroy_qp(qp[i])) || (err = ibv_destroy_cq(cq[i]))) return fail("destroy", err);
  }
  ibv_dereg_mr(src_mr);
  ibv_dereg_mr(dst_mr);
  ibv_dereg_mr(msg_mr);
  ibv_dereg_mr(got_mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
