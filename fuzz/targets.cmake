# The fuzz targets and their ctest smoke runs, shared by the `fuzz` preset's tree (which
# builds the targets, fuzz/CMakeLists.txt) and the test trees (release, debug, sanitize),
# which run the smoke tests against the binaries of build/fuzz when they exist, so that one
# ctest run (scripts/test.sh) covers both.

# target name -> the reader it drives
set(OASES_FUZZ_TARGETS
  safetensors   # io::SafetensorsFile::open and every read
  token_shard   # data::load_token_shard
  run_config    # plan::parse_run_config (TOML text and --set overrides)
  profile       # planner::profile_from_json
  plan)         # planner::read_plan, through plan::layer_degrees

# Each smoke run executes its seed corpus, then this many fuzzing executions with a fixed seed
# (1 to 12 s a target on a busy 2-core Xeon); the time cap only stops a run on a much slower
# machine.
set(OASES_FUZZ_SMOKE_RUNS 20000)
set(OASES_FUZZ_SMOKE_SECONDS 30)

# Registers the test fuzz.<target> for every target whose binary (<binary_dir>/fuzz_<target>)
# exists, or is built in this tree; each run keeps its scratch corpus and any crashing input
# under <scratch_dir>/<target>.
function(oases_add_fuzz_smoke_tests binary_dir scratch_dir)
  set(fuzz_dir ${PROJECT_SOURCE_DIR}/fuzz)
  foreach(name ${OASES_FUZZ_TARGETS})
    set(binary ${binary_dir}/fuzz_${name})
    if(NOT TARGET fuzz_${name} AND NOT EXISTS ${binary})
      continue()
    endif()
    set(dict_args)
    if(EXISTS ${fuzz_dir}/dict/${name}.dict)
      set(dict_args -dict=${fuzz_dir}/dict/${name}.dict)
    endif()
    add_test(NAME fuzz.${name}
      COMMAND bash ${fuzz_dir}/smoke_test.sh ${binary} ${fuzz_dir}/corpus/${name}
              ${scratch_dir}/${name} ${OASES_FUZZ_SMOKE_RUNS} ${OASES_FUZZ_SMOKE_SECONDS}
              ${dict_args})
    set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 300)
  endforeach()
endfunction()
