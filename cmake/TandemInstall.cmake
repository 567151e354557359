# `cmake --install BUILD --prefix PREFIX`: the library for programs of one's
# own, found with find_package(tandem) (docs/BUILD.md, "Using the library";
# examples/ holds such programs, built against an install by a test).
#
#   PREFIX/bin/tandem                          the CLI (train, eval, launch)
#   PREFIX/include/tandem/<layer>/*.h          the public headers
#   PREFIX/lib/libtandem_<layer>.a             one static library a layer
#   PREFIX/lib/cmake/tandem/                   tandemConfig.cmake and the targets
#
# Targets: tandem::<layer> (util, dist, data, models, optim, parallel,
# checkpoint, observe, engine, launch, cli), each linking the layers it stands on, and
# tandem::tandem, every layer but cli. The installed libraries are built
# against this build's libtorch, so a program must find that same torch
# (the config asks for Torch 2.11 exactly, as this tree does).

include(CMakePackageConfigHelpers)

# Every layer but the CLI's, for `target_link_libraries(app PRIVATE tandem::tandem)`.
add_library(tandem_all INTERFACE)
target_link_libraries(tandem_all INTERFACE tandem_util tandem_dist tandem_data tandem_models
                      tandem_optim tandem_parallel tandem_plan tandem_checkpoint
                      tandem_observe tandem_engine tandem_launch)
set_target_properties(tandem_all PROPERTIES EXPORT_NAME tandem)
add_library(tandem::tandem ALIAS tandem_all)

install(TARGETS tandem_torch tandem_all EXPORT tandemTargets)
install(TARGETS tandem RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tandem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(TANDEM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tandem)
install(EXPORT tandemTargets NAMESPACE tandem:: DESTINATION ${TANDEM_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tandemConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/tandemConfig.cmake
                              INSTALL_DESTINATION ${TANDEM_CMAKE_DIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tandemConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tandemConfig.cmake ${PROJECT_BINARY_DIR}/tandemConfigVersion.cmake
        DESTINATION ${TANDEM_CMAKE_DIR})
