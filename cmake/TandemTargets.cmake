# Helpers that give every layer the same shape (see docs/ARCHITECTURE.md).
#
# One precompiled header of libtorch is built once, in tandem_pch, and reused
# by every target that includes torch: with 2 cores this turns a clean build
# from tens of minutes into a few (docs/BUILD.md).

add_library(tandem_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
target_link_libraries(tandem_pch PUBLIC tandem_torch)
target_precompile_headers(tandem_pch PRIVATE ${PROJECT_SOURCE_DIR}/cmake/torch_pch.h)

# tandem_torch_pch(target): reuse the shared libtorch PCH.
function(tandem_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM tandem_pch)
endfunction()

# tandem_layer(name [TORCH] SOURCES ... DEPS ...): the static library
# tandem_<name> built from src/<name>/, with the public include/ tree;
# `cmake --install` installs it as tandem::<name> (cmake/tandemConfig.cmake.in).
function(tandem_layer name)
  cmake_parse_arguments(L "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(tandem_${name} STATIC ${L_SOURCES})
  add_library(tandem::${name} ALIAS tandem_${name})
  target_include_directories(tandem_${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                                   $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  # Installed as tandem::<name>, the name it has in this tree (docs/BUILD.md).
  set_target_properties(tandem_${name} PROPERTIES EXPORT_NAME ${name})
  if(NOT TANDEM_FUZZ)
    install(TARGETS tandem_${name} EXPORT tandemTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
  target_compile_options(tandem_${name} PRIVATE -Wall -Wextra)
  target_link_libraries(tandem_${name} PUBLIC ${L_DEPS})
  if(L_TORCH)
    target_link_libraries(tandem_${name} PUBLIC tandem_torch)
    tandem_torch_pch(tandem_${name})
  endif()
endfunction()

# tandem_test(layer SOURCES ... DEPS ...): one GoogleTest executable per layer,
# each test registered with CTest under the label of its layer.
# QUICK FILTER: also a CTest test "<layer>.quick" (labels quick and the
# layer) running the executable's tests that FILTER (a --gtest_filter)
# selects in one process: `ctest -L quick`, the tier for the
# edit-build-test loop, touches every layer in a couple of minutes.
# Every test runs with OMP_WAIT_POLICY=PASSIVE (Note [idle OpenMP threads
# sleep]).
# COST N: CTest's cost of each of the layer's tests, so that `ctest -j` on a
# fresh build starts the long ones (the CLI's jobs, the install) first
# instead of leaving them to the end, one core idle.
# Note [idle OpenMP threads sleep]: `ctest -j N` runs N tests at once, and
# each tandem process's OpenMP team is as large as the machine. libgomp's
# threads spin between parallel regions (active wait), so two tests on two
# cores take each other's cycles for spinning: one epoch prefix of
# Fashion-MNIST took 7.5 s alone and 30 s beside another, 13 s with passive
# waits. One process alone is as fast either way. A job launched with
# --nproc-per-node gets cores / N threads per rank and does not oversubscribe.
set(TANDEM_TEST_ENV "OMP_WAIT_POLICY=PASSIVE")

function(tandem_test layer)
  cmake_parse_arguments(T "" "QUICK;COST" "SOURCES;DEPS;LABELS" ${ARGN})
  set(cost 0)
  if(T_COST)
    set(cost ${T_COST})
  endif()
  set(exe tandem_${layer}_tests)
  add_executable(${exe} ${T_SOURCES})
  target_link_libraries(${exe} PRIVATE ${T_DEPS} tandem_testing GTest::gtest GTest::gtest_main tandem_torch)
  target_compile_definitions(${exe} PRIVATE
    TANDEM_PYTHON="${TANDEM_PYTHON}"
    TANDEM_CLI="$<TARGET_FILE:tandem>"
    TANDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  tandem_torch_pch(${exe})
  gtest_discover_tests(${exe} DISCOVERY_TIMEOUT 120
    PROPERTIES LABELS "${layer};${T_LABELS}" TIMEOUT 900 COST ${cost} ENVIRONMENT "${TANDEM_TEST_ENV}")
  if(T_QUICK)
    add_test(NAME ${layer}.quick COMMAND ${exe} --gtest_filter=${T_QUICK})
    set_tests_properties(${layer}.quick PROPERTIES LABELS "quick;${layer}" TIMEOUT 300
                         ENVIRONMENT "${TANDEM_TEST_ENV}")
  endif()
endfunction()
