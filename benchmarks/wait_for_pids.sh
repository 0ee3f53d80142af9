# Sourced by the device scripts (h200_engine/run_cells.sh, h200_canaries/run.sh): wait until every process listed in
# a pid file has ended, or SECONDS have passed; sets `alive` to how many still run.
wait_for_pids() {  # PIDFILE SECONDS [POLL]
  local deadline=$(( $(date +%s) + ${2:-300} )) pid
  while [ "$(date +%s)" -lt "$deadline" ]; do
    alive=0
    for pid in $(cat "$1" 2>/dev/null); do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done
    [ "$alive" -eq 0 ] && return 0
    sleep "${3:-5}"
  done
}
