/*
 * Compile-time pins of every struct layout that applications built against rdma-core v44 read at
 * fixed offsets (the inline functions of rdma-core v44's libibverbs/verbs.h). Included by the library (so it cannot be built with a
 * wrong layout) and by a C test (so the header is also checked as C).
 *
 * Numbers are the x86_64 glibc values. Offsets that follow a pthread_mutex_t/pthread_cond_t are
 * written as "x86_64 value + (actual size - x86_64 size)" so the same checks hold on aarch64 glibc
 * (48-byte mutex) and on Darwin, where those sizes differ.
 */
#ifndef MELON_VERBS_ABI_LAYOUT_H
#define MELON_VERBS_ABI_LAYOUT_H

#include <infiniband/verbs.h>

#ifdef __cplusplus
#define MELON_STATIC_ASSERT(e, m) static_assert(e, m)
#else
#define MELON_STATIC_ASSERT(e, m) _Static_assert(e, m)
#endif

#if UINTPTR_MAX == UINT64_MAX

#define MELON_MTX_D ((long)sizeof(pthread_mutex_t) - 40) /* 0 on x86_64 glibc */
#define MELON_CND_D ((long)sizeof(pthread_cond_t) - 48)
#define MELON_OFF(s, f, v) MELON_STATIC_ASSERT((long)offsetof(struct s, f) == (long)(v), "offset of " #s "." #f)
#define MELON_SIZE(s, v) MELON_STATIC_ASSERT((long)sizeof(struct s) == (long)(v), "size of " #s)
#define MELON_USIZE(s, v) MELON_STATIC_ASSERT((long)sizeof(union s) == (long)(v), "size of " #s)

#if defined(__x86_64__) && defined(__GLIBC__)
MELON_STATIC_ASSERT(sizeof(pthread_mutex_t) == 40, "x86_64 glibc mutex");
MELON_STATIC_ASSERT(sizeof(pthread_cond_t) == 48, "x86_64 glibc cond");
#endif

/* struct ibv_device (664) */
MELON_SIZE(ibv_device, 664);
MELON_OFF(ibv_device, _ops, 0);
MELON_OFF(ibv_device, node_type, 16);
MELON_OFF(ibv_device, transport_type, 20);
MELON_OFF(ibv_device, name, 24);
MELON_OFF(ibv_device, dev_name, 88);
MELON_OFF(ibv_device, dev_path, 152);
MELON_OFF(ibv_device, ibdev_path, 408);

/* struct ibv_context_ops (256): the inlined data-path slots */
MELON_SIZE(ibv_context_ops, 256);
MELON_OFF(ibv_context_ops, _compat_query_device, 0);
MELON_OFF(ibv_context_ops, _compat_query_port, 8);
MELON_OFF(ibv_context_ops, _compat_alloc_pd, 16);
MELON_OFF(ibv_context_ops, _compat_dereg_mr, 48);
MELON_OFF(ibv_context_ops, alloc_mw, 56);
MELON_OFF(ibv_context_ops, bind_mw, 64);
MELON_OFF(ibv_context_ops, dealloc_mw, 72);
MELON_OFF(ibv_context_ops, _compat_create_cq, 80);
MELON_OFF(ibv_context_ops, poll_cq, 88);
MELON_OFF(ibv_context_ops, req_notify_cq, 96);
MELON_OFF(ibv_context_ops, _compat_cq_event, 104);
MELON_OFF(ibv_context_ops, _compat_destroy_srq, 152);
MELON_OFF(ibv_context_ops, post_srq_recv, 160);
MELON_OFF(ibv_context_ops, _compat_create_qp, 168);
MELON_OFF(ibv_context_ops, _compat_destroy_qp, 192);
MELON_OFF(ibv_context_ops, post_send, 200);
MELON_OFF(ibv_context_ops, post_recv, 208);
MELON_OFF(ibv_context_ops, _compat_create_ah, 216);
MELON_OFF(ibv_context_ops, _compat_async_event, 248);

