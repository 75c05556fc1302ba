// Every field of every PRM table, diffed against the kernel's mlx5_ifc.h.
//
// The build turns mlx5_ifc.h into a C program (oracle/gen_ifc_dump.cpp) whose output, one line per
// field, is the TSV read here: "<struct>\t<field>\t<bit offset>\t<bit width>" (-1 for a flexible
// array, "-" as field for the struct's size), and "enum\t<NAME>\t<value>" for constants. The
// numbers come from the C compiler's offsetof/sizeof on the mlx5_ifc_*_bits structs, so this test
// fails if our table or the kernel's header moves.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "mlx5/prm/prm.h"

namespace prm = melon::mlx5::prm;

namespace {

struct Ifc {
  std::map<std::pair<std::string, std::string>, std::pair<long, long>> fields;  // (off, width)
  std::map<std::string, long> sizes;
  std::map<std::string, long long> constants;
  std::map<std::string, std::vector<std::pair<std::string, std::pair<long, long>>>> by_struct;
};

const Ifc& ifc() {
  static const Ifc db = [] {
    Ifc d;
    std::ifstream in(MELON_IFC_TSV);
    std::string line;
    while (std::getline(in, line)) {
      std::stringstream ss(line);
      std::string a, b, c, w;
      std::getline(ss, a, '\t');
      std::getline(ss, b, '\t');
      std::getline(ss, c, '\t');
      std::getline(ss, w, '\t');
      if (a == "enum") {
        d.constants[b] = std::stoll(c);
      } else if (b == "-") {
        d.sizes[a] = std::stol(w);
      } else {
        d.fields[{a, b}] = {std::stol(c), std::stol(w)};
        d.by_struct[a].push_back({b, {std::stol(c), std::stol(w)}});
      }
    }
    return d;
  }();
  return db;
}

// Layouts that are not in mlx5_ifc.h at all: WQE/CQE/doorbell formats (checked against
// <infiniband/mlx5dv.h> by prm_mlx5dv_test).
const std::set<std::string> kNotInIfc = {
    "cqe64",        "err_cqe",        "wqe_ctrl_seg",     "wqe_raddr_seg", "wqe_atomic_seg",
    "wqe_data_seg", "wqe_inline_seg", "wqe_datagram_seg", "klm",           "qp_dbrec",
    "cq_dbrec",     "cq_uar_db",      "eq_uar_db"};

// Our field name -> mlx5_ifc.h's, where they differ.
const std::map<std::pair<std::string, std::string>, std::string> kRenamed = {
    {{"modify_cq_in", "field_select"}, "modify_field_select_resize_field_select"},
    {{"cqc", "c_eqn"}, "c_eqn_or_apu_element"},
};

// Fields we define in space mlx5_ifc.h leaves reserved (their source is named in the table).
const std::set<std::pair<std::string, std::string>> kOursOnly = {
    {"initial_seg", "internal_timer_h"},
    {"initial_seg", "internal_timer_l"},
};

TEST(PrmIfcOracle, TheOracleWasGenerated) {
  ASSERT_GT(ifc().sizes.size(), 500u) << "no mlx5_ifc.h dump at " << MELON_IFC_TSV;
  ASSERT_GT(ifc().constants.size(), 500u);
  // Spot values from the PRM, so a broken generator cannot pass everything vacuously.
  EXPECT_EQ(ifc().fields.at({"qpc", "pm_state"}), std::make_pair(19L, 2L));
  EXPECT_EQ(ifc().fields.at({"cqc", "log_cq_size"}), std::make_pair(99L, 5L));
  EXPECT_EQ(ifc().constants.at("MLX5_CMD_OP_INIT_HCA"), 0x102);
}

TEST(PrmIfcOracle, EveryFieldOfEveryTableMatches) {
  auto list = prm::all_layouts();
  size_t checked = 0, structs = 0;
  for (uint32_t i = 0; i < list.count; ++i) {
    const prm::Layout& l = *list.items[i];
    if (kNotInIfc.count(l.name)) continue;
    ++structs;
    auto sz = ifc().sizes.find(l.name);
    ASSERT_NE(sz, ifc().sizes.end()) << l.name << " is not a struct of mlx5_ifc.h";
    EXPECT_EQ(long(l.size_bits), sz->second) << l.name << " size";
    for (uint32_t f = 0; f < l.count; ++f) {
      const prm::Field& fd = l.fields[f];
      if (kOursOnly.count({l.name, fd.name})) continue;
      std::string theirs = fd.name;
      if (auto r = kRenamed.find({l.name, fd.name}); r != kRenamed.end()) theirs = r->second;
      auto it = ifc().fields.find({l.name, theirs});
      if (it == ifc().fields.end()) {
        ADD_FAILURE() << l.name << "." << fd.name << " has no counterpart in mlx5_ifc.h";
        continue;
      }
      EXPECT_EQ(long(fd.bit_off), it->second.first) << l.name << "." << fd.name << " offset";
      const long want_width = fd.flexible() ? -1 : long(fd.bit_width);
      EXPECT_EQ(want_width, it->second.second) << l.name << "." << fd.name << " width";
      ++checked;
    }
  }
  // The count is reported in docs/prm.md; keep the floor close to it so a table cannot silently
  // fall out of the check.
  EXPECT_GE(checked, 930u);
  EXPECT_GE(structs, 140u);
  std::printf("checked %zu fields in %zu structs against mlx5_ifc.h\n", checked, structs);
}

TEST(PrmIfcOracle, FieldsOfOurOwnSitInReservedSpace) {
  for (const auto& [s, f] : kOursOnly) {
    const prm::Layout* l = prm::find_layout(s.c_str());
    ASSERT_NE(l, nullptr);
    const prm::Field* fd = prm::find_field(*l, f.c_str());
    ASSERT_NE(fd, nullptr);
    for (const auto& [name, ow] : ifc().by_struct.at(s)) {
      const long lo = ow.first, hi = ow.first + (ow.second < 0 ? 0 : ow.second);
      const bool overlaps = lo < long(fd->bit_off + fd->bit_width) && long(fd->bit_off) < hi;
      if (overlaps) EXPECT_EQ(name.rfind("reserved", 0), 0u) << s << "." << f << " overlaps " << name;
    }
  }
}

TEST(PrmIfcOracle, EmbeddedStructuresAreTheKernelsToo) {
  // An embedded field's width is its structure's size, and that structure is checked on its own.
  auto list = prm::all_layouts();
  for (uint32_t i = 0; i < list.count; ++i) {
    const prm::Layout& l = *list.items[i];
    for (uint32_t f = 0; f < l.count; ++f) {
      const prm::Field& fd = l.fields[f];
      if (!fd.sub) continue;
      EXPECT_EQ(fd.bit_width, fd.sub->size_bits) << l.name << "." << fd.name;
      EXPECT_EQ(prm::find_layout(fd.sub->name), fd.sub) << fd.sub->name << " is not in the registry";
    }
  }
}

// Our value set -> the prefix of the kernel's names for it, plus per-name exceptions.
struct SetMap {
  const char* set;
  const char* prefix;
  std::map<std::string, std::string> renamed;
};

const SetMap kSetMaps[] = {
    {"opcode", "MLX5_CMD_OP_", {{"QP_2ERR", "MLX5_CMD_OP_2ERR_QP"}, {"QP_2RST", "MLX5_CMD_OP_2RST_QP"}}},
    {"health_syndrome", "MLX5_INITIAL_SEG_HEALTH_SYNDROME_", {}},
    {"nic_interface", "MLX5_INITIAL_SEG_NIC_INTERFACE_", {}},
    {"cmd_status", "MLX5_CMD_STAT_", {}},
    {"cap_type", "MLX5_SET_HCA_CAP_OP_MOD_", {}},
    {"cap_mode", "HCA_CAP_OPMOD_", {}},
    {"query_pages_op_mod", "MLX5_QUERY_PAGES_IN_OP_MOD_", {}},
    {"manage_pages_op_mod", "MLX5_MANAGE_PAGES_IN_OP_MOD_", {}},
    {"teardown_profile", "MLX5_TEARDOWN_HCA_IN_PROFILE_", {}},
    {"eqc_status", "MLX5_EQC_STATUS_", {}},
    {"eqc_st", "MLX5_EQC_ST_", {}},
    {"cqc_status", "MLX5_CQC_STATUS_", {}},
    {"cqc_cqe_sz",
     "MLX5_CQC_CQE_SZ_",
     {{"BYTES_64", "MLX5_CQC_CQE_SZ_64_BYTES"}, {"BYTES_128", "MLX5_CQC_CQE_SZ_128_BYTES"}}},
    {"cqc_st", "MLX5_CQC_ST_", {}},
    {"cq_modify", "MLX5_CQ_MODIFY_", {}},
    {"modify_cq_op_mod", "MLX5_MODIFY_CQ_IN_OP_MOD_", {}},
    {"cq_resize_select", "MLX5_RESIZE_FIELD_SELECT_RESIZE_FIELD_SELECT_", {}},
    {"mkc_access_mode", "MLX5_MKC_ACCESS_MODE_", {}},
    {"qpc_state", "MLX5_QPC_STATE_", {}},
    {"qpc_st", "MLX5_QPC_ST_", {}},
    {"qpc_pm_state", "MLX5_QPC_PM_STATE_", {}},
    {"qpc_mtu", "MLX5_QPC_", {}},
    {"qpc_atomic_mode", "MLX5_QPC_ATOMIC_MODE_", {}},
    {"srqc_state", "MLX5_SRQC_STATE_", {}},
    {"rmpc_state", "MLX5_RMPC_STATE_", {}},
    {"wq_type", "MLX5_WQ_TYPE_", {}},
    {"roce_l3_type", "MLX5_ROCE_L3_TYPE_", {}},
    {"roce_version", "MLX5_ROCE_", {}},
    {"vport_state", "MLX5_QUERY_VPORT_STATE_OUT_STATE_", {}},
    {"reg_id", "MLX5_REG_", {}},
    {"access_reg_op_mod", "MLX5_ACCESS_REGISTER_IN_OP_MOD_", {}},
    {"event_type", "MLX5_EVENT_TYPE_", {}},
    {"port_change_subtype", "MLX5_PORT_CHANGE_SUBTYPE_", {}},
    {"cq_error_syndrome", "MLX5_CQ_ERROR_SYNDROME_", {}},
    {"qp_optpar", "MLX5_QP_OPTPAR_", {}},
    {"cqe_syndrome", "MLX5_CQE_SYNDROME_", {}},
};
// Checked against mlx5dv.h instead, or with no public source.
// (qpc_cs_res: Linux defines it in include/linux/mlx5/qp.h, which Debian's headers package lacks.)
const std::set<std::string> kSetsElsewhere = {"cqe_opcode",    "cqe_format",      "wqe_opcode",
                                              "wqe_ctrl_flag", "delivery_status", "qpc_cs_res"};

TEST(PrmIfcOracle, EveryNamedValueMatches) {
  auto sets = prm::all_constant_sets();
  size_t checked = 0;
  for (uint32_t i = 0; i < sets.count; ++i) {
    const prm::ConstantSet& s = *sets.items[i];
    if (kSetsElsewhere.count(s.name)) continue;
    const SetMap* m = nullptr;
    for (const SetMap& c : kSetMaps)
      if (std::string(c.set) == s.name) m = &c;
    if (!m) {
      ADD_FAILURE() << "value set " << s.name << " has no oracle mapping";
      continue;
    }
    for (uint32_t k = 0; k < s.count; ++k) {
      std::string theirs = std::string(m->prefix) + s.items[k].name;
      if (auto r = m->renamed.find(s.items[k].name); r != m->renamed.end()) theirs = r->second;
      auto it = ifc().constants.find(theirs);
      if (it == ifc().constants.end()) {
        ADD_FAILURE() << s.name << "::" << s.items[k].name << ": no " << theirs << " in the kernel headers";
        continue;
      }
      EXPECT_EQ((long long)s.items[k].value, it->second) << s.name << "::" << s.items[k].name;
      ++checked;
    }
  }
  EXPECT_GE(checked, 200u);
  std::printf("checked %zu named values against mlx5_ifc.h/device.h/qp.h/cq.h\n", checked);
}

TEST(PrmIfcOracle, LoneConstantsMatch) {
  const auto& c = ifc().constants;
  EXPECT_EQ(c.at("MLX5_CMD_DATA_BLOCK_SIZE"), prm::kMailboxDataBytes);
  EXPECT_EQ(c.at("MLX5_CMD_QUEUE_ENTRY_TYPE_PCIE_CMD_IF_TRANSPORT"), prm::kCmdQueueEntryTypePcie);
  EXPECT_EQ(c.at("MLX5_BF_OFFSET"), prm::kUarBlueFlame);
  EXPECT_EQ(c.at("MLX5_CQ_DOORBELL"), prm::kUarCqDoorbell);
  // The CQ arm command sits at bit 24 of the arm word (cq_uar_db.cmd, 4 bits below sn).
  EXPECT_EQ(c.at("MLX5_CQ_DB_REQ_NOT_SOL"), (long long)prm::kCqArmSolicited << 24);
  EXPECT_EQ(c.at("MLX5_CQ_DB_REQ_NOT"), (long long)prm::kCqArmNext << 24);
  EXPECT_EQ(32 - prm::cq_uar_db::cmd.bit_off - prm::cq_uar_db::cmd.bit_width, 24u);
  EXPECT_EQ(c.at("MLX5_PORT_UP"), prm::kPortUp);
  EXPECT_EQ(c.at("MLX5_PORT_DOWN"), prm::kPortDown);
  EXPECT_EQ(c.at("MLX5_PTYS_IB"), prm::kPtysIb);
  EXPECT_EQ(c.at("MLX5_PTYS_EN"), prm::kPtysEth);
  EXPECT_EQ(c.at("MLX5_IEEE_802_3_COUNTERS_GROUP"), prm::kPpcntIeee8023Group);
  EXPECT_EQ(c.at("MLX5_CQE_OWNER_MASK"), 1);
}

}  // namespace
