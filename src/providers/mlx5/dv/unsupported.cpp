// libmlx5.so.1: the mlx5dv_* entry points that have no equivalent on our devices yet. Every one
// fails as src/providers/unsupported.h describes; the stock library's version nodes come from
// src/abi/gen/libmlx5.map. A function that becomes real moves out of this file.
#include "abi/gen/mlx5dv_prototypes.h"
#include "providers/unsupported.h"

// ---- Device memory, UAR, VAR, packet pacing, clock

MELON_DV_ERRNO(_mlx5dv_query_port, (struct ibv_context*, uint32_t, struct mlx5_ib_uapi_query_port*, size_t))
MELON_DV_NULL(struct ibv_dm*, mlx5dv_alloc_dm,
              (struct ibv_context*, struct ibv_alloc_dm_attr*, struct mlx5dv_alloc_dm_attr*))
MELON_DV_NULL(struct mlx5dv_var*, mlx5dv_alloc_var, (struct ibv_context*, uint32_t))
MELON_DV_NULL(void*, mlx5dv_dm_map_op_addr, (struct ibv_dm*, uint8_t))
MELON_DV_VOID(mlx5dv_free_var, (struct mlx5dv_var*))
MELON_DV_ERRNO(mlx5dv_get_clock_info, (struct ibv_context*, struct mlx5dv_clock_info*))
MELON_DV_NULL(struct mlx5dv_pp*, mlx5dv_pp_alloc, (struct ibv_context*, size_t, const void*, uint32_t))
MELON_DV_VOID(mlx5dv_pp_free, (struct mlx5dv_pp*))
MELON_DV_ERRNO(mlx5dv_set_context_attr, (struct ibv_context*, enum mlx5dv_set_ctx_attr_type, void*))

// ---- DEVX: raw PRM commands and objects

