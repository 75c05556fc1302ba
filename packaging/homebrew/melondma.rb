# Homebrew formula for MelonDMA: libibverbs (rdma-core's API and ABI) with the soft RoCEv2 provider,
# libmlx5, libefa, librdma.dylib (Apple's name), headers, .pc files and the CMake package.
#   brew install --HEAD ./packaging/homebrew/melondma.rb && brew test melondma
# HOMEBREW_MELONDMA_GIT=<url or path of a git checkout> builds another repository (e.g. a local one).
# The test runs what ctest install_consumers runs (packaging/examples/check.sh). Never run on a Mac
# yet: docs/install.md.
class Melondma < Formula
  desc "RoCEv2 verbs for macOS: drop-in libibverbs with a userspace soft-RoCE provider"
  homepage "https://github.com/denmrnngp-cloud/MelonDMA"
  license any_of: ["GPL-2.0-only", "BSD-2-Clause"]
  head ENV.fetch("HOMEBREW_MELONDMA_GIT", "https://github.com/denmrnngp-cloud/MelonDMA.git"), branch: "main"

  depends_on "cmake" => [:build, :test]
  depends_on "googletest" => :build # the configure step finds it; no test is built here
  depends_on "ninja" => :build
  depends_on "pkgconf" => :test
  depends_on :macos

  def install
    args = %w[-DMELON_SANITIZE=OFF -DCMAKE_BUILD_TYPE=Release]
    system "cmake", "-S", ".", "-B", "build", "-G", "Ninja", *args, *std_cmake_args
    # The libraries alone (melon_verbs_libs: libibverbs, libmlx5, libefa, librdma.dylib), not the tests.
    system "cmake", "--build", "build", "--target", "melon_verbs_libs"
    system "cmake", "--install", "build"
  end

  test do
    # Both consumers (pkg-config, CMake find_package) against this keg, on a soft device on loopback.
    system "sh", pkgshare/"examples/check.sh", prefix, testpath/"consumers", "127.0.0.1"
  end
end
