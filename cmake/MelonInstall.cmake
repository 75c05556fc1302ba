# cmake --install: the libraries, the headers, one .pc file per library and a CMake package, where
# rdma-core's users look for them (docs/install.md). GNUInstallDirs picks the layout: lib/<multiarch>
# for the /usr prefix on Debian, lib elsewhere (Homebrew, /usr/local, a temp prefix).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# target | export name (MelonDMA::<name>) | pkg-config name | Requires.private | Description
set(MELON_INSTALLED_LIBRARIES
    "ibverbs|ibverbs|libibverbs||MelonDMA verbs library (rdma-core libibverbs API and ABI)"
    "melon_mlx5|mlx5|libmlx5|libibverbs|MelonDMA mlx5 direct verbs (rdma-core libmlx5 ABI)"
    "melon_efa|efa|libefa|libibverbs|MelonDMA EFA direct verbs (rdma-core libefa ABI)")

set(_pkgdir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/MelonDMA)
# In the .pc files, relative to ${prefix} (so PKG_CONFIG_SYSROOT_DIR and DESTDIR installs work).
foreach(d libdir includedir)
  string(TOUPPER ${d} D)
  set(_pc_${d} "${CMAKE_INSTALL_${D}}")
  if(NOT IS_ABSOLUTE "${_pc_${d}}")
    set(_pc_${d} "\${prefix}/${_pc_${d}}")
  endif()
endforeach()
foreach(row IN LISTS MELON_INSTALLED_LIBRARIES)
  string(REPLACE "|" ";" f "${row}")
  list(GET f 0 tgt)
  list(GET f 1 export_name)
  list(GET f 2 pc_name)
  list(GET f 3 pc_requires)
  list(GET f 4 pc_description)
  set_target_properties(${tgt} PROPERTIES EXPORT_NAME ${export_name})
  install(TARGETS ${tgt} EXPORT MelonDMATargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  # The .pc file is written at install time: `cmake --install --prefix` chooses the prefix then.
  get_target_property(pc_version ${tgt} VERSION)
  get_target_property(pc_lib ${tgt} OUTPUT_NAME)
  if(NOT pc_lib)
    set(pc_lib ${tgt})
  endif()
  install(CODE "
    set(PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
    set(PC_LIBDIR [=[${_pc_libdir}]=])
    set(PC_INCLUDEDIR [=[${_pc_includedir}]=])
    set(PC_NAME ${pc_name})
    set(PC_DESCRIPTION \"${pc_description}\")
    set(PC_VERSION ${pc_version})
    set(PC_LIB ${pc_lib})
    set(PC_REQUIRES \"${pc_requires}\")
    configure_file(\"${CMAKE_SOURCE_DIR}/packaging/pkgconfig/library.pc.in\"
                   \"${CMAKE_BINARY_DIR}/pkgconfig/${pc_name}.pc\" @ONLY)
    file(INSTALL \"${CMAKE_BINARY_DIR}/pkgconfig/${pc_name}.pc\"
         DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${_pkgdir}\")
  ")
endforeach()

install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/infiniband DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
if(APPLE)
  install(TARGETS melon_librdma LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

install(EXPORT MelonDMATargets NAMESPACE MelonDMA:: DESTINATION ${_cmakedir})
configure_package_config_file(${CMAKE_SOURCE_DIR}/packaging/cmake/MelonDMAConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/MelonDMAConfig.cmake INSTALL_DESTINATION ${_cmakedir})
# 0.x: a minor release may change what the package offers.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/MelonDMAConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/MelonDMAConfig.cmake ${CMAKE_BINARY_DIR}/cmake/MelonDMAConfigVersion.cmake
        DESTINATION ${_cmakedir})

# Two consumers and the script that builds and runs them against an install: ctest install_consumers
# and the Homebrew formula's test run it (packaging/examples/README.md).
install(DIRECTORY ${CMAKE_SOURCE_DIR}/packaging/examples/ DESTINATION ${CMAKE_INSTALL_DATADIR}/melondma/examples
        USE_SOURCE_PERMISSIONS)
