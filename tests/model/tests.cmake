# PyTorch parity of the GPT, LLaMA and BERT models (docs/testing.md, "PyTorch parity"):
# parity_test.py builds a random model in PyTorch (torch_gpt.py, torch_llama.py,
# torch_bert.py), runs parity_engine on the same weights and batch in fp64 and in fp32, and
# compares logits, loss, every gradient, a 10-step AdamW trajectory and the final parameters:
# fp64 within relative 1e-10 of PyTorch fp64, fp32 no further from fp64 than PyTorch fp32 is.
# The reference models check themselves first (torch_*.py --self-test).
#
# Included from tests/CMakeLists.txt, so CMAKE_CURRENT_SOURCE_DIR is tests/ here.

set(OASES_PARITY_PYTHON /usr/bin/python3)  # the interpreter that sees Debian's python3-torch
set(OASES_PARITY_ENGINE_SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/model/parity_engine.cc)

# Registered whether or not torch imports now: the test command installs python3-torch, and if
# it is still missing the scripts fail with a message saying so, rather than skipping.
execute_process(COMMAND ${OASES_PARITY_PYTHON} -c "import torch, numpy"
  RESULT_VARIABLE oases_parity_torch_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT oases_parity_torch_rc EQUAL 0)
  message(WARNING "oases: ${OASES_PARITY_PYTHON} cannot import torch and numpy; the model.torch_"
    "* tests will fail until Debian's python3-torch is installed")
endif()