MELON_DV_NULL(struct mlx5dv_devx_msi_vector*, mlx5dv_devx_alloc_msi_vector, (struct ibv_context*))
MELON_DV_NULL(struct mlx5dv_devx_uar*, mlx5dv_devx_alloc_uar, (struct ibv_context*, uint32_t))
MELON_DV_ERRNO(mlx5dv_devx_cq_modify, (struct ibv_cq*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_cq_query, (struct ibv_cq*, const void*, size_t, void*, size_t))
MELON_DV_NULL(struct mlx5dv_devx_cmd_comp*, mlx5dv_devx_create_cmd_comp, (struct ibv_context*))
MELON_DV_NULL(struct mlx5dv_devx_eq*, mlx5dv_devx_create_eq, (struct ibv_context*, const void*, size_t, void*, size_t))
MELON_DV_NULL(struct mlx5dv_devx_event_channel*, mlx5dv_devx_create_event_channel,
              (struct ibv_context*, enum mlx5_ib_uapi_devx_create_event_channel_flags))
MELON_DV_VOID(mlx5dv_devx_destroy_cmd_comp, (struct mlx5dv_devx_cmd_comp*))
MELON_DV_ERRNO(mlx5dv_devx_destroy_eq, (struct mlx5dv_devx_eq*))
MELON_DV_VOID(mlx5dv_devx_destroy_event_channel, (struct mlx5dv_devx_event_channel*))
MELON_DV_ERRNO(mlx5dv_devx_free_msi_vector, (struct mlx5dv_devx_msi_vector*))
MELON_DV_VOID(mlx5dv_devx_free_uar, (struct mlx5dv_devx_uar*))
MELON_DV_ERRNO(mlx5dv_devx_general_cmd, (struct ibv_context*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_get_async_cmd_comp,
               (struct mlx5dv_devx_cmd_comp*, struct mlx5_ib_uapi_devx_async_cmd_hdr*, size_t))
MELON_DV_MINUS1(ssize_t, mlx5dv_devx_get_event,
                (struct mlx5dv_devx_event_channel*, struct mlx5_ib_uapi_devx_async_event_hdr*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_ind_tbl_modify, (struct ibv_rwq_ind_table*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_ind_tbl_query, (struct ibv_rwq_ind_table*, const void*, size_t, void*, size_t))
MELON_DV_NULL(struct mlx5dv_devx_obj*, mlx5dv_devx_obj_create,
              (struct ibv_context*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_obj_destroy, (struct mlx5dv_devx_obj*))
MELON_DV_ERRNO(mlx5dv_devx_obj_modify, (struct mlx5dv_devx_obj*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_obj_query, (struct mlx5dv_devx_obj*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_obj_query_async,
               (struct mlx5dv_devx_obj*, const void*, size_t, size_t, uint64_t, struct mlx5dv_devx_cmd_comp*))
MELON_DV_ERRNO(mlx5dv_devx_qp_modify, (struct ibv_qp*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_qp_query, (struct ibv_qp*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_query_eqn, (struct ibv_context*, uint32_t, uint32_t*))
MELON_DV_ERRNO(mlx5dv_devx_srq_modify, (struct ibv_srq*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_srq_query, (struct ibv_srq*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_subscribe_devx_event,
               (struct mlx5dv_devx_event_channel*, struct mlx5dv_devx_obj*, uint16_t, uint16_t*, uint64_t))
MELON_DV_ERRNO(mlx5dv_devx_subscribe_devx_event_fd,
               (struct mlx5dv_devx_event_channel*, int, struct mlx5dv_devx_obj*, uint16_t))
MELON_DV_ERRNO(mlx5dv_devx_umem_dereg, (struct mlx5dv_devx_umem*))
MELON_DV_NULL(struct mlx5dv_devx_umem*, mlx5dv_devx_umem_reg, (struct ibv_context*, void*, size_t, uint32_t))
MELON_DV_NULL(struct mlx5dv_devx_umem*, mlx5dv_devx_umem_reg_ex, (struct ibv_context*, struct mlx5dv_devx_umem_in*))
MELON_DV_ERRNO(mlx5dv_devx_wq_modify, (struct ibv_wq*, const void*, size_t, void*, size_t))
MELON_DV_ERRNO(mlx5dv_devx_wq_query, (struct ibv_wq*, const void*, size_t, void*, size_t))

// ---- Direct rules (steering)

MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_aso,
              (struct mlx5dv_dr_domain*, struct mlx5dv_devx_obj*, uint32_t, uint32_t, uint8_t))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_default_miss, (void))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_dest_array,
              (struct mlx5dv_dr_domain*, size_t, struct mlx5dv_dr_action_dest_attr**))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_dest_devx_tir, (struct mlx5dv_devx_obj*))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_dest_ib_port, (struct mlx5dv_dr_domain*, uint32_t))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_dest_ibv_qp, (struct ibv_qp*))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_dest_root_table, (struct mlx5dv_dr_table*, uint16_t))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_dest_table, (struct mlx5dv_dr_table*))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_dest_vport, (struct mlx5dv_dr_domain*, uint32_t))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_drop, (void))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_flow_counter, (struct mlx5dv_devx_obj*, uint32_t))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_flow_meter, (struct mlx5dv_dr_flow_meter_attr*))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_flow_sampler, (struct mlx5dv_dr_flow_sampler_attr*))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_modify_header,
              (struct mlx5dv_dr_domain*, uint32_t, size_t, __be64*))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_packet_reformat,
              (struct mlx5dv_dr_domain*, uint32_t, enum mlx5_ib_uapi_flow_action_packet_reformat_type, size_t, void*))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_pop_vlan, (void))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_push_vlan, (struct mlx5dv_dr_domain*, __be32))
MELON_DV_NULL(struct mlx5dv_dr_action*, mlx5dv_dr_action_create_tag, (uint32_t))
MELON_DV_ERRNO(mlx5dv_dr_action_destroy, (struct mlx5dv_dr_action*))
MELON_DV_ERRNO(mlx5dv_dr_action_modify_aso, (struct mlx5dv_dr_action*, uint32_t, uint32_t, uint8_t))
MELON_DV_ERRNO(mlx5dv_dr_action_modify_flow_meter,
               (struct mlx5dv_dr_action*, struct mlx5dv_dr_flow_meter_attr*, __be64))
MELON_DV_ERRNO(mlx5dv_dr_aso_other_domain_link,
               (struct mlx5dv_devx_obj*, struct mlx5dv_dr_domain*, struct mlx5dv_dr_domain*, uint32_t, uint8_t))
