#!/bin/bash
# ncu of kda_prepare, main (.pv_base) against prepare_frags.patch at six CTAs an SM (.pv_6), H=96 T=8192
# softplus. Carry .kc_pv.tar.xz, .pv.tar.xz and .pv6.tar.xz (.pv_6: git archive HEAD, the patch applied).
export PYTHONUNBUFFERED=1
tar xJf .kc_pv.tar.xz && tar xJf .pv.tar.xz && tar xJf .pv6.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
M=smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,\
l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,\
l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__throughput.avg.pct_of_peak_sustained_active,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,\
smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_not_selected.ratio,\
smsp__average_warp_latency_issue_stalled_local_memory.ratio,gpu__time_duration.sum
for t in .pv_base .pv_6; do
  echo "== $t"
  (cd $t && PYTHONPATH=. PYKDA_CACHE_DIR=$OLDPWD/.kc_pv timeout 120 /usr/local/cuda/bin/ncu --kernel-name kda_prepare \
    --launch-skip 1 --launch-count 1 --metrics $M --csv python $OLDPWD/docs/studies/prepare_frags/ncu_one.py) \
    > $OUT/ncu_${t#.}.csv 2>&1
  grep '"kda_prepare"' $OUT/ncu_${t#.}.csv | awk -F'","' '{print $(NF-2) " = " $NF}' | tr -d '"'
done
echo "done at ${SECONDS}s"
