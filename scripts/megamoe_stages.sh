# Sourced by scripts/megamoe_round3.sh .. megamoe_round7.sh: a device call's time-bounded
# stages. Needs OUT (logs go to $OUT/logs/<name>.log) and LIMIT (the call's seconds); STAGE_TAIL (default 12) is
# how many lines of each stage's log are echoed.
#   stage NAME SECONDS CMD...   run CMD under `timeout --signal=INT` (then KILL 10 s later), echo rc and the log's tail
#   left                        seconds left of LIMIT
#   minutes EXPR                EXPR seconds as minutes (at least 0.1), for --max-minutes
stage() { local name=$1 secs=$2; shift 2; local t0=$SECONDS; echo "== $name (limit ${secs}s, at ${SECONDS}s)"
  timeout --signal=INT --kill-after=10 "$secs" "$@" >"$OUT/logs/$name.log" 2>&1
  echo "   rc=$? in $((SECONDS - t0))s"; tail -n "${STAGE_TAIL:-12}" "$OUT/logs/$name.log" | cut -c1-300 | sed 's/^/   | /'; }
left() { echo $(( LIMIT - SECONDS )); }
minutes() { python3 -c "print(max(0.1, ($1) / 60))"; }
