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

# Note [tests compile without optimisation]: the tests' own code (GoogleTest
# cases that call tandem and libtorch) compiles at -O0, with a PCH of its
# own built the same way (a PCH serves only code compiled with the same
# optimisation). What the tests run is the libraries' code, at -O2, and the
# testing helpers' (tandem_testing); a layer's test unit took 74 s to
# compile at -O2, and the tests' units were two fifths of a clean build.
function(tandem_test_pch target)
  if(NOT TARGET tandem_test_pch)
    add_library(tandem_test_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
    target_link_libraries(tandem_test_pch PUBLIC tandem_torch)
    target_compile_options(tandem_test_pch PRIVATE -O0)
    target_precompile_headers(tandem_test_pch PRIVATE ${PROJECT_SOURCE_DIR}/cmake/torch_pch.h)
  endif()
  target_compile_options(${target} PRIVATE -O0)
  target_precompile_headers(${target} REUSE_FROM tandem_test_pch)
endfunction()

# tandem_needs_cuda_module(target): the program loads the CUDA module
# (Note [CUDA as a module]), so building it builds the module.
function(tandem_needs_cuda_module target)
  if(C10_CUDA_LIBRARY AND NOT TANDEM_FUZZ)
    add_dependencies(${target} tandem_cuda)
  endif()
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
  # Note [unity layers]: with -DTANDEM_UNITY_LAYERS=ON (the default) the
  # layer's sources compile in batches of 8 files, one unit each, which
  # instantiates libtorch's templates once a batch: a clean build of the
  # tree took 189 s on the 2-core machine instead of 283 s. Names private
  # to a file share the batch's unit, so they are kept unique within a
  # layer (a same-signature clash fails to compile; overloads of one name
  # would meet silently). Edit-build loops may prefer OFF.
  set_target_properties(tandem_${name} PROPERTIES UNITY_BUILD ${TANDEM_UNITY_LAYERS} UNITY_BUILD_BATCH_SIZE 8)
  target_link_libraries(tandem_${name} PUBLIC ${L_DEPS})
  if(L_TORCH)
    target_link_libraries(tandem_${name} PUBLIC tandem_torch)
    tandem_torch_pch(tandem_${name})
  endif()
endfunction()

# tandem_test(layer SOURCES ... DEPS ...): one GoogleTest executable per layer,
# its tests registered with CTest under the label of its layer.
# QUICK FILTER: also a CTest test "<layer>.quick" (labels quick and the
# layer) running the executable's tests that FILTER (a --gtest_filter)
# selects in one process: `ctest -L quick`, the tier for the
# edit-build-test loop, touches every layer in a couple of minutes.
# Every test runs with OMP_WAIT_POLICY=PASSIVE (Note [idle OpenMP threads
# sleep]).
# COST N: CTest's cost of each of the layer's tests, so that `ctest -j` on a
# fresh build starts the long ones (the CLI's jobs, the install) first
# instead of leaving them to the end, one core idle.
# PROCESSORS N: the slots of `ctest -j` each of the layer's tests takes
# (Note [one test more than cores]); 1 unless given.
# Note [one test more than cores]: scripts/test runs `ctest -j` with one
# slot more than the machine has cores. At one a core the 2-core machine
# was busy 86% of the suite's time (user + sys over 2 x wall): tests wait
# on timeouts, on peers starting, on a killed rank's exit. The extra slot
# fills those waits: 799 s -> 730 s for the same tests (-j4: 683 s, but a
# test then runs beside three others and takes up to 1.6 times as long).
# A test that runs a parallel build of its own (the install's) takes two
# slots, so that it never shares the cores with more than one other.
# Note [idle OpenMP threads sleep]: `ctest -j N` runs N tests at once, and
# each tandem process's OpenMP team is as large as the machine. libgomp's
# threads spin between parallel regions (active wait), so two tests on two
# cores take each other's cycles for spinning: one epoch prefix of
# Fashion-MNIST took 7.5 s alone and 30 s beside another, 13 s with passive
# waits. One process alone is as fast either way. A job launched with
# --nproc-per-node gets cores / N threads per rank and does not oversubscribe.
set(TANDEM_TEST_ENV "OMP_WAIT_POLICY=PASSIVE")

# GROUP N: how many tests of a suite share a process (Note [test groups]);
# 1 unless given.
# Note [test groups]: each test executable loads libtorch when it starts,
# 0.4 s of CPU on the 2-core machine, which was all that 398 of the 640
# tests took besides: a fifth of the suite's CPU. So CTest runs the tests of
# one GoogleTest suite GROUP at a time in one process (cmake/TestGroups.cmake
# registers them after each link, as gtest_discover_tests would one by
# one): a CTest test is a suite (`ctest -R TrainerTest`) or a part of one
# (TrainerTest.2), and GoogleTest's report inside it names each test. The
# layers of many short tests group them; the CLI's and the layouts', whose
# tests take seconds each, run one a process.
function(tandem_test layer)
  cmake_parse_arguments(T "" "QUICK;COST;GROUP;PROCESSORS" "SOURCES;DEPS;LABELS" ${ARGN})
  set(cost 0)
  if(T_COST)
    set(cost ${T_COST})
  endif()
  set(processors 1)
  if(T_PROCESSORS)
    set(processors ${T_PROCESSORS})
  endif()
  set(group 1)
  if(T_GROUP)
    set(group ${T_GROUP})
  endif()
  set(exe tandem_${layer}_tests)
  add_executable(${exe} ${T_SOURCES})
  # Note [one unit per layer's tests]: a layer's test files compile as one
  # translation unit (CMake's unity build), which instantiates libtorch's
  # and GoogleTest's templates once instead of once a file: four of the
  # optim tests took 8.4 s together against 16 s apart. Names a file keeps
  # to itself go in a namespace named for the file where another file of
  # the layer has the same ones; a clash is a compile error, not a silent
  # merge.
  set_target_properties(${exe} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
  target_link_libraries(${exe} PRIVATE ${T_DEPS} tandem_testing GTest::gtest tandem_torch)
  tandem_needs_cuda_module(${exe})
  target_compile_definitions(${exe} PRIVATE
    TANDEM_PYTHON="${TANDEM_PYTHON}"
    TANDEM_CLI="$<TARGET_FILE:tandem>"
    TANDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  tandem_test_pch(${exe})  # Note [tests compile without optimisation]
  set(groups_file "${CMAKE_CURRENT_BINARY_DIR}/${exe}_groups.cmake")
  string(REPLACE ";" "," labels "${layer};${T_LABELS}")
  add_custom_command(TARGET ${exe} POST_BUILD BYPRODUCTS "${groups_file}"
    COMMAND "${CMAKE_COMMAND}" -D "EXE=$<TARGET_FILE:${exe}>" -D "CTEST_FILE=${groups_file}" -D "GROUP=${group}"
            -D "LABELS=${labels}" -D "COST=${cost}" -D "PROCESSORS=${processors}"
            -D "ENVIRONMENT=${TANDEM_TEST_ENV}" -D "TIMEOUT=900"
            -P "${PROJECT_SOURCE_DIR}/cmake/TestGroups.cmake"
    VERBATIM)
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${exe}_include.cmake")
  file(WRITE "${include_file}" "if(EXISTS \"${groups_file}\")\n  include(\"${groups_file}\")\nelse()\n"
                               "  add_test(${exe}_NOT_BUILT ${exe}_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
  if(T_QUICK)
    add_test(NAME ${layer}.quick COMMAND ${exe} --gtest_filter=${T_QUICK})
    set_tests_properties(${layer}.quick PROPERTIES LABELS "quick;${layer}" TIMEOUT 300
                         ENVIRONMENT "${TANDEM_TEST_ENV}")
  endif()
endfunction()
