/* librdma.dylib (macOS): Apple's name for a verbs library, with no code of its own. Everything it
 * offers is libibverbs', re-exported (src/verbs/CMakeLists.txt, docs/macos.md). */
