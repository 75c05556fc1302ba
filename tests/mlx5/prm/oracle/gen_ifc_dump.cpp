// Host tool: reads the kernel's mlx5_ifc.h and writes a C program that prints every field of every
// `struct|union mlx5_ifc_<name>_bits` as one TSV line: "<name>\t<field>\t<bit offset>\t<bit width>".
// A width of -1 marks a flexible array (only its offset is known). One "<name>\t-\t0\t<size>" line
// per struct gives its size. In those structs every bit is a byte (`u8 f[width]`), so offsetof() is
// the bit offset and sizeof() the width; the C compiler, not this parser, computes the numbers.
//
// The parser only has to find struct names and top-level member names. Members of anonymous nested
// bodies are promoted (offsetof reaches them); members of named nested bodies are dropped and the
// named member itself is kept.
//
// Enumerators are printed as "enum\t<NAME>\t<value>": all of mlx5_ifc.h's (the compiler evaluates
// them), plus, from each extra header given (device.h, qp.h, cq.h, doorbell.h: kernel-only headers
// that cannot be included in userspace), the enumerators and #defines whose value is a plain literal.
//
// usage: gen_ifc_dump <mlx5_ifc.h> <out.c> [extra kernel header...]
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Member {
  std::string name;
  bool flexible;
};

struct Aggregate {
  std::string kind;  // "struct" or "union"
  std::string name;
  std::vector<Member> members;
};

std::string strip_comments(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 2, "/*") == 0) {
      size_t e = s.find("*/", i + 2);
      i = (e == std::string::npos) ? s.size() : e + 2;
    } else if (s.compare(i, 2, "//") == 0) {
      size_t e = s.find('\n', i);
      i = (e == std::string::npos) ? s.size() : e;
    } else {
      out += s[i++];
    }
  }
  return out;
}

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// One member declaration, e.g. "u8 name[0x10]" or "struct mlx5_ifc_x_bits name[4]".
// Returns false when the text declares nothing with a name.
bool parse_member(const std::string& decl, Member* m) {
  size_t br = decl.find('[');
  std::string head = decl.substr(0, br);
  size_t end = head.find_last_not_of(" \t\n");
  if (end == std::string::npos) return false;
  size_t begin = end;
  while (begin > 0 && is_ident(head[begin - 1])) --begin;
  m->name = head.substr(begin, end - begin + 1);
  if (m->name.empty() || !(std::isalpha(static_cast<unsigned char>(m->name[0])) || m->name[0] == '_')) return false;
  m->flexible = false;
  if (br != std::string::npos) {
    size_t close = decl.find(']', br);
    std::string dim = decl.substr(br + 1, close - br - 1);
    dim.erase(0, dim.find_first_not_of(" \t"));
    m->flexible = dim.empty() || dim == "0";
  }
  return true;
}

}  // namespace

