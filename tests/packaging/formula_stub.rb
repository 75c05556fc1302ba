# Loads packaging/homebrew/melondma.rb with a stand-in for Homebrew's Formula DSL (Homebrew itself is
# not here) and prints what its install and test blocks would run, one command a line, for
# formula_test.sh to compare with what ctest install_consumers runs.
require "pathname"

class Formula
  @@calls = []
  def self.calls = @@calls
  %i[desc homepage license head url sha256 version].each do |m|
    define_singleton_method(m) { |*a, **k| @@calls << ["#{m}", *a.map(&:to_s)] }
  end
  def self.depends_on(spec) = @@calls << ["depends_on", spec.to_s]
  def self.test(&blk) = (@@test = blk)
  def self.test_block = @@test
  def std_cmake_args = %w[-DCMAKE_INSTALL_PREFIX=PREFIX -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_BUILD_TYPE=Release]
  def prefix = Pathname("PREFIX")
  def pkgshare = Pathname("PREFIX/share/melondma")
  def testpath = Pathname("TESTPATH")
  def system(*cmd) = puts(["system", *cmd.map(&:to_s)].join(" "))
end

load ARGV.fetch(0)
klass = Object.const_get(:Melondma)
raise "Melondma is not a Formula" unless klass < Formula
Formula.calls.each { |c| puts c.join(" ") }
f = klass.new
puts "-- install"
f.install
puts "-- test"
f.instance_eval(&Formula.test_block)