/* struct ibv_context (328): ctx+0x60 poll_cq, +0x68 req_notify_cq, +0xa8 post_srq_recv,
 * +0xd0 post_send, +0xd8 post_recv, +0x140 abi_compat */
MELON_SIZE(ibv_context, 328 + MELON_MTX_D);
MELON_OFF(ibv_context, device, 0);
MELON_OFF(ibv_context, ops, 8);
MELON_OFF(ibv_context, ops.poll_cq, 0x60);
MELON_OFF(ibv_context, ops.req_notify_cq, 0x68);
MELON_OFF(ibv_context, ops.post_srq_recv, 0xa8);
MELON_OFF(ibv_context, ops.post_send, 0xd0);
MELON_OFF(ibv_context, ops.post_recv, 0xd8);
MELON_OFF(ibv_context, cmd_fd, 264);
MELON_OFF(ibv_context, async_fd, 268);
MELON_OFF(ibv_context, num_comp_vectors, 272);
MELON_OFF(ibv_context, mutex, 280);
MELON_OFF(ibv_context, abi_compat, 320 + MELON_MTX_D);

/* struct verbs_context (648): ops at negative offsets from &context (which is at 320) */
#define MELON_VOFF(f, neg)                                                                                     \
  MELON_STATIC_ASSERT(                                                                                         \
      (long)offsetof(struct verbs_context, f) - (long)offsetof(struct verbs_context, context) == -(long)(neg), \
      "verbs_context." #f " at -" #neg)
MELON_SIZE(verbs_context, 648 + MELON_MTX_D);
MELON_OFF(verbs_context, context, 320);
MELON_VOFF(query_port, 320);
MELON_VOFF(advise_mr, 312);
MELON_VOFF(alloc_null_mr, 304);
MELON_VOFF(read_counters, 296);
MELON_VOFF(attach_counters_point_flow, 288);
MELON_VOFF(create_counters, 280);
MELON_VOFF(destroy_counters, 272);
MELON_VOFF(reg_dm_mr, 264);
MELON_VOFF(alloc_dm, 256);
MELON_VOFF(free_dm, 248);
MELON_VOFF(modify_flow_action_esp, 240);
MELON_VOFF(destroy_flow_action, 232);
MELON_VOFF(create_flow_action_esp, 224);
MELON_VOFF(modify_qp_rate_limit, 216);
MELON_VOFF(alloc_parent_domain, 208);
MELON_VOFF(dealloc_td, 200);
MELON_VOFF(alloc_td, 192);
MELON_VOFF(modify_cq, 184);
MELON_VOFF(post_srq_ops, 176);
MELON_VOFF(destroy_rwq_ind_table, 168);
MELON_VOFF(create_rwq_ind_table, 160);
MELON_VOFF(destroy_wq, 152);
MELON_VOFF(modify_wq, 144);
MELON_VOFF(create_wq, 136);
MELON_VOFF(query_rt_values, 128);
MELON_VOFF(create_cq_ex, 120);
MELON_VOFF(priv, 112);
MELON_VOFF(query_device_ex, 104);
MELON_VOFF(ibv_destroy_flow, 96);
MELON_VOFF(ABI_placeholder2, 88);
MELON_VOFF(ibv_create_flow, 80);
MELON_VOFF(ABI_placeholder1, 72);
MELON_VOFF(open_qp, 64);
MELON_VOFF(create_qp_ex, 56);
MELON_VOFF(get_srq_num, 48);
MELON_VOFF(create_srq_ex, 40);
MELON_VOFF(open_xrcd, 32);
MELON_VOFF(close_xrcd, 24);
MELON_VOFF(_ABI_placeholder3, 16);
MELON_VOFF(sz, 8);

/* Small objects */
MELON_SIZE(ibv_pd, 16);
MELON_OFF(ibv_pd, context, 0);
MELON_OFF(ibv_pd, handle, 8);
MELON_SIZE(ibv_mr, 48);
MELON_OFF(ibv_mr, context, 0);
MELON_OFF(ibv_mr, pd, 8);
MELON_OFF(ibv_mr, addr, 16);
MELON_OFF(ibv_mr, length, 24);
MELON_OFF(ibv_mr, handle, 32);
MELON_OFF(ibv_mr, lkey, 36);
MELON_OFF(ibv_mr, rkey, 40);
MELON_SIZE(ibv_ah, 24);
MELON_OFF(ibv_ah, context, 0);
MELON_OFF(ibv_ah, pd, 8);
MELON_OFF(ibv_ah, handle, 16);
MELON_SIZE(ibv_comp_channel, 16);
MELON_OFF(ibv_comp_channel, context, 0);
MELON_OFF(ibv_comp_channel, fd, 8);
MELON_OFF(ibv_comp_channel, refcnt, 12);
MELON_SIZE(ibv_xrcd, 8);
MELON_SIZE(ibv_mw, 32);
MELON_OFF(ibv_mw, context, 0);
MELON_OFF(ibv_mw, pd, 8);
MELON_OFF(ibv_mw, rkey, 16);
MELON_OFF(ibv_mw, handle, 20);
MELON_OFF(ibv_mw, type, 24);
MELON_SIZE(ibv_td, 8);
MELON_SIZE(ibv_flow, 24);
MELON_SIZE(ibv_dm, 32);

/* struct ibv_cq (128) and ibv_cq_ex (288) */
MELON_SIZE(ibv_cq, 128 + MELON_MTX_D + MELON_CND_D);
MELON_OFF(ibv_cq, context, 0);
MELON_OFF(ibv_cq, channel, 8);
MELON_OFF(ibv_cq, cq_context, 16);
MELON_OFF(ibv_cq, handle, 24);
MELON_OFF(ibv_cq, cqe, 28);
MELON_OFF(ibv_cq, mutex, 32);
MELON_OFF(ibv_cq, cond, 72 + MELON_MTX_D);
MELON_OFF(ibv_cq, comp_events_completed, 120 + MELON_MTX_D + MELON_CND_D);
MELON_OFF(ibv_cq, async_events_completed, 124 + MELON_MTX_D + MELON_CND_D);
#define MELON_CQX(f, v) MELON_OFF(ibv_cq_ex, f, (v) + MELON_MTX_D + MELON_CND_D)
MELON_SIZE(ibv_cq_ex, 288 + MELON_MTX_D + MELON_CND_D);
MELON_OFF(ibv_cq_ex, cqe, 28);
MELON_CQX(comp_events_completed, 120);
MELON_CQX(comp_mask, 128);
MELON_CQX(status, 132);
MELON_CQX(wr_id, 136);
MELON_CQX(start_poll, 144);
MELON_CQX(next_poll, 152);
MELON_CQX(end_poll, 160);
MELON_CQX(read_opcode, 168);
MELON_CQX(read_vendor_err, 176);
MELON_CQX(read_byte_len, 184);
MELON_CQX(read_imm_data, 192);
MELON_CQX(read_qp_num, 200);
MELON_CQX(read_src_qp, 208);
MELON_CQX(read_wc_flags, 216);
MELON_CQX(read_slid, 224);
MELON_CQX(read_sl, 232);
MELON_CQX(read_dlid_path_bits, 240);
MELON_CQX(read_completion_ts, 248);
MELON_CQX(read_cvlan, 256);
MELON_CQX(read_flow_tag, 264);
MELON_CQX(read_tm_info, 272);
MELON_CQX(read_completion_wallclock_ns, 280);

/* struct ibv_qp (160) and ibv_qp_ex (352) */
MELON_SIZE(ibv_qp, 160 + MELON_MTX_D + MELON_CND_D);
MELON_OFF(ibv_qp, context, 0);
MELON_OFF(ibv_qp, qp_context, 8);
MELON_OFF(ibv_qp, pd, 16);
MELON_OFF(ibv_qp, send_cq, 24);
MELON_OFF(ibv_qp, recv_cq, 32);
MELON_OFF(ibv_qp, srq, 40);
MELON_OFF(ibv_qp, handle, 48);
MELON_OFF(ibv_qp, qp_num, 52);
MELON_OFF(ibv_qp, state, 56);
MELON_OFF(ibv_qp, qp_type, 60);
MELON_OFF(ibv_qp, mutex, 64);
MELON_OFF(ibv_qp, cond, 104 + MELON_MTX_D);
MELON_OFF(ibv_qp, events_completed, 152 + MELON_MTX_D + MELON_CND_D);
#define MELON_QPX(f, v) MELON_OFF(ibv_qp_ex, f, (v) + MELON_MTX_D + MELON_CND_D)
MELON_SIZE(ibv_qp_ex, 352 + MELON_MTX_D + MELON_CND_D);
MELON_OFF(ibv_qp_ex, qp_base, 0);
MELON_QPX(comp_mask, 160);
MELON_QPX(wr_id, 168);
MELON_QPX(wr_flags, 176);
MELON_QPX(wr_atomic_cmp_swp, 184);
MELON_QPX(wr_atomic_fetch_add, 192);
MELON_QPX(wr_bind_mw, 200);
MELON_QPX(wr_local_inv, 208);
MELON_QPX(wr_rdma_read, 216);
MELON_QPX(wr_rdma_write, 224);
MELON_QPX(wr_rdma_write_imm, 232);
MELON_QPX(wr_send, 240);
MELON_QPX(wr_send_imm, 248);
MELON_QPX(wr_send_inv, 256);
MELON_QPX(wr_send_tso, 264);
MELON_QPX(wr_set_ud_addr, 272);
MELON_QPX(wr_set_xrc_srqn, 280);
MELON_QPX(wr_set_inline_data, 288);
MELON_QPX(wr_set_inline_data_list, 296);
MELON_QPX(wr_set_sge, 304);
MELON_QPX(wr_set_sge_list, 312);
MELON_QPX(wr_start, 320);
MELON_QPX(wr_complete, 328);
MELON_QPX(wr_abort, 336);
MELON_QPX(wr_atomic_write, 344);

/* struct ibv_srq (128), ibv_wq (152) */
MELON_SIZE(ibv_srq, 128 + MELON_MTX_D + MELON_CND_D);
MELON_OFF(ibv_srq, context, 0);
MELON_OFF(ibv_srq, srq_context, 8);
MELON_OFF(ibv_srq, pd, 16);
MELON_OFF(ibv_srq, handle, 24);
MELON_OFF(ibv_srq, mutex, 32);
MELON_OFF(ibv_srq, cond, 72 + MELON_MTX_D);
MELON_OFF(ibv_srq, events_completed, 120 + MELON_MTX_D + MELON_CND_D);
MELON_SIZE(ibv_wq, 152 + MELON_MTX_D + MELON_CND_D);
MELON_OFF(ibv_wq, context, 0);
MELON_OFF(ibv_wq, wq_context, 8);
MELON_OFF(ibv_wq, pd, 16);
MELON_OFF(ibv_wq, cq, 24);
MELON_OFF(ibv_wq, wq_num, 32);
MELON_OFF(ibv_wq, handle, 36);
MELON_OFF(ibv_wq, state, 40);
MELON_OFF(ibv_wq, wq_type, 44);
MELON_OFF(ibv_wq, post_recv, 48);
MELON_OFF(ibv_wq, mutex, 56);
MELON_OFF(ibv_wq, cond, 96 + MELON_MTX_D);
MELON_OFF(ibv_wq, events_completed, 144 + MELON_MTX_D + MELON_CND_D);
MELON_OFF(ibv_wq, comp_mask, 148 + MELON_MTX_D + MELON_CND_D);

/* struct ibv_async_event (16) */
MELON_SIZE(ibv_async_event, 16);
MELON_OFF(ibv_async_event, element, 0);
MELON_OFF(ibv_async_event, event_type, 8);

/* struct ibv_wc (48) */
MELON_SIZE(ibv_wc, 48);
MELON_OFF(ibv_wc, wr_id, 0);
MELON_OFF(ibv_wc, status, 8);
MELON_OFF(ibv_wc, opcode, 12);
MELON_OFF(ibv_wc, vendor_err, 16);
MELON_OFF(ibv_wc, byte_len, 20);
MELON_OFF(ibv_wc, imm_data, 24);
MELON_OFF(ibv_wc, invalidated_rkey, 24);
MELON_OFF(ibv_wc, qp_num, 28);
MELON_OFF(ibv_wc, src_qp, 32);
MELON_OFF(ibv_wc, wc_flags, 36);
MELON_OFF(ibv_wc, pkey_index, 40);
MELON_OFF(ibv_wc, slid, 42);
MELON_OFF(ibv_wc, sl, 44);
MELON_OFF(ibv_wc, dlid_path_bits, 45);

/* struct ibv_send_wr (128), ibv_recv_wr (32), ibv_sge (16) */
MELON_SIZE(ibv_send_wr, 128);
MELON_OFF(ibv_send_wr, wr_id, 0);
MELON_OFF(ibv_send_wr, next, 8);
MELON_OFF(ibv_send_wr, sg_list, 16);
MELON_OFF(ibv_send_wr, num_sge, 24);
MELON_OFF(ibv_send_wr, opcode, 28);
MELON_OFF(ibv_send_wr, send_flags, 32);
MELON_OFF(ibv_send_wr, imm_data, 36);
MELON_OFF(ibv_send_wr, invalidate_rkey, 36);
MELON_OFF(ibv_send_wr, wr.rdma.remote_addr, 40);
MELON_OFF(ibv_send_wr, wr.rdma.rkey, 48);
MELON_OFF(ibv_send_wr, wr.atomic.remote_addr, 40);
MELON_OFF(ibv_send_wr, wr.atomic.compare_add, 48);
MELON_OFF(ibv_send_wr, wr.atomic.swap, 56);
MELON_OFF(ibv_send_wr, wr.atomic.rkey, 64);
MELON_OFF(ibv_send_wr, wr.ud.ah, 40);
MELON_OFF(ibv_send_wr, wr.ud.remote_qpn, 48);
MELON_OFF(ibv_send_wr, wr.ud.remote_qkey, 52);
MELON_OFF(ibv_send_wr, qp_type.xrc.remote_srqn, 72);
MELON_OFF(ibv_send_wr, bind_mw, 80);
MELON_OFF(ibv_send_wr, tso, 80);
MELON_SIZE(ibv_recv_wr, 32);
MELON_OFF(ibv_recv_wr, wr_id, 0);
MELON_OFF(ibv_recv_wr, next, 8);
MELON_OFF(ibv_recv_wr, sg_list, 16);
MELON_OFF(ibv_recv_wr, num_sge, 24);
MELON_SIZE(ibv_sge, 16);
MELON_OFF(ibv_sge, addr, 0);
MELON_OFF(ibv_sge, length, 8);
MELON_OFF(ibv_sge, lkey, 12);

/* struct ibv_port_attr (52); the exported ibv_query_port writes only the first 48 */
MELON_SIZE(ibv_port_attr, 52);
MELON_OFF(ibv_port_attr, state, 0);
MELON_OFF(ibv_port_attr, max_mtu, 4);
MELON_OFF(ibv_port_attr, active_mtu, 8);
MELON_OFF(ibv_port_attr, gid_tbl_len, 12);
MELON_OFF(ibv_port_attr, port_cap_flags, 16);
MELON_OFF(ibv_port_attr, max_msg_sz, 20);
MELON_OFF(ibv_port_attr, bad_pkey_cntr, 24);
MELON_OFF(ibv_port_attr, qkey_viol_cntr, 28);
MELON_OFF(ibv_port_attr, pkey_tbl_len, 32);
MELON_OFF(ibv_port_attr, lid, 34);
MELON_OFF(ibv_port_attr, sm_lid, 36);
MELON_OFF(ibv_port_attr, lmc, 38);
MELON_OFF(ibv_port_attr, max_vl_num, 39);
MELON_OFF(ibv_port_attr, sm_sl, 40);
MELON_OFF(ibv_port_attr, subnet_timeout, 41);
MELON_OFF(ibv_port_attr, init_type_reply, 42);
MELON_OFF(ibv_port_attr, active_width, 43);
MELON_OFF(ibv_port_attr, active_speed, 44);
MELON_OFF(ibv_port_attr, phys_state, 45);
MELON_OFF(ibv_port_attr, link_layer, 46);
MELON_OFF(ibv_port_attr, flags, 47);
MELON_OFF(ibv_port_attr, port_cap_flags2, 48);

/* struct ibv_device_attr (232), ibv_device_attr_ex (400), ibv_gid_entry (32) */
MELON_SIZE(ibv_device_attr, 232);
MELON_OFF(ibv_device_attr, fw_ver, 0);
MELON_OFF(ibv_device_attr, node_guid, 64);
MELON_OFF(ibv_device_attr, sys_image_guid, 72);
MELON_OFF(ibv_device_attr, max_mr_size, 80);
MELON_OFF(ibv_device_attr, page_size_cap, 88);
MELON_OFF(ibv_device_attr, vendor_id, 96);
MELON_OFF(ibv_device_attr, vendor_part_id, 100);
MELON_OFF(ibv_device_attr, hw_ver, 104);
MELON_OFF(ibv_device_attr, max_qp, 108);
MELON_OFF(ibv_device_attr, max_pkeys, 224);
MELON_OFF(ibv_device_attr, local_ca_ack_delay, 226);
MELON_OFF(ibv_device_attr, phys_port_cnt, 227);
MELON_SIZE(ibv_device_attr_ex, 400);
MELON_OFF(ibv_device_attr_ex, orig_attr, 0);
MELON_OFF(ibv_device_attr_ex, comp_mask, 232);
MELON_OFF(ibv_device_attr_ex, phys_port_cnt_ex, 396);
MELON_SIZE(ibv_gid_entry, 32);
MELON_OFF(ibv_gid_entry, gid, 0);
MELON_OFF(ibv_gid_entry, gid_index, 16);
MELON_OFF(ibv_gid_entry, port_num, 20);
MELON_OFF(ibv_gid_entry, gid_type, 24);
MELON_OFF(ibv_gid_entry, ndev_ifindex, 28);
MELON_USIZE(ibv_gid, 16);

/* Attribute structures */
MELON_SIZE(ibv_qp_init_attr, 64);
MELON_SIZE(ibv_qp_init_attr_ex, 136);
MELON_OFF(ibv_qp_init_attr_ex, comp_mask, 60); /* in the tail padding of ibv_qp_init_attr */
MELON_SIZE(ibv_qp_attr, 144);
MELON_SIZE(ibv_ah_attr, 32);
MELON_SIZE(ibv_global_route, 24);
MELON_SIZE(ibv_qp_cap, 20);
MELON_SIZE(ibv_srq_init_attr, 24);
MELON_SIZE(ibv_srq_attr, 12);
MELON_SIZE(ibv_cq_init_attr_ex, 56);
MELON_SIZE(ibv_grh, 40);

#endif /* 64-bit */

#endif /* MELON_VERBS_ABI_LAYOUT_H */
