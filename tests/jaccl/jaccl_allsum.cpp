// MLX's JACCL itself (its standalone library, built by jaccl_port.sh) as a consumer of our libibverbs:
// one rank of a two-rank all_sum at each size given, every element verified. JACCL reads its rank,
// device file and coordinator from the environment (JACCL_RANK, JACCL_IBV_DEVICES,
// JACCL_COORDINATOR). Exit 0 all verified; 1 no group; 4 a wrong sum.
#include <jaccl/jaccl.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  auto group = jaccl::init(/*strict=*/true);
  if (!group) return std::fprintf(stderr, "jaccl_allsum: no group\n"), 1;
  const int rank = group->rank();
  for (int a = 1; a < argc; a++) {
    const size_t n = std::strtoull(argv[a], nullptr, 0) / sizeof(float);
    // Rank r contributes (r + 1) * (i % 4093): the sum, 3 * (i % 4093), is exact in float.
    std::vector<float> in(n), out(n, -1.f);
    for (size_t i = 0; i < n; i++) in[i] = float((rank + 1) * (i % 4093));
    group->all_sum(in.data(), out.data(), n * sizeof(float), jaccl::Float32);
    for (size_t i = 0; i < n; i++)
      if (out[i] != float(3 * (i % 4093))) {
        std::fprintf(stderr, "jaccl_allsum: rank %d, %zu bytes: element %zu is %g, not %d\n", rank, n * 4, i,
                     double(out[i]), int(3 * (i % 4093)));
        return 4;
      }
    std::printf("jaccl_allsum: rank %d all_sum of %zu bytes verified\n", rank, n * 4);
  }
  return 0;
}
