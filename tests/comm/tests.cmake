# MPI tests of comm/ (ctest label `mpi`): every comm/*_mpitest.cc is a GoogleTest binary with
# a main that initialises MPI first (mpi_test_main.cc), run under mpirun at 1 to 4 ranks. A
# failure on any rank makes every rank exit non-zero, and so mpirun.
#
# Included from tests/CMakeLists.txt, so CMAKE_CURRENT_SOURCE_DIR is tests/ here.

# --oversubscribe: more ranks than cores is the point here (2 cores in CI). Shared memory
# (vader) between ranks of one machine; no network transport is probed or needed.
set(OASES_MPIRUN_FLAGS --allow-run-as-root --oversubscribe --mca btl self,vader)

add_library(oases_mpitest_main STATIC ${CMAKE_CURRENT_SOURCE_DIR}/comm/mpi_test_main.cc)
target_link_libraries(oases_mpitest_main PUBLIC oases_lib GTest::gtest PRIVATE oases_warnings)

file(GLOB OASES_COMM_MPI_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/comm/*_mpitest.cc)
foreach(test_source ${OASES_COMM_MPI_TEST_SOURCES})
  get_filename_component(test_name ${test_source} NAME_WE)
  add_executable(${test_name} ${test_source})
  target_include_directories(${test_name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${test_name} PRIVATE oases_mpitest_main oases_warnings)
  foreach(ranks 1 2 3 4)
    add_test(NAME comm.${test_name}.np${ranks}
      COMMAND ${MPIEXEC_EXECUTABLE} ${OASES_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
              $<TARGET_FILE:${test_name}>)
    # OpenMPI leaves its own allocations to process exit; under AddressSanitizer that reads as
    # leaks in libmpi/libopen-pal (none in oases), so leak checking is off for these tests
    # (OASES_MPI_ASAN_ENVIRONMENT, tests/CMakeLists.txt).
    set_tests_properties(comm.${test_name}.np${ranks} PROPERTIES
      LABELS "mpi;comm" TIMEOUT ${OASES_MPI_TEST_TIMEOUT} PROCESSORS ${ranks}
      ENVIRONMENT_MODIFICATION ${OASES_MPI_ASAN_ENVIRONMENT})
  endforeach()
endforeach()