MELON_DV_ERRNO(mlx5dv_dr_aso_other_domain_unlink, (struct mlx5dv_devx_obj*, struct mlx5dv_dr_domain*))
MELON_DV_VOID(mlx5dv_dr_domain_allow_duplicate_rules, (struct mlx5dv_dr_domain*, bool))
MELON_DV_NULL(struct mlx5dv_dr_domain*, mlx5dv_dr_domain_create, (struct ibv_context*, enum mlx5dv_dr_domain_type))
MELON_DV_ERRNO(mlx5dv_dr_domain_destroy, (struct mlx5dv_dr_domain*))
MELON_DV_VOID(mlx5dv_dr_domain_set_reclaim_device_memory, (struct mlx5dv_dr_domain*, bool))
MELON_DV_ERRNO(mlx5dv_dr_domain_sync, (struct mlx5dv_dr_domain*, uint32_t))
MELON_DV_NULL(struct mlx5dv_dr_matcher*, mlx5dv_dr_matcher_create,
              (struct mlx5dv_dr_table*, uint16_t, uint8_t, struct mlx5dv_flow_match_parameters*))
MELON_DV_ERRNO(mlx5dv_dr_matcher_destroy, (struct mlx5dv_dr_matcher*))
MELON_DV_ERRNO(mlx5dv_dr_matcher_set_layout, (struct mlx5dv_dr_matcher*, struct mlx5dv_dr_matcher_layout*))
MELON_DV_NULL(struct mlx5dv_dr_rule*, mlx5dv_dr_rule_create,
              (struct mlx5dv_dr_matcher*, struct mlx5dv_flow_match_parameters*, size_t, struct mlx5dv_dr_action**))
MELON_DV_ERRNO(mlx5dv_dr_rule_destroy, (struct mlx5dv_dr_rule*))
MELON_DV_NULL(struct mlx5dv_dr_table*, mlx5dv_dr_table_create, (struct mlx5dv_dr_domain*, uint32_t))
MELON_DV_ERRNO(mlx5dv_dr_table_destroy, (struct mlx5dv_dr_table*))
MELON_DV_ERRNO(mlx5dv_dump_dr_domain, (FILE*, struct mlx5dv_dr_domain*))
MELON_DV_ERRNO(mlx5dv_dump_dr_matcher, (FILE*, struct mlx5dv_dr_matcher*))
MELON_DV_ERRNO(mlx5dv_dump_dr_rule, (FILE*, struct mlx5dv_dr_rule*))
MELON_DV_ERRNO(mlx5dv_dump_dr_table, (FILE*, struct mlx5dv_dr_table*))

// ---- Flow steering and flow actions

MELON_DV_NULL(struct ibv_flow*, mlx5dv_create_flow,
              (struct mlx5dv_flow_matcher*, struct mlx5dv_flow_match_parameters*, size_t,
               struct mlx5dv_flow_action_attr*))
MELON_DV_NULL(struct ibv_flow_action*, mlx5dv_create_flow_action_esp,
              (struct ibv_context*, struct ibv_flow_action_esp_attr*, struct mlx5dv_flow_action_esp*))
MELON_DV_NULL(struct ibv_flow_action*, mlx5dv_create_flow_action_modify_header,
              (struct ibv_context*, size_t, uint64_t*, enum mlx5_ib_uapi_flow_table_type))
MELON_DV_NULL(struct ibv_flow_action*, mlx5dv_create_flow_action_packet_reformat,
              (struct ibv_context*, size_t, void*, enum mlx5_ib_uapi_flow_action_packet_reformat_type,
               enum mlx5_ib_uapi_flow_table_type))
MELON_DV_NULL(struct mlx5dv_flow_matcher*, mlx5dv_create_flow_matcher,
              (struct ibv_context*, struct mlx5dv_flow_matcher_attr*))
MELON_DV_NULL(struct mlx5dv_steering_anchor*, mlx5dv_create_steering_anchor,
              (struct ibv_context*, struct mlx5dv_steering_anchor_attr*))
MELON_DV_ERRNO(mlx5dv_destroy_flow_matcher, (struct mlx5dv_flow_matcher*))
MELON_DV_ERRNO(mlx5dv_destroy_steering_anchor, (struct mlx5dv_steering_anchor*))

// ---- Memory keys, crypto and DEKs

MELON_DV_ERRNO(_mlx5dv_mkey_check, (struct mlx5dv_mkey*, struct mlx5dv_mkey_err*, size_t))
MELON_DV_NULL(struct mlx5dv_mkey*, mlx5dv_create_mkey, (struct mlx5dv_mkey_init_attr*))
MELON_DV_ERRNO(mlx5dv_crypto_login, (struct ibv_context*, struct mlx5dv_crypto_login_attr*))
MELON_DV_NULL(struct mlx5dv_crypto_login_obj*, mlx5dv_crypto_login_create,
              (struct ibv_context*, struct mlx5dv_crypto_login_attr_ex*))