// The scanner proper: a small hand-written pass over the comment-free text.
namespace {

std::vector<Aggregate> scan(const std::string& t) {
  std::vector<Aggregate> out;
  size_t i = 0;
  const size_t n = t.size();
  auto skip_ws = [&](size_t p) {
    while (p < n && std::isspace(static_cast<unsigned char>(t[p]))) ++p;
    return p;
  };
  while (i < n) {
    // Only declarations at file scope start with "struct"/"union" followed by "mlx5_ifc_*_bits {".
    size_t kwlen = 0;
    if (t.compare(i, 7, "struct ") == 0)
      kwlen = 7;
    else if (t.compare(i, 6, "union ") == 0)
      kwlen = 6;
    if (kwlen == 0 || (i > 0 && is_ident(t[i - 1]))) {
      ++i;
      continue;
    }
    size_t p = skip_ws(i + kwlen);
    size_t q = p;
    while (q < n && is_ident(t[q])) ++q;
    std::string tag = t.substr(p, q - p);
    size_t b = skip_ws(q);
    if (tag.rfind("mlx5_ifc_", 0) != 0 || tag.size() < 14 || tag.compare(tag.size() - 5, 5, "_bits") != 0 || b >= n ||
        t[b] != '{') {
      i = q;
      continue;
    }
    Aggregate agg;
    agg.kind = kwlen == 7 ? "struct" : "union";
    agg.name = tag.substr(9, tag.size() - 14);
    // Walk the body. Each nesting level keeps its own pending member list.
    std::vector<std::vector<Member>> levels(1);
    size_t k = b + 1;
    std::string decl;
    while (k < n) {
      char c = t[k];
      if (c == '{') {
        levels.emplace_back();
        decl.clear();
        ++k;
      } else if (c == '}') {
        std::vector<Member> inner = std::move(levels.back());
        levels.pop_back();
        size_t after = k + 1;
        size_t semi = t.find(';', after);
        std::string tail = t.substr(after, semi - after);
        k = semi + 1;
        if (levels.empty()) {  // end of the aggregate itself
          agg.members = std::move(inner);
          break;
        }
        Member named;
        if (parse_member(tail, &named)) {
          levels.back().push_back(named);  // named nested body: keep the name only
        } else {
          for (auto& m : inner) levels.back().push_back(m);  // anonymous: promote
        }
        decl.clear();
      } else if (c == ';') {
        Member m;
        if (parse_member(decl, &m)) levels.back().push_back(m);
        decl.clear();
        ++k;
      } else {
        decl += c;
        ++k;
      }
    }
    out.push_back(std::move(agg));
    i = k;
  }
  return out;
}

// Enumerator names of every `enum [tag] { ... }` in `t`, with the value text when `= value` is given.
struct Enumerator {
  std::string name;
  std::string value;  // empty when implicit
};

std::vector<Enumerator> scan_enums(const std::string& t) {
  std::vector<Enumerator> out;
  size_t i = 0;
  while ((i = t.find("enum", i)) != std::string::npos) {
    if ((i > 0 && is_ident(t[i - 1])) || is_ident(t[i + 4])) {
      i += 4;
      continue;
    }
    size_t b = t.find_first_of("{;()", i);
    if (b == std::string::npos || t[b] != '{') {
      i += 4;
      continue;
    }
    size_t e = t.find('}', b);
    std::string body = t.substr(b + 1, e - b - 1);
    std::stringstream items(body);
    std::string item;
    while (std::getline(items, item, ',')) {
      size_t eq = item.find('=');
      std::string name = item.substr(0, eq);
      name.erase(0, name.find_first_not_of(" \t\n"));
      name.erase(name.find_last_not_of(" \t\n") + 1);
      if (name.empty() || !std::all_of(name.begin(), name.end(), is_ident)) continue;
      std::string value;
      if (eq != std::string::npos) {
        value = item.substr(eq + 1);
        value.erase(0, value.find_first_not_of(" \t\n"));
        value.erase(value.find_last_not_of(" \t\n") + 1);
      }
      out.push_back({name, value});
    }
    i = e;
  }
  return out;
}

// `#define NAME value` lines.
std::vector<Enumerator> scan_defines(const std::string& t) {
  std::vector<Enumerator> out;
  std::stringstream lines(t);
  std::string line;
  while (std::getline(lines, line)) {
    std::stringstream ls(line);
    std::string hash, name, value;
    ls >> hash >> name;
    if (hash != "#define" || name.find('(') != std::string::npos) continue;
    std::getline(ls, value);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t") + 1);
    out.push_back({name, value});
  }
  return out;
}

// A value the dump program can evaluate without the rest of a kernel-only header: literals,
// shifts, BIT(n), parentheses.
bool plain_value(const std::string& v) {
  if (v.empty()) return false;
  for (size_t i = 0; i < v.size();) {
    char c = v[i];
    if (std::isspace(static_cast<unsigned char>(c)) || c == '(' || c == ')' || c == '<' || c == '|') {
      ++i;
      continue;
    }
    if (!is_ident(c)) return false;
    size_t j = i;
    while (j < v.size() && is_ident(v[j])) ++j;
    const std::string token = v.substr(i, j - i);
    // Numeric literals (0x.., decimal, with u/l suffixes) and BIT(); any other name is not plain.
    if (!std::isdigit(static_cast<unsigned char>(token[0])) && token != "BIT") return false;
    i = j;
  }
  return true;
}

std::string read_file(const char* path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "gen_ifc_dump: cannot read %s\n", path);
    std::exit(1);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <mlx5_ifc.h> <out.c> [extra kernel header...]\n", argv[0]);
    return 2;
  }
  const std::string ifc = strip_comments(read_file(argv[1]));
  std::vector<Aggregate> aggs = scan(ifc);
  std::ofstream out(argv[2]);
  out << "/* Generated by gen_ifc_dump from " << argv[1]
      << "; do not edit. */\n"
         "#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n"
         "typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;\n"
         "#define BIT(n) (1UL << (n))\n#define BIT_ULL(n) (1ULL << (n))\n"
         "#include <mlx5_ifc.h>\n"
         "int main(void) {\n";
  size_t fields = 0;
  for (const Aggregate& a : aggs) {
    const std::string type = a.kind + " mlx5_ifc_" + a.name + "_bits";
    out << "  /* " << a.name << " */\n";
    out << "  printf(\"" << a.name << "\\t-\\t0\\t%ld\\n\", (long)sizeof(" << type << "));\n";
    for (const Member& m : a.members) {
      if (m.flexible)
        out << "  printf(\"" << a.name << "\\t" << m.name << "\\t%ld\\t-1\\n\", (long)offsetof(" << type << ", "
            << m.name << "));\n";
      else
        out << "  printf(\"" << a.name << "\\t" << m.name << "\\t%ld\\t%ld\\n\", (long)offsetof(" << type << ", "
            << m.name << "), (long)sizeof(((" << type << " *)0)->" << m.name << "));\n";
      ++fields;
    }
  }
  // Enumerators: mlx5_ifc.h's are all compiled in; the extra headers' only when plain.
  std::set<std::string> seen;
  size_t enums = 0;
  for (const Enumerator& e : scan_enums(ifc)) {
    if (!seen.insert(e.name).second) continue;
    out << "  printf(\"enum\\t" << e.name << "\\t%lld\\n\", (long long)(" << e.name << "));\n";
    ++enums;
  }
  for (int a = 3; a < argc; ++a) {
    const std::string text = strip_comments(read_file(argv[a]));
    std::vector<Enumerator> items = scan_enums(text);
    for (const Enumerator& d : scan_defines(text)) items.push_back(d);
    for (const Enumerator& e : items) {
      if ((e.name.rfind("MLX5_", 0) != 0 && e.name.rfind("HCA_CAP_OPMOD_", 0) != 0) || !plain_value(e.value) ||
          !seen.insert(e.name).second)
        continue;
      out << "  printf(\"enum\\t" << e.name << "\\t%lld\\n\", (long long)(" << e.value << "));\n";
      ++enums;
    }
  }
  out << "  return 0;\n}\n";
  std::fprintf(stderr, "gen_ifc_dump: %zu structs/unions, %zu fields, %zu constants\n", aggs.size(), fields, enums);
  return 0;
}