# The reference models against independent formulations: GQA vs MHA with repeated k/v,
# rotate_half vs complex rotation, naive per-element loops, gradcheck in float64; the MoE layer
# (torch_moe.py, every gate of ops/moe.h) against a naive per-token loop and gradcheck with
# routing held fixed, whole GPT and LLaMA MoE models by gradcheck.
foreach(reference llama bert moe)
  add_test(NAME model.torch_${reference}_self_test
    COMMAND ${OASES_PARITY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/model/torch_${reference}.py
      --self-test)
  set_tests_properties(model.torch_${reference}_self_test PROPERTIES
    LABELS "model;torch" TIMEOUT 300)
endforeach()
# philox.py (the references' Philox 4x32-10, dropout rule and MoE draws) against known answers
# printed by core/philox.h and Random123's published vectors.
add_test(NAME model.philox_py_self_test
  COMMAND ${OASES_PARITY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/model/philox.py --self-test)
set_tests_properties(model.philox_py_self_test PROPERTIES LABELS "model;torch" TIMEOUT 120)

# The driver itself, on torch_engine.py: the engine protocol implemented with the reference
# models (fed the micro-batch in reverse order, so it rounds as another correct engine would).
# It must pass every architecture in both precisions, under mpirun too, and must report each
# planted bug (OASES_TORCH_ENGINE_BUG) in the run that can see it.
set(oases_parity_driver ${OASES_PARITY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/model/parity_test.py
  --engine ${CMAKE_CURRENT_SOURCE_DIR}/model/torch_engine.py --mpirun ${MPIEXEC_EXECUTABLE})
set(oases_parity_small_llama --arch llama --layers 1 --hidden 32 --heads 4 --kv-heads 2
  --ffn-hidden 40 --vocab-size 37 --seq-len 11 --micro-batch 3 --steps 3)
add_test(NAME model.torch_parity_driver_llama_gqa_tp2
  COMMAND ${oases_parity_driver} --arch llama --layers 2 --hidden 64 --heads 4 --kv-heads 2
    --ffn-hidden 176 --vocab-size 250 --seq-len 24 --micro-batch 2 --rope-theta 500
    --norm-eps 1e-6 --tp 2 --workdir ${CMAKE_CURRENT_BINARY_DIR}/model/torch_parity_driver_llama)
add_test(NAME model.torch_parity_driver_bert_odd_shapes
  COMMAND ${oases_parity_driver} --arch bert --layers 2 --hidden 48 --heads 3 --ffn-hidden 120
    --vocab-size 203 --seq-len 29 --micro-batch 3
    --workdir ${CMAKE_CURRENT_BINARY_DIR}/model/torch_parity_driver_bert)
add_test(NAME model.torch_parity_driver_gpt_odd_shapes
  COMMAND ${oases_parity_driver} --arch gpt --layers 3 --hidden 48 --heads 3 --ffn-hidden 192
    --vocab-size 197 --seq-len 37 --micro-batch 3
    --workdir ${CMAKE_CURRENT_BINARY_DIR}/model/torch_parity_driver_gpt)
set_tests_properties(model.torch_parity_driver_llama_gqa_tp2 PROPERTIES PROCESSORS 2)
set_tests_properties(model.torch_parity_driver_llama_gqa_tp2
  model.torch_parity_driver_bert_odd_shapes model.torch_parity_driver_gpt_odd_shapes
  PROPERTIES LABELS "model;torch" TIMEOUT 600)
# Each planted bug must be reported by name: a 1e-5 error in every gradient (fp32 sees it too),
# a missing gradient clip (the trajectory moves), F32 output from an fp64 run.
function(oases_add_parity_driver_bug_test bug expected)
  add_test(NAME model.torch_parity_driver_finds_${bug}
    COMMAND ${oases_parity_driver} ${oases_parity_small_llama}
      --workdir ${CMAKE_CURRENT_BINARY_DIR}/model/torch_parity_driver_${bug})
  set_tests_properties(model.torch_parity_driver_finds_${bug} PROPERTIES
    LABELS "model;torch" TIMEOUT 300 ENVIRONMENT "OASES_TORCH_ENGINE_BUG=${bug}"
    PASS_REGULAR_EXPRESSION "${expected}" FAIL_REGULAR_EXPRESSION "PASS: ")
endfunction()
oases_add_parity_driver_bug_test(grad_scale "FAIL fp32 grad[.][^\n]*torch fp32 error")
oases_add_parity_driver_bug_test(no_clip "FAIL fp64 losses: engine fp64 error")
oases_add_parity_driver_bug_test(wrong_dtype "not F64 as a fp64 run must write")

# Mixture of experts (ops/moe.h, torch_moe.py): tiny GPT and LLaMA models whose MoE layers
# must overflow their capacity (and, for gshard, skip second choices at random) in the
# reference's step-0 training forward (--expect-routing); the parity tests below use the same
# argument lists with parity_engine.
set(oases_moe_gpt --arch gpt --layers 2 --hidden 32 --heads 4 --ffn-hidden 64 --vocab-size 61
  --seq-len 16 --micro-batch 4 --steps 4)
set(oases_moe_llama --arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn-hidden 48
  --vocab-size 61 --seq-len 16 --micro-batch 2 --steps 4)
# gshard in groups of half a sequence, z-loss and aux loss on.
set(oases_moe_gshard_gpt ${oases_moe_gpt} --moe-every 2 --experts 4 --moe-gate gshard
  --capacity-factor 1.0 --moe-group-size 8 --moe-aux-loss-coef 0.01 --moe-z-loss-coef 0.001
  --expect-routing overflow,random-skip)
# noisy top-2 with learned noise, in groups of two sequences, a larger evaluation capacity.
set(oases_moe_noisy_topk_llama ${oases_moe_llama} --moe-every 2 --experts 4
  --moe-gate noisy-topk --moe-top-k 2 --capacity-factor 1.0 --eval-capacity-factor 2.0
  --moe-group-size 32 --moe-aux-loss-coef 0.05 --moe-z-loss-coef 0.001 --moe-router-noise 0.5
  --expert-dropout 0.1 --expect-routing overflow)
add_test(NAME model.torch_parity_driver_moe_gshard_gpt
  COMMAND ${oases_parity_driver} ${oases_moe_gshard_gpt}
    --workdir ${CMAKE_CURRENT_BINARY_DIR}/model/torch_parity_driver_moe_gshard_gpt)
add_test(NAME model.torch_parity_driver_moe_noisy_topk_llama
  COMMAND ${oases_parity_driver} ${oases_moe_noisy_topk_llama}
    --workdir ${CMAKE_CURRENT_BINARY_DIR}/model/torch_parity_driver_moe_noisy_topk_llama)
set_tests_properties(model.torch_parity_driver_moe_gshard_gpt
  model.torch_parity_driver_moe_noisy_topk_llama PROPERTIES LABELS "model;torch" TIMEOUT 300)
# Planted MoE bugs: the objective without aux and z terms, every step drawing step 0's random
# numbers, logits computed in training mode.
function(oases_add_parity_driver_moe_bug_test bug expected)
  add_test(NAME model.torch_parity_driver_finds_${bug}
    COMMAND ${oases_parity_driver} ${oases_moe_gshard_gpt} --precision fp64
      --workdir ${CMAKE_CURRENT_BINARY_DIR}/model/torch_parity_driver_${bug})
  set_tests_properties(model.torch_parity_driver_finds_${bug} PROPERTIES
    LABELS "model;torch" TIMEOUT 300 ENVIRONMENT "OASES_TORCH_ENGINE_BUG=${bug}"
    PASS_REGULAR_EXPRESSION "${expected}" FAIL_REGULAR_EXPRESSION "PASS: ")
endfunction()
oases_add_parity_driver_moe_bug_test(moe_no_aux "FAIL fp64 loss: engine fp64 error")
oases_add_parity_driver_moe_bug_test(moe_step0 "FAIL fp64 losses: engine fp64 error")
oases_add_parity_driver_moe_bug_test(moe_train_logits "FAIL fp64 logits: engine fp64 error")

if(EXISTS ${OASES_PARITY_ENGINE_SOURCE})
  add_executable(parity_engine ${OASES_PARITY_ENGINE_SOURCE})
  target_include_directories(parity_engine PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(parity_engine PRIVATE oases_lib oases_warnings)

  # oases_add_torch_parity_test(name [PROCESSORS n] driver-args...)
  function(oases_add_torch_parity_test name)
    cmake_parse_arguments(PARSE_ARGV 1 arg "" "PROCESSORS" "")
    if(NOT arg_PROCESSORS)
      set(arg_PROCESSORS 1)
    endif()
    set(workdir ${CMAKE_CURRENT_BINARY_DIR}/model/${name})
    add_test(NAME model.${name}
      COMMAND ${OASES_PARITY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/model/parity_test.py
        --engine $<TARGET_FILE:parity_engine> --mpirun ${MPIEXEC_EXECUTABLE}
        ${arg_UNPARSED_ARGUMENTS} --workdir ${workdir})
    set_tests_properties(model.${name} PROPERTIES LABELS "model;torch" TIMEOUT 900
      PROCESSORS ${arg_PROCESSORS})
  endfunction()

  oases_add_torch_parity_test(torch_parity_gpt --arch gpt
    --layers 2 --hidden 64 --heads 4 --ffn-hidden 256 --vocab-size 256 --seq-len 32
    --micro-batch 4 --steps 10)
  # Sizes no kernel can round to: vocab not a multiple of 64, seq_len not a power of two,
  # head_dim 16 with 3 heads, an odd micro-batch.
  oases_add_torch_parity_test(torch_parity_gpt_odd_shapes --arch gpt
    --layers 3 --hidden 48 --heads 3 --ffn-hidden 192 --vocab-size 197 --seq-len 37
    --micro-batch 3 --steps 10)

  # LLaMA with as many key/value heads as query heads (plain multi-head attention), in one
  # process and over two ranks (two heads per rank).
  set(oases_llama_args --arch llama
    --layers 2 --hidden 64 --heads 4 --kv-heads 4 --ffn-hidden 176 --vocab-size 256
    --seq-len 32 --micro-batch 4 --steps 10)
  oases_add_torch_parity_test(torch_parity_llama ${oases_llama_args})
  oases_add_torch_parity_test(torch_parity_llama_tp2 PROCESSORS 2 ${oases_llama_args} --tp 2)
  # Grouped-query attention (two query heads per kv head), with a non-default rotary base and
  # norm eps so that an engine ignoring either fails; then the same split over two ranks
  # (one kv head and its two query heads per rank).
  set(oases_llama_gqa_args --arch llama
    --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn-hidden 176 --vocab-size 250
    --seq-len 24 --micro-batch 2 --steps 10 --rope-theta 500 --norm-eps 1e-6)
  oases_add_torch_parity_test(torch_parity_llama_gqa ${oases_llama_gqa_args})
  oases_add_torch_parity_test(torch_parity_llama_gqa_tp2 PROCESSORS 2 ${oases_llama_gqa_args}
    --tp 2)

  # Models initialised from Hugging Face model folders (config.json, sharded weights and their
  # index; the engine reads them as `oases train --init-from DIR` does): logits, gradients and
  # a short trajectory in fp64. LLaMA with grouped-query attention and LLaMA 3's rotary
  # frequency scaling in all three of its bands (head_dim 16, original context 64).
  oases_add_torch_parity_test(torch_parity_llama_hf_folder --hf-folder --precision fp64
    --arch llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn-hidden 96
    --vocab-size 250 --seq-len 24 --micro-batch 2 --steps 3 --rope-theta 500 --norm-eps 1e-6
    --rope-scaling-factor 4 --rope-low-freq-factor 1 --rope-high-freq-factor 4
    --rope-original-max-positions 64)
  oases_add_torch_parity_test(torch_parity_gpt_hf_folder --hf-folder --precision fp64
    --arch gpt --layers 2 --hidden 48 --heads 3 --ffn-hidden 192 --vocab-size 197
    --seq-len 37 --micro-batch 3 --steps 3)
  oases_add_torch_parity_test(torch_parity_bert_hf_folder --hf-folder --precision fp64
    --arch bert --layers 2 --hidden 48 --heads 3 --ffn-hidden 120 --vocab-size 203
    --seq-len 29 --micro-batch 3 --steps 3)

  # BERT with sizes no kernel can round to: vocab not a multiple of 8, seq_len not a power of
  # two, an odd micro-batch; about 30% of the positions carry a target, the rest -1 or -100.
  oases_add_torch_parity_test(torch_parity_bert_odd_shapes --arch bert
    --layers 2 --hidden 48 --heads 3 --ffn-hidden 120 --vocab-size 203 --seq-len 29
    --micro-batch 3 --steps 10)

  # Mixture of experts, every gate of ops/moe.h on GPT and three on LLaMA, 4 experts with
  # decisive routers and capacity factor 1: each run must overflow capacity in the reference's
  # step-0 training forward (--expect-routing; expert-choice: a token no expert takes), and
  # PyTorch fp32 must route as fp64 in every forward. The logits are evaluation mode's.
  # Switch in every layer, experts narrower than the dense FFN, expert dropout.
  oases_add_torch_parity_test(torch_parity_moe_switch_gpt ${oases_moe_gpt} --moe-every 1
    --experts 4 --moe-gate switch --capacity-factor 1.0 --moe-ffn-hidden 40
    --expert-dropout 0.1 --expect-routing overflow)
  # gshard with random routing, groups of 8 tokens (half a sequence), aux and z losses.
  oases_add_torch_parity_test(torch_parity_moe_gshard_gpt ${oases_moe_gshard_gpt})
  # Noisy top-2 with learned noise, groups of two sequences, a larger evaluation capacity.
  oases_add_torch_parity_test(torch_parity_moe_noisy_topk_gpt ${oases_moe_gpt} --moe-every 2
    --experts 4 --moe-gate noisy-topk --moe-top-k 2 --capacity-factor 1.0
    --eval-capacity-factor 2.0 --moe-group-size 32 --moe-aux-loss-coef 0.05
    --moe-z-loss-coef 0.001 --expect-routing overflow)
  # Expert choice: some tokens taken by no expert, some by several.
  oases_add_torch_parity_test(torch_parity_moe_expert_choice_gpt ${oases_moe_gpt} --moe-every 2
    --experts 4 --moe-gate expert-choice --capacity-factor 1.0 --eval-capacity-factor 1.5
    --moe-z-loss-coef 0.001 --expect-routing overflow,shared)
  # LLaMA (grouped-query attention): gshard in every layer with expert dropout; noisy top-2
  # in groups of two sequences with dropout; switch in groups of two sequences.
  oases_add_torch_parity_test(torch_parity_moe_gshard_llama ${oases_moe_llama} --moe-every 1
    --experts 4 --moe-gate gshard --capacity-factor 1.0 --expert-dropout 0.1
    --expect-routing overflow,random-skip)
  oases_add_torch_parity_test(torch_parity_moe_noisy_topk_llama ${oases_moe_noisy_topk_llama})
  oases_add_torch_parity_test(torch_parity_moe_switch_llama ${oases_moe_llama} --moe-every 2
    --experts 4 --moe-gate switch --capacity-factor 1.0 --moe-group-size 32
    --moe-aux-loss-coef 0.02 --expect-routing overflow)
else()
  message(STATUS "oases: ${OASES_PARITY_ENGINE_SOURCE} not written yet; "
    "PyTorch parity tests not registered")
endif()