MELON_DV_ERRNO(mlx5dv_crypto_login_destroy, (struct mlx5dv_crypto_login_obj*))
MELON_DV_ERRNO(mlx5dv_crypto_login_query, (struct mlx5dv_crypto_login_obj*, struct mlx5dv_crypto_login_query_attr*))
MELON_DV_ERRNO(mlx5dv_crypto_login_query_state, (struct ibv_context*, enum mlx5dv_crypto_login_state*))
MELON_DV_ERRNO(mlx5dv_crypto_logout, (struct ibv_context*))
MELON_DV_NULL(struct mlx5dv_dek*, mlx5dv_dek_create, (struct ibv_context*, struct mlx5dv_dek_init_attr*))
MELON_DV_ERRNO(mlx5dv_dek_destroy, (struct mlx5dv_dek*))
MELON_DV_ERRNO(mlx5dv_dek_query, (struct mlx5dv_dek*, struct mlx5dv_dek_attr*))
MELON_DV_ERRNO(mlx5dv_destroy_mkey, (struct mlx5dv_mkey*))

// ---- QP and WQ extras

MELON_DV_NULL(struct ibv_wq*, mlx5dv_create_wq,
              (struct ibv_context*, struct ibv_wq_init_attr*, struct mlx5dv_wq_init_attr*))
MELON_DV_ERRNO(mlx5dv_dci_stream_id_reset, (struct ibv_qp*, uint16_t))
MELON_DV_ERRNO(mlx5dv_map_ah_to_qp, (struct ibv_ah*, uint32_t))
MELON_DV_ERRNO(mlx5dv_modify_qp_lag_port, (struct ibv_qp*, uint8_t))
MELON_DV_ERRNO(mlx5dv_modify_qp_sched_elem,
               (struct ibv_qp*, const struct mlx5dv_sched_leaf*, const struct mlx5dv_sched_leaf*))
MELON_DV_ERRNO(mlx5dv_modify_qp_udp_sport, (struct ibv_qp*, uint16_t))
MELON_DV_NEG_ERRNO(mlx5dv_qp_cancel_posted_send_wrs, (struct mlx5dv_qp_ex*, uint64_t))
MELON_DV_NULL(struct mlx5dv_qp_ex*, mlx5dv_qp_ex_from_ibv_qp_ex, (struct ibv_qp_ex*))
MELON_DV_ERRNO(mlx5dv_query_qp_lag_port, (struct ibv_qp*, uint8_t*, uint8_t*))
MELON_DV_ERRNO(mlx5dv_reserved_qpn_alloc, (struct ibv_context*, uint32_t*))
MELON_DV_ERRNO(mlx5dv_reserved_qpn_dealloc, (struct ibv_context*, uint32_t))

// ---- Scheduling elements

MELON_DV_NULL(struct mlx5dv_sched_leaf*, mlx5dv_sched_leaf_create,
              (struct ibv_context*, const struct mlx5dv_sched_attr*))
MELON_DV_ERRNO(mlx5dv_sched_leaf_destroy, (struct mlx5dv_sched_leaf*))
MELON_DV_ERRNO(mlx5dv_sched_leaf_modify, (struct mlx5dv_sched_leaf*, const struct mlx5dv_sched_attr*))
MELON_DV_NULL(struct mlx5dv_sched_node*, mlx5dv_sched_node_create,
              (struct ibv_context*, const struct mlx5dv_sched_attr*))
MELON_DV_ERRNO(mlx5dv_sched_node_destroy, (struct mlx5dv_sched_node*))
MELON_DV_ERRNO(mlx5dv_sched_node_modify, (struct mlx5dv_sched_node*, const struct mlx5dv_sched_attr*))

// ---- VFIO devices

MELON_DV_NULL(struct ibv_device**, mlx5dv_get_vfio_device_list, (struct mlx5dv_vfio_context_attr*))
MELON_DV_MINUS1(int, mlx5dv_vfio_get_events_fd, (struct ibv_context*))
MELON_DV_ERRNO(mlx5dv_vfio_process_events, (struct ibv_context*))
